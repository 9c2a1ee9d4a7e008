"""Elastic training: a killed worker costs a step, not the job (`Strategy(elastic=True)`).

Options are checked in process in test_elastic_options.py (the agreement and join
requests in test_membership.py); the fits here run as plain TF_CONFIG processes or
under the launcher, three or four workers, one SIGKILLed at a chosen step.
"""

import json

import pytest

from conftest import launch
from elastic_jobs import NO_UCX, WORKER, run_job


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The rejoin tests' job with nobody killed: worker 0's result."""
    codes, texts, whole = run_job(tmp_path_factory.mktemp("elastic"), "whole",
                                   kill_worker=-1, kill_step=-1)
    assert codes == [0, 0, 0], [t[-3000:] for t in texts]
    assert all(r["failures"] == [] for r in whole.values())
    return whole[0]


def _epochs_logged(folder):
    """The epochs of the `epoch_loss` summaries in TensorBoard's event files in `folder`."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return sorted(event.step for path in folder.glob("events.out.tfevents.*")
                  for event in tf.compat.v1.train.summary_iterator(str(path))
                  if any(value.tag == "epoch_loss" for value in event.summary.value))


def _assert_predict_and_evaluate_alike(results):
    """After a replacement joined, `predict` gathers every worker's rows (TF's own
    collectives, made for the first members, would fail on a replaced worker) and
    `evaluate` sums over the members: the same answer on every worker, the model's."""
    results = list(results)
    for r in results:
        assert r["predict_shape"] == [200, 4] and r["predict_error"] < 1e-5, r
    assert len({r["predict_sha"] for r in results}) == 1, results
    assert len({json.dumps(r["evaluate"]) for r in results}) == 1, results


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
@pytest.mark.parametrize("killed", [2, 0])
def test_a_killed_worker_started_again_rejoins_and_all_end_alike(tmp_path, killed,
                                                                 uninterrupted):
    codes, texts, results = run_job(tmp_path, "killed", kill_worker=killed, kill_step=10,
                                     restart=True)
    assert codes[killed] == -9, texts[killed][-2000:]  # SIGKILL
    survivors = [w for w in range(3) if w != killed]
    assert [codes[w] for w in survivors] == [0, 0] and codes[3] == 0, \
        [t[-3000:] for t in texts]
    killed_at = float((tmp_path / "killed" / "killed.txt").read_text())
    for w in survivors:
        r = results[w]
        assert r["pid_start"] == r["pid_end"]
        (failure,) = r["failures"]
        assert failure["dead"] == [killed] and failure["generation"] == 1
        assert failure["time"] - killed_at < 10, (failure, killed_at)  # going on within 10 s
        (join,) = r["joins"]
        assert join["joined"] == [killed] and join["generation"] == 2
    # The chief stays the chief (worker 1 once worker 0 died); the others by index.
    members = [1, 0, 2] if killed == 0 else [0, 1, 2]
    assert all(r["members"] == members for r in results.values()), results
    replacement = results[killed]
    assert replacement["pid_start"] != results[survivors[0]]["pid_start"]
    assert replacement["failures"] == []
    # The replacement ends with the members' weights, optimizer state and step count.
    assert len({r["sha"] for r in results.values()}) == 1, results
    _assert_predict_and_evaluate_alike(results.values())
    assert len({r["optimizer_sha"] for r in results.values()}) == 1
    assert all(r["iterations"] == 4 * 27 for r in results.values())
    leader = texts[survivors[0]]
    assert "died" in leader and "go on" in leader and "joined at step" in leader
    assert f"worker {killed} starts while its job runs: it joins as a replacement" in texts[3]
    assert f"worker {killed} asks worker(s) {survivors} to take it into the running job" in \
        texts[3], texts[3][-3000:]
    assert results[survivors[0]]["loss"][-1] < results[survivors[0]]["loss"][0]
    # The same seed uninterrupted: within 1 point (a global batch of 96 throughout;
    # 2,560 samples, 4 epochs).
    assert replacement["accuracy"] >= uninterrupted["accuracy"] - 0.01, \
        (replacement, uninterrupted)
    if killed == 0:  # worker 1 took over the checkpoints at the death and kept them
        assert "worker 1 is now the chief" in texts[1]
        assert sorted(p.name for p in (tmp_path / "killed").glob("ckpt-*")) == [
            f"ckpt-{e}.weights.h5" for e in range(1, 5)]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
