"""Worker program for tests/elastic: a fit that survives a worker killed mid-way.

    python elastic_fit.py OUT_DIR KILL_WORKER KILL_STEP [EPOCHS [MODEL [PHASE]]]

Every worker trains the same MLP (MODEL "mlp", the default; "mlp-unbuilt": the same
without an Input, built by Keras when fit begins; "mlp-bn": with a BatchNormalization
layer, whose moving statistics the workers average at each epoch's end; "embedding": an
Embedding layer, whose gradients are IndexedSlices, and a Dense layer on its 3-D output,
whose kernel's gradient has an open static shape, on integer features) on
its part of a fixed synthetic dataset with `Strategy(elastic=True)` and
momentum SGD (PHASE "test": with validation data, KILL_STEP counting validation
steps; "epoch_end": the kill comes after batch KILL_STEP of the first epoch
instead of before step KILL_STEP, so the last batch of the epoch leaves the
others in Keras' reading of its metrics; "recovery": as "train", and worker 0,
the survivors' leader, SIGKILLs itself once it has read their reports, before
it announces the membership, so that they must agree again; "admission": as "train",
and worker 1 SIGKILLs itself once it has admitted the replacement of the killed
worker and wired up with it, before the state broadcast; "admission-leader": as "train", and
worker 0, the members' leader whose store the new communicators wire up in, SIGKILLs itself
once it has admitted the replacement, before that wire-up (OUT_DIR/leader_killed.txt: when);
"rehearsal": as "train", and worker 1 SIGKILLs itself while the replacement of the killed
worker runs its rehearsed step, before it asks to join (OUT_DIR/member_killed.txt: when);
"wire-up": as "train", and worker
1 SIGKILLs itself once the survivors agreed on the new membership, before it publishes
its address for their new communicators; "sigterm": as "train", but worker
KILL_WORKER is sent SIGTERM instead, as a scheduler's preemption, and leaves;
"sigstop": as "train", but worker KILL_WORKER stops itself with SIGSTOP, for the
test to continue it; "sigterm-join": as "train", and worker 0 sends itself SIGTERM before
the step that carries the join request of worker KILL_WORKER's replacement
(OUT_DIR/sigterm.txt: when), so that step carries both; "two": as "train", and worker KILL_WORKER + 1 (mod 3) is
killed at the same step; "backup": as "train", and every worker has the user's
`BackupAndRestore(OUT_DIR/backup)`, so that a replacement finds the backup of an
earlier epoch at its start; "earlystop": as "train", and every worker has
`ReduceLROnPlateau` and `EarlyStopping(restore_best_weights=True)` that lower the
learning rate after epochs 2 and 3 and stop after epoch 3 (no epoch improves on the
first by 10), so that a replacement joining in epoch 2 must take their counters; "build": MODEL "mlp-unbuilt", each worker seeding its own initial weights
(1 + its index), and worker KILL_WORKER SIGKILLs itself while Keras builds the model as
fit begins, when the others are in TF's broadcast of the initial weights (KILL_STEP is
ignored); "straggler": `Elastic(straggler_factor=3, straggler_steps=10)`,
and worker KILL_WORKER sleeps 50 ms before each training step from KILL_STEP on; "netcut": under `tfdist-run --link-bandwidth`, worker
KILL_WORKER takes its namespace's link down instead, and stays cut off);
worker KILL_WORKER SIGKILLs itself at training step KILL_STEP (-1: nobody dies). Each worker that ends
writes OUT_DIR/w{index}.json (the killed one OUT_DIR/killed.txt, the time it
died): its PID at start and end, a hash of its
weights, its `predict` and `evaluate` of 200 test rows after the fit, the strategy's
recorded failures and members, the loss history and the test accuracy; the chief
(worker 0, or the lowest survivor after its death) writes
OUT_DIR/ckpt-{epoch}.weights.h5 after every epoch, OUT_DIR/training.csv (CSVLogger)
and OUT_DIR/logs (TensorBoard). With WAIT_REJOIN=1 in
the environment, the members sleep 1 s after each step while the job is
short of a worker (at most 120 s, or WAIT_REJOIN_SECONDS), leaving a replacement
time to start and join.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist_ext
from tfdist_ext.keras import elastic_steps, members_fit


def data(seed=0, n=6656, d=20, classes=4):
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=0.35, size=(classes, d))
    y = rng.integers(0, classes, size=n)
    x = (centers[y] + rng.normal(size=(n, d))).astype("float32")
    return x[:2560], y[:2560], x[2560:], y[2560:]


class Stamp(keras.callbacks.Callback):
    """Writes OUT_DIR/killed.txt (the time) where and when KillAt will kill."""

    def __init__(self, out_dir, worker, step, phase):
        super().__init__()
        self.path = os.path.join(out_dir, "killed.txt")
        self.worker, self.step, self.steps, self.phase = worker, step, 0, phase
        self.me = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

    def _begin(self, phase):
        if phase == self.phase:
            if (self.me == self.worker and self.steps == self.step
                    and not self.model.distribute_strategy.elastic.replacement):
                with open(self.path, "w", encoding="utf-8") as f:
                    f.write(repr(time.time()))
            self.steps += 1

    def on_train_batch_begin(self, batch, logs=None):
        self._begin("train")

    def on_test_batch_begin(self, batch, logs=None):
        self._begin("test")


class CutOff(keras.callbacks.Callback):
    """Takes this worker's network namespace's link down at training step `step`."""

    def __init__(self, out_dir, step):
        super().__init__()
        self.path, self.step, self.steps = os.path.join(out_dir, "killed.txt"), step, 0

    def on_train_batch_begin(self, batch, logs=None):
        if self.steps == self.step:
            links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                                   text=True, check=True).stdout.splitlines()
            device = next(line.split(":")[1].strip().split("@")[0] for line in links
                          if line.split(":")[1].strip().startswith("tfd"))
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(repr(time.time()))
            subprocess.run(["ip", "link", "set", device, "down"], check=True)
        self.steps += 1


class WaitForRejoin(keras.callbacks.Callback):
    """Slows the members' steps while a worker is missing (a replacement is starting)."""

    def __init__(self, strategy, workers):
        super().__init__()
        self.strategy, self.workers, self.waited = strategy, workers, 0.0

    def on_train_batch_end(self, batch, logs=None):
        limit = float(os.environ.get("WAIT_REJOIN_SECONDS", "120"))
        if len(self.strategy.elastic.members) < self.workers and self.waited < limit:
            time.sleep(1.0)
            self.waited += 1.0