@pytest.mark.parametrize("leaver", [1, 0])
def test_a_worker_sent_sigterm_leaves_and_no_step_is_discarded(tmp_path, leaver,
                                                               uninterrupted):
    """A scheduler's preemption (SIGTERM) of one worker, the chief too: it exits 0 after
    the next step, the others go on at once without discarding a step, train every
    global batch and end alike, and the next chief writes the checkpoints."""
    codes, texts, results = run_job(tmp_path, "leave", kill_worker=leaver, kill_step=10,
                                     extra=(4, "mlp", "sigterm"))
    assert codes == [0, 0, 0], [t[-3000:] for t in texts]
    assert "leaves the job after the next training step" in texts[leaver]
    assert f"worker {leaver} leaves the job after step" in texts[leaver], texts[leaver][-3000:]
    signalled = float((tmp_path / "leave" / "killed.txt").read_text())
    stayers = [w for w in range(3) if w != leaver]
    assert sorted(results) == stayers
    for w in stayers:
        r = results[w]
        assert r["failures"] == [] and r["joins"] == [], r
        (left,) = r["leaves"]
        assert left["left"] == [leaver] and left["members"] == stayers
        assert left["step"] in (11, 12)  # after the step that carried the request
        assert left["time"] - signalled < 10, (left, signalled)
        assert r["iterations"] == 4 * 27  # every step ran: none discarded
        assert r["accuracy"] >= uninterrupted["accuracy"] - 0.01, (r, uninterrupted)
    assert len({results[w]["sha"] for w in stayers}) == 1
    assert len({results[w]["optimizer_sha"] for w in stayers}) == 1
    assert "no step discarded" in texts[stayers[0]]
    assert sorted(p.name for p in (tmp_path / "leave").glob("ckpt-*")) == [
        f"ckpt-{e}.weights.h5" for e in range(1, 5)]
    if leaver == 0:
        assert "worker 1 is now the chief" in texts[1]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