def build(name):
    if name == "embedding":
        return keras.Sequential([keras.Input((20,), dtype="int32"),
                                 keras.layers.Embedding(16, 4), keras.layers.Dense(4),
                                 keras.layers.Flatten(), keras.layers.Dense(4)])
    if name == "mlp-bn":  # BatchNorm: its moving statistics are averaged at every epoch end
        return keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                                 keras.layers.BatchNormalization(), keras.layers.Dense(4)])
    if name == "mlp-unbuilt":  # no Input: Keras builds it at the start of fit
        return keras.Sequential([keras.layers.Dense(64, activation="relu"),
                                 keras.layers.Dense(4)])
    return keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(4)])


def main(out_dir, kill_worker, kill_step, epochs="4", model_name="mlp", phase="train"):
    started = time.time()
    pid = os.getpid()
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tfdist_ext.Strategy(elastic={"straggler_factor": 3, "straggler_steps": 10}
                                   if phase == "straggler" else True)
    x, y, x_test, y_test = data()
    if model_name == "embedding":  # features quantized into 16 tokens
        x, x_test = (np.clip(np.round(v * 2) + 8, 0, 15).astype("int32") for v in (x, x_test))
    keras.utils.set_random_seed(1 + (index if phase == "build" else 0))
    with strategy.scope():
        model = build(model_name.replace("-arrays", ""))
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    if phase == "build" and index == int(kill_worker) and not strategy.elastic.replacement:
        def build_and_die(*args, **kwargs):  # pylint: disable=unused-argument
            with open(os.path.join(out_dir, "killed.txt"), "w", encoding="utf-8") as f:
                f.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

        model.layers[-1].build = build_and_die
    train = tf.data.Dataset.from_tensor_slices((x, y)).batch(96)
    if phase == "recovery" and index == 0:
        agree = tfdist_ext.elastic.membership.agree

        def agree_and_die(kv_set, kv_get, prefix, me, alive, *args, **kwargs):
            def get(key, seconds):  # the leader dies once it has every survivor's report
                value = kv_get(key, seconds)
                if key.endswith(f"/report/{alive[-1]}"):
                    os.kill(os.getpid(), signal.SIGKILL)
                return value

            return agree(kv_set, get, prefix, me, alive, *args, **kwargs)

        tfdist_ext.elastic.membership.agree = agree_and_die
    if phase == "admission" and index == 1 and not strategy.elastic.replacement:
        broadcast = strategy.elastic.broadcast_state

        def wire_up_and_die(variables):  # the admission's state broadcast, not a recovery's
            if strategy.elastic.joins:
                strategy.extended.cross_device_ops.engines.main()  # the new members'
                os.kill(os.getpid(), signal.SIGKILL)
            return broadcast(variables)

        strategy.elastic.broadcast_state = wire_up_and_die
    if phase == "admission-leader" and index == 0 and not strategy.elastic.replacement:
        def die_before_the_wire_up(variables):
            if not strategy.elastic.joins:
                return broadcast(variables)
            with open(os.path.join(out_dir, "leader_killed.txt"), "w", encoding="utf-8") as f:
                f.write(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
            return None

        broadcast = strategy.elastic.broadcast_state
        strategy.elastic.broadcast_state = die_before_the_wire_up
    if phase == "wire-up" and index == 1:
        reconfigure = strategy.reconfigure_workers

        def reconfigure_and_die(rank, workers, generation, kv, **chief):
            reconfigure(rank, workers, generation, kv, **chief)  # the wire-up is at first use
            os.kill(os.getpid(), signal.SIGKILL)

        strategy.reconfigure_workers = reconfigure_and_die
    if phase == "rehearsal":
        cue, killed = (os.path.join(out_dir, name)
                       for name in ("rehearsing.txt", "member_killed.txt"))
        if strategy.elastic.replacement and index == int(kill_worker) \
                and not os.path.exists(cue):
            rehearse = members_fit.run_rehearsal

            def rehearse_as_a_member_dies(*args):
                with open(cue, "w", encoding="utf-8") as f:
                    f.write(str(time.time()))
                while not os.path.exists(killed):
                    time.sleep(0.05)
                time.sleep(3)  # its watcher sees the death (1 s) with the rehearsal's
                return rehearse(*args)  # communicators made

            members_fit.run_rehearsal = rehearse_as_a_member_dies
    kill_phase = "train" if phase in ("recovery", "admission", "admission-leader", "wire-up",
                                      "sigterm", "sigstop", "backup", "earlystop",
                                      "two", "rehearsal", "sigterm-join") else phase
    sent = {"sigterm": signal.SIGTERM, "sigstop": signal.SIGSTOP}.get(phase, signal.SIGKILL)
    kill = ([Stamp(out_dir, int(kill_worker), int(kill_step), kill_phase),
             tfdist_ext.elastic.KillAt(int(kill_worker), int(kill_step), signal=sent,
                                       phase=kill_phase)]
            if int(kill_step) >= 0 and phase not in ("epoch_end", "netcut", "straggler",
                                                      "build")
            else [])
    if phase == "two":
        kill.append(tfdist_ext.elastic.KillAt((int(kill_worker) + 1) % 3, int(kill_step)))
    if phase == "rehearsal" and index == 1 and not strategy.elastic.replacement:
        def die_once_rehearsing(batch, logs):
            if os.path.exists(cue):
                with open(killed, "w", encoding="utf-8") as f:
                    f.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)

        kill.append(keras.callbacks.LambdaCallback(on_train_batch_begin=die_once_rehearsing))
    if phase == "sigterm-join" and index == 0 and not strategy.elastic.replacement:
        signalled = os.path.join(out_dir, "sigterm.txt")

        def stop_with_the_join(batch, logs):  # the leader's join flag rides this step
            if float(strategy.elastic.join_flag.numpy()) > 0 and not os.path.exists(signalled):
                with open(signalled, "w", encoding="utf-8") as f:
                    f.write(str(time.time()))
                os.kill(os.getpid(), signal.SIGTERM)

        kill.append(keras.callbacks.LambdaCallback(on_train_batch_begin=stop_with_the_join))
    if phase == "straggler" and index == int(kill_worker):
        kill.append(keras.callbacks.LambdaCallback(  # slow from step KILL_STEP on
            on_train_batch_begin=lambda batch, logs: time.sleep(0.05)
            if batch >= int(kill_step) else None))
    if phase == "netcut":
        kill = [CutOff(out_dir, int(kill_step))] if index == int(kill_worker) else []
    if phase == "epoch_end" and index == int(kill_worker):
        kill.append(keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: os.kill(os.getpid(), signal.SIGKILL)
            if batch == int(kill_step) else None))
    if os.environ.get("WAIT_REJOIN") == "1":
        kill.append(WaitForRejoin(strategy, strategy.num_workers))
    validation = (x_test[:1024], y_test[:1024]) if phase == "test" else None
    checkpoint = keras.callbacks.ModelCheckpoint(
        os.path.join(out_dir, "ckpt-{epoch}.weights.h5"), save_weights_only=True)
    # MODEL "mlp-arrays": the MLP fed numpy arrays (Keras shuffles them each epoch).
    inputs = dict(x=x, y=y, batch_size=96, shuffle=True) if model_name.endswith("-arrays") \
        else dict(x=train)
    if phase == "earlystop":  # no epoch after the first improves by 10: the members halve
        # the learning rate after epochs 2 and 3, stop after epoch 3 and restore epoch 1's
        # weights
        checkpoint = [checkpoint,
                      keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5,
                                                        patience=1, min_delta=10.0),
                      keras.callbacks.EarlyStopping(monitor="loss", patience=2, min_delta=10.0,
                                                    restore_best_weights=True)]
    elif phase == "backup":
        checkpoint = [checkpoint, keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup"))]
    else:
        checkpoint = [checkpoint]
    checkpoint += [keras.callbacks.CSVLogger(os.path.join(out_dir, "training.csv")),
                   keras.callbacks.TensorBoard(os.path.join(out_dir, "logs"), write_graph=False,
                                               profile_batch=0)]
    history = model.fit(**inputs, epochs=int(epochs), verbose=0, callbacks=kill + checkpoint,
                        validation_data=validation, validation_batch_size=96)
    outputs = np.asarray(model(x_test))
    accuracy = float(np.mean(np.argmax(outputs, -1) == y_test))
    traced = {"reused_functions": elastic_steps.reused_functions(model),
              "rehearsed": elastic_steps.rehearsed_for(model),
              "train_traces": tfdist_ext._compat.keras_iterator_function(  # pylint: disable=protected-access
                  model.train_function).experimental_get_tracing_count()}
    # After the fit, on the members it ended with: the gather of predict's outputs and
    # evaluate's sums (200 rows: the workers' last batches are partial and unequal).
    predicted = model.predict(x_test[:200], batch_size=64, verbose=0)
    evaluated = model.evaluate(x_test[:200], y_test[:200], batch_size=64, verbose=0)
    weights = b"".join(np.asarray(w).tobytes() for w in model.get_weights())
    optimizer = b"".join(np.asarray(v).tobytes() for v in model.optimizer.variables)
    recovery = strategy.elastic
    with open(os.path.join(out_dir, f"w{index}.json"), "w", encoding="utf-8") as f:
        json.dump({"pid_start": pid, "pid_end": os.getpid(), **traced,
                   "sha": hashlib.sha256(weights).hexdigest(),
                   "optimizer_sha": hashlib.sha256(optimizer).hexdigest(),
                   "failures": recovery.failures, "members": list(recovery.members),
                   "joins": recovery.joins, "leaves": recovery.leaves,
                   "loss": history.history["loss"], "accuracy": accuracy,
                   "predict_shape": list(predicted.shape),
                   "predict_error": float(np.max(np.abs(predicted - outputs[:200]))),
                   "predict_sha": hashlib.sha256(predicted.tobytes()).hexdigest(),
                   "evaluate": evaluated,
                   "iterations": int(model.optimizer.iterations.numpy()),
                   "seconds": time.time() - started}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