@pytest.mark.parametrize("kill_step", [10, 107], ids=["epoch1", "last_step"])
def test_the_chiefs_death_is_survived_and_the_next_chief_checkpoints(tmp_path, kill_step):
    # 4 epochs of 27 steps: step 10 is in epoch 1, before the first checkpoint; step
    # 107 is the fit's last.
    codes, texts, results = run_job(tmp_path, "chief", kill_worker=0, kill_step=kill_step)
    assert codes[0] == -9 and codes[1:] == [0, 0], [t[-3000:] for t in texts]
    second, third = results[1], results[2]
    assert second["sha"] == third["sha"] and second["members"] == third["members"] == [1, 2]
    assert [f["dead"] for f in second["failures"]] == [[0]]
    assert len(second["loss"]) == 4, second["loss"]
    killed = float((tmp_path / "chief" / "killed.txt").read_text())
    assert second["failures"][0]["time"] - killed < 10
    assert "worker 1 is now the chief" in texts[1], texts[1][-3000:]
    # Plain processes without TFDIST_ELASTIC=1: told that a replacement could not rejoin.
    assert "a worker started again cannot rejoin" in texts[1]
    # Worker 1 wrote every checkpoint after worker 0's death (at step 10: all of them).
    assert sorted(p.name for p in (tmp_path / "chief").glob("ckpt-*")) == [
        f"ckpt-{e}.weights.h5" for e in range(1, 5)]
    # The user's CSV log holds every epoch once: worker 0's up to its death, worker 1's
    # after it. TensorBoard's events likewise, but for what the SIGKILLed chief had not
    # flushed (its writer's queue).
    rows = (tmp_path / "chief" / "training.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,") and [r.split(",")[0] for r in rows[1:]] == \
        ["0", "1", "2", "3"], rows
    logged = _epochs_logged(tmp_path / "chief" / "logs" / "train")
    assert len(set(logged)) == len(logged) and set(logged) >= (
        {0, 1, 2, 3} if kill_step == 10 else {3}), logged


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_batch_norm_statistics_are_averaged_after_a_replacement_joined(tmp_path):
    # Worker 2 dies two steps before the first epoch's end (27 steps), which the two
    # survivors reach before its replacement joins: they average the moving statistics
    # as two. The function that averages, traced for them, must not run on their
    # destroyed communicators at the next epoch's end, once the replacement joined.
    codes, texts, results = run_job(tmp_path, "bn", kill_worker=2, kill_step=25,
                                     extra=("3", "mlp-bn"), restart=True)
    assert codes[:2] == [0, 0] and codes[3] == 0, [t[-3000:] for t in texts]
    assert [j["joined"] for j in results[0]["joins"]] == [[2]], results[0]
    assert len({r["sha"] for r in results.values()}) == 1, results  # the statistics too
    _assert_predict_and_evaluate_alike(results.values())


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_death_during_validation_is_survived(tmp_path):
    codes, texts, results = run_job(tmp_path, "validation", kill_worker=2, kill_step=5,
                                     extra=(4, "mlp", "test"))
    assert codes[2] == -9 and codes[:2] == [0, 0], [t[-3000:] for t in texts]
    first, second = results[0], results[1]
    assert first["sha"] == second["sha"] and first["members"] == [0, 1]
    (failure,) = first["failures"]
    assert failure["dead"] == [2]
    assert first["loss"][-1] < first["loss"][0]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_death_during_the_recovery_makes_the_survivors_agree_again(tmp_path):
    # Worker 3 dies at step 10; worker 0, the survivors' leader, dies once it has read
    # their reports: workers 1 and 2 lose their meeting place and agree again.
    codes, texts, results = run_job(tmp_path, "twice", kill_worker=3, kill_step=10,
                                     workers=4, extra=(4, "mlp", "recovery"))
    assert codes[0] == -9 and codes[3] == -9 and codes[1:3] == [0, 0], \
        [t[-3000:] for t in texts]
    second, third = results[1], results[2]
    assert second["sha"] == third["sha"] and second["members"] == third["members"] == [1, 2]
    (failure,) = second["failures"]
    assert failure["dead"] == [0, 3] and failure["generation"] == 2, failure
    killed = float((tmp_path / "twice" / "killed.txt").read_text())
    assert failure["time"] - killed < 10
    assert "another death during the recovery" in texts[1], texts[1][-3000:]
    assert "worker 1 is now the chief" in texts[1]
    assert second["iterations"] == third["iterations"] == 4 * 27
    assert second["loss"][-1] < second["loss"][0]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_death_before_the_wire_up_of_new_communicators_is_survived_in_seconds(tmp_path):
    # Worker 2 dies at step 10; worker 1 dies once the survivors agreed, before it
    # publishes its address for their new communicators. Worker 0 gives up waiting for
    # it when the watcher finds it dead (it used to wait the rendezvous' 300 s).
    codes, texts, results = run_job(tmp_path, "wire-up", kill_worker=2, kill_step=10,
                                     extra=(2, "mlp", "wire-up"))
    assert codes == [0, -9, -9], [t[-3000:] for t in texts]
    first = results[0]
    assert [f["dead"] for f in first["failures"]] == [[2], [1]], first["failures"]
    assert first["members"] == [0] and first["iterations"] == 2 * 27
    assert first["failures"][1]["time"] - first["failures"][0]["time"] < 30
    # Whichever notices first: the members' store (its check of the deaths reported) or
    # the wire-up's own wait (stopped by the abort of the collectives).
    assert ("died while the members wired up generation 1's communicators" in texts[0]
            or "Stopped waiting for 'tfdist_ext/ucx/main-2x1-t30-g1/address/1'" in texts[0]), \
        texts[0][-3000:]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.parametrize("killed", [0, 1])
def test_a_death_while_keras_builds_the_model_is_survived(tmp_path, killed):
    # A worker dies while Keras builds the unbuilt model as fit begins, the others in TF's
    # broadcast of the initial weights: they used to fail at the chief's death and wait
    # for ever at another's. Each worker seeded its own initial weights: equal weights at
    # the end mean that the survivors' first step took the chief's.
    codes, texts, results = run_job(tmp_path, "build", kill_worker=killed, kill_step=0,
                                     extra=(2, "mlp-unbuilt", "build"))
    survivors = [w for w in range(3) if w != killed]
    assert codes[killed] == -9 and [codes[w] for w in survivors] == [0, 0], \
        [t[-3000:] for t in texts]
    first, second = (results[w] for w in survivors)
    assert first["sha"] == second["sha"] and first["optimizer_sha"] == second["optimizer_sha"]
    assert first["members"] == survivors
    assert [f["dead"] for f in first["failures"]] == [[killed]], first["failures"]
    killed_at = float((tmp_path / "build" / "killed.txt").read_text())
    assert first["failures"][0]["time"] - killed_at < 10
    assert ("worker 1 is now the chief" in texts[1]) == (killed == 0)
    assert first["iterations"] == second["iterations"] == 2 * 27  # no step lost
    assert first["loss"][-1] < first["loss"][0]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_a_death_while_keras_reads_its_metrics_at_an_epoch_end_is_survived(tmp_path):
    # Worker 2 dies after the last batch of epoch 1 (27 batches): the others are in
    # Keras' epoch-end reading of its metrics, an all-reduce outside the step functions.
    codes, texts, results = run_job(tmp_path, "epoch_end", kill_worker=2, kill_step=26,
                                     extra=(4, "mlp", "epoch_end"))
    assert codes[2] == -9 and codes[:2] == [0, 0], [t[-3000:] for t in texts]
    first, second = results[0], results[1]
    assert first["sha"] == second["sha"] and first["members"] == [0, 1]
    assert [f["dead"] for f in first["failures"]] == [[2]]
    assert first["iterations"] == second["iterations"] == 4 * 27
    assert len(first["loss"]) == 4 and first["loss"][-1] < first["loss"][0]


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
@pytest.mark.parametrize("killed, model", [(2, "mlp"), (0, "embedding"), (1, "mlp-arrays")])
def test_the_launcher_starts_a_dead_worker_again(tmp_path, killed, model, uninterrupted):
    # The Embedding layer's gradients (IndexedSlices) cross the membership changes too;
    # worker 0 (whose process ran TF's coordination service) rejoins after the new chief. Fed
    # numpy arrays, Keras reads through TF's distributed iterator, which agrees with the
    # other workers on every batch: a replacement skipping the members' batches must not.
    # The first case's workers and replacement are executed, the launcher's default, where
    # tests/run forks the others from a preload template (TFDIST_PRELOAD).
    env = {"WAIT_REJOIN": "1", **({"TFDIST_PRELOAD": ""} if model == "mlp" else {})}
    code, out, _ = launch(3, [WORKER, tmp_path, killed, 10, 4, model], options=["--elastic"],
                          timeout=240, extra_env=env)
    assert code == 0, out[-4000:]
    assert f"worker {killed}" in out and "the others go on without it (--elastic)" in out, \
        out[-4000:]
    assert f"worker {killed} starts again in 2 s and rejoins (replacement 1 of 9" in out, \
        out[-4000:]
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(3)]
    survivors = [w for w in range(3) if w != killed]
    members = [1, 0, 2] if killed == 0 else [0, 1, 2]  # the chief, then by index
    assert len({r["sha"] for r in results}) == 1
    _assert_predict_and_evaluate_alike(results)
    assert all(r["members"] == members for r in results)
    killed_at = float((tmp_path / "killed.txt").read_text())
    for w in survivors:
        assert results[w]["pid_start"] == results[w]["pid_end"]
        (failure,) = results[w]["failures"]
        assert failure["dead"] == [killed] and failure["time"] - killed_at < 10
        assert [j["joined"] for j in results[w]["joins"]] == [[killed]]
    assert results[killed]["pid_start"] != results[survivors[0]]["pid_start"]
    # Back among three, every survivor is at the rank it started at (ranks follow the
    # worker indices; worker 1, the chief after worker 0's death, too: it used to move to
    # rank 0 and trace again) and runs the train function it traced at the start, its
    # collectives on the new communicators.
    for w in survivors:
        assert results[w]["reused_functions"] == 1, (w, results[w])
    # The replacement traced its train function for the members it expected before it
    # asked to join, and ran that trace: the members did not wait for it to trace.
    assert results[killed]["rehearsed"] == members, results[killed]
    assert results[killed]["train_traces"] == 1, results[killed]
    assert results[1]["loss"][-1] < results[1]["loss"][0]
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [
        f"ckpt-{e}.weights.h5" for e in range(1, 5)]
    if model == "mlp":  # the same seed uninterrupted: within 1 point
        assert results[killed]["accuracy"] >= uninterrupted["accuracy"] - 0.01


@NO_UCX
@pytest.mark.multiworker
@pytest.mark.alone
def test_replacements_that_traced_for_other_members_trace_again_and_all_end_alike(tmp_path):
    # Workers 1 and 2 die at the same step and the launcher starts both again; each finds
    # only worker 0 running and traces its step for [0, itself] before it asks. Admitted
    # together, or one after the other, at least one joins other members than it traced
    # for: a function traced for 2 ranks would pair wrongly with 3, so it traces again,
    # before it asks if it sees the other admitted first (`Recovery.look_again`), else at
    # its admission.
    code, out, _ = launch(3, [WORKER, tmp_path, 1, 10, 3, "mlp", "two"], options=["--elastic"],
                          timeout=240, extra_env={"WAIT_REJOIN": "1"})
    assert code == 0, out[-4000:]
    assert "worker 1 starts again" in out and "worker 2 starts again" in out, out[-4000:]
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(3)]
    assert len({r["sha"] for r in results}) == 1
    assert all(sorted(r["members"]) == [0, 1, 2] for r in results)
    assert all(results[w]["rehearsed"] in ([0, w], [0, 1, 2]) for w in (1, 2)), results
    assert "traced its step for members [0, " in out, out[-4000:]
    assert "it traces again" in out or "it rehearses again" in out, out[-4000:]
    assert all(results[w]["train_traces"] == 1 for w in (1, 2)), results


@pytest.mark.multiworker
@pytest.mark.alone
def test_a_replacement_with_backup_and_restore_takes_the_members_state_not_the_backup(
        tmp_path):
    # Worker 1 dies in the second epoch, after the chief's BackupAndRestore saved epoch 1.
    # Its replacement runs the same script, so its BackupAndRestore finds that backup at the
    # start of fit: it must still train on from the members' weights, epoch and batch. The
    # model has no Input: Keras builds it at the start of fit, before the replacement joins.
    code, out, _ = launch(3, [WORKER, tmp_path, 1, 40, 4, "mlp-unbuilt", "backup"],
                          options=["--elastic"], timeout=240, extra_env={"WAIT_REJOIN": "1"})
    assert code == 0, out[-4000:]
    assert "worker 1 starts again" in out, out[-4000:]
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(3)]
    assert [r["members"] for r in results] == [[0, 1, 2]] * 3, results
    assert len({r["sha"] for r in results}) == 1, [r["sha"] for r in results]
    assert len({r["optimizer_sha"] for r in results}) == 1
    assert len({r["iterations"] for r in results}) == 1, [r["iterations"] for r in results]
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [
        f"ckpt-{e}.weights.h5" for e in range(1, 5)]


@pytest.mark.multiworker
@pytest.mark.alone
def test_a_replacement_takes_the_members_early_stopping_and_learning_rate_counters(tmp_path):
    # Worker 1 dies in the second epoch; the members' ReduceLROnPlateau and EarlyStopping
    # (restore_best_weights) then remember epoch 1's loss and weights. A replacement that
    # started them afresh would lower the rate and stop an epoch later than the members,
    # train on alone and restore its own first epoch's weights.
    code, out, _ = launch(3, [WORKER, tmp_path, 1, 40, 4, "mlp", "earlystop"],
                          options=["--elastic"], timeout=240, extra_env={"WAIT_REJOIN": "1"})
    assert code == 0, out[-4000:]
    assert "worker 1 starts again" in out, out[-4000:]
    results = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(3)]
    assert [r["members"] for r in results] == [[0, 1, 2]] * 3, results
    (admission,) = results[0]["joins"]
    assert 27 < admission["step"] < 54, admission  # in epoch 2 (27 steps an epoch)
    assert len(results[0]["loss"]) == 3, results[0]["loss"]  # stopped after epoch 3
    assert len({r["iterations"] for r in results}) == 1, [r["iterations"] for r in results]
    assert len({r["sha"] for r in results}) == 1, [r["sha"] for r in results]
    assert len({r["optimizer_sha"] for r in results}) == 1  # the learning rate included
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [
        f"ckpt-{e}.weights.h5" for e in range(1, 4)]
