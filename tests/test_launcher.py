"""tfdist-run with plain Python workers (no TensorFlow, so each case takes ~1 s).

The supervision tests run twice: workers executed, and workers forked from a preload
template (`--preload colorsys`, a module no fresh Python imports: the workers say
whether they found it imported).
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from tfdist_ext.launch import cli, free_ports, tf_configs

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Each worker learns its index from TF_CONFIG, records its pid (and a child's).
WORKER = """
import json, os, subprocess, sys, time
preloaded = "colorsys" in sys.modules
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(sys.argv[1], f"pids{index}"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
print(f"hello from {index}, preloaded {preloaded}", flush=True)
mode = sys.argv[2]
if mode == "fail" and index == 1:
    time.sleep(0.5)
    sys.exit(3)
if mode == "fail_once" and index == 1 and os.environ["TFDIST_RESTART"] == "0":
    sys.exit(3)
if mode == "late" and index == 1:  # an elastic replacement the job could not take in
    time.sleep(0.5)
    sys.exit(76)
if mode == "late":
    child.kill()
    time.sleep(2.0)
    sys.exit(0)
if mode == "all_fail":  # one after another, each while the others still run
    time.sleep(0.5 + 0.3 * index)
    sys.exit(3)
joined = os.environ.get("TFDIST_MEMBER_FILE")  # set for a replacement (tfdist-run --elastic)
if mode in ("members_die", "replacement_joins") and not joined:
    child.kill()
    time.sleep((0.3, 2.6, 2.9)[index])  # worker 0's replacement starts before 2 dies
    sys.exit(3)
if mode == "replacement_joins":  # it joins the job at once, then finishes it
    open(joined, "w").close()
    child.kill()
    time.sleep(1.5)
    sys.exit(0)
if mode in ("ok", "fail_once"):
    child.kill()
    sys.exit(0)
time.sleep(120)
"""


@pytest.fixture(params=["executed", "forked"])
def how(request):
    """The launcher options that start workers one way or the other."""
    return ("--preload", "colorsys") if request.param == "forked" else ("--preload", "")


def _start(tmp_path, num_workers, mode, how, *options):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return subprocess.Popen(
        [sys.executable, "-m", "tfdist_ext.launch", "-np", str(num_workers), *how, *options,
         sys.executable, str(script), str(tmp_path), mode],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _pids(tmp_path, num_workers, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [tmp_path / f"pids{i}" for i in range(num_workers)]
        if all(f.exists() and f.read_text() for f in files):
            return [int(p) for f in files for p in f.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("workers did not start")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:  # zombies are gone too
        return f.read().split()[2] != "Z"


def test_success_prefixes_output_and_returns_zero(tmp_path, how):
    launcher = _start(tmp_path, 3, "ok", how)
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, out
    for i in range(3):
        assert f"[{i}] hello from {i}, preloaded {'colorsys' in how}" in out


def test_failing_worker_stops_the_others_and_is_named(tmp_path, how):
    launcher = _start(tmp_path, 3, "fail", how)
    pids = _pids(tmp_path, 3)
    start = time.monotonic()
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == 3, out
    assert time.monotonic() - start < 10
    assert "worker 1 (pid" in out and "exited with code 3; stopping workers [0, 2]" in out
    time.sleep(0.2)
    assert [p for p in pids if _alive(p)] == []  # workers and their children


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_reaches_every_worker(tmp_path, sig, code, how):
    launcher = _start(tmp_path, 2, "hang", how, "--grace", "1")
    pids = _pids(tmp_path, 2)
    launcher.send_signal(sig)
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == code, out
    assert f"received {sig.name}; stopping all 2 workers" in out
    time.sleep(0.2)
    assert [p for p in pids if _alive(p)] == []


def test_timeout_stops_the_job(tmp_path, how):
    launcher = _start(tmp_path, 2, "hang", how, "--timeout", "2", "--grace", "1")
    pids = _pids(tmp_path, 2)
    out, _ = launcher.communicate(timeout=30)
    assert launcher.returncode == 124, out
    assert "timeout of 2 s reached" in out
    assert [p for p in pids if _alive(p)] == []


@pytest.mark.parametrize("argv, message", [
    (["-np", "0", "true"], "argument -np/--num-workers: must be a number >= 1; received '0'"),
    (["-np", "two", "true"], "received 'two'"),
    (["-np", "2"], "no command given"),
    (["-np", "2", "--timeout", "-1", "true"], "argument --timeout: must be a number >= 0.001"),
    (["true"], "the following arguments are required: -np/--num-workers (or -H localhost:N)"),
    (["-H", "gpu-node-7:4", "true"], "argument -H/--hosts: host 'gpu-node-7' is not this "
                                     "machine: tfdist-run starts workers here only"),
    (["-H", "localhost:0", "true"], "'localhost:0' is not HOST:SLOTS with SLOTS >= 1"),
    (["-np", "3", "-H", "localhost:2", "true"], "argument -np: 3 workers do not fit the 2 "
                                                "slots of -H"),
    (["-np", "2", "-H", "localhost", "true"], "2 workers do not fit the 1 slots of -H"),
    (["-np", "2", "--preload", "tensorflow,2keras", "true"],
     "argument --preload: --preload / TFDIST_PRELOAD: '2keras' is not a module name; give "
     "comma-separated module names, e.g. 'tensorflow,keras'."),
    (["-np", "2", "--preload", "keras,tfdist_ext", "true"],
     "argument --preload: --preload / TFDIST_PRELOAD: 'tfdist_ext' cannot be preloaded: each "
     "worker imports tfdist_ext itself, for its own TF_CONFIG; preload 'tensorflow,keras'."),
])
def test_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_worker_options_are_left_to_the_worker(capsys):
    # Prefixes of the launcher's own options (--link, --time, --gr) and even its exact
    # option names belong to the worker once the command has started.
    code = cli.main(["-np", "1", sys.executable, "-c", "import sys; print(sys.argv[1:])",
                     "--link", "x", "--time", "--gr", "--timeout", "5", "-np", "3"])
    assert code == 0
    assert "['--link', 'x', '--time', '--gr', '--timeout', '5', '-np', '3']" in \
        capsys.readouterr().out


@pytest.mark.parametrize("argv", [["-H", "localhost:2"], ["-np", "2", "-H", "localhost:1,127.0.0.1:1"],
                                  ["-np", "2", "-H", "localhost:3"]])
def test_horovod_host_spelling_runs_local_workers(argv, capsys):
    """`horovodrun -np 2 -H localhost:2 python train.py` becomes `tfdist-run` with the same options."""
    program = "import json, os; print('index', json.loads(os.environ['TF_CONFIG'])['task']['index'])"
    assert cli.main([*argv, sys.executable, "-c", program]) == 0
    out = capsys.readouterr().out
    assert "[0] index 0" in out and "[1] index 1" in out and "[2]" not in out


def test_missing_program_is_reported(capsys):
    assert cli.main(["-np", "2", "/nonexistent/program"]) == 127
    assert "cannot start '/nonexistent/program'" in capsys.readouterr().out


def test_ports_are_distinct_and_configs_name_every_worker():
    ports = free_ports(16)
    assert len(set(ports)) == 16
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        ephemeral_low = int(f.read().split()[0])
    # Outgoing connections take ports from the ephemeral range: a worker's port must not be there.
    assert all(1024 <= port < ephemeral_low for port in ports), ports
    configs = tf_configs(["a:1", "b:2"])
    assert '"index": 1' in configs[1] and '"worker": ["a:1", "b:2"]' in configs[0]


def test_parameter_servers_get_ps_tasks_after_the_workers():
    configs = [json.loads(c) for c in tf_configs(["a:1", "b:2"], ["c:3"])]
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0},
                                            {"type": "worker", "index": 1},
                                            {"type": "ps", "index": 0}]
    assert all(c["cluster"] == {"worker": ["a:1", "b:2"], "ps": ["c:3"]} for c in configs)


@pytest.mark.parametrize("mode, code, restarts", [("fail_once", 0, 1), ("fail", 3, 2)])
def test_max_restarts_starts_the_job_again_and_says_why(tmp_path, mode, code, restarts, how):
    launcher = _start(tmp_path, 2, mode, how, "--max-restarts", "2")
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == code, out
    for attempt in range(1, restarts + 1):
        assert f"restart {attempt} of 2: worker 1 exited with code 3; " \
               "starting all 2 workers again." in out
    assert f"restart {restarts + 1} of" not in out


def _assert_the_job_failed(launcher, out, stopped):
    """Worker 2, the last in the job, failed with code 3 after workers 0 and 1."""
    assert launcher.returncode == 3, out
    assert ("worker 2 (pid " in out and "exited with code 3, the last worker in the job: "
            "worker(s) [0, 1] died before it and have not rejoined, and there is no job "
            f"left to rejoin (--elastic); the job failed; stopping workers {stopped}.") in out, out


def test_an_elastic_job_whose_every_worker_dies_fails(tmp_path, how):
    # Each death leaves others running, so each dead worker awaits its replacement; when
    # the last one dies there is no job to rejoin: the job failed, not "finished".
    launcher = _start(tmp_path, 3, "all_fail", how, "--elastic")
    out, _ = launcher.communicate(timeout=60)
    _assert_the_job_failed(launcher, out, stopped=[])
    assert "the job finished" not in out and "starts again in" in out


def test_replacements_not_yet_in_the_job_are_stopped_when_its_last_worker_dies(tmp_path,
                                                                               how):
    # Worker 0's replacement runs, not yet admitted, when worker 2, the last worker in the
    # job, dies: the job failed; the replacement must not go on and start it afresh.
    launcher = _start(tmp_path, 3, "members_die", how, "--elastic")
    out, _ = launcher.communicate(timeout=60)
    _assert_the_job_failed(launcher, out, stopped=[0])
    assert out.count("hello from 0") == 2 and out.count("hello from 1") == 1, out


def test_a_replacement_in_the_job_keeps_it_going_when_the_first_workers_die(tmp_path, how):
    # The same deaths, but worker 0's replacement joined (it created its member file).
    launcher = _start(tmp_path, 3, "replacement_joins", how, "--elastic")
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, out
    assert "the job failed" not in out, out
    assert "worker 2 starts again in" in out, out


def test_an_elastic_worker_too_late_to_rejoin_is_not_started_again(tmp_path, how):
    # tfdist_ext.launch.elastic_env.EXIT_LATE: its script is in an earlier fit than the job.
    launcher = _start(tmp_path, 3, "late", how, "--elastic")
    out, _ = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, out
    assert "exited with code 76 (too late to rejoin: not started again); the others go on " \
           "without it (--elastic)." in out, out
    assert "starts again in" not in out
    assert "the job finished without worker(s) [1], which died (--elastic)." in out, out


def test_max_restarts_must_not_be_negative(capsys):
    with pytest.raises(SystemExit):
        cli.main(["-np", "2", "--max-restarts", "-1", "true"])
    assert "--max-restarts" in capsys.readouterr().err


@pytest.mark.parametrize("user", [None, "50"])
def test_more_workers_than_cores_stop_ucx_ranks_polling(user):
    """A rank polling for UCX messages holds a core: with more processes than cores the
    launcher sets TFDIST_UCX_SPIN_US=0, unless the user set it; with fewer it stays unset."""
    cores = len(os.sched_getaffinity(0))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TFDIST_UCX_SPIN_US", None)
    if user is not None:
        env["TFDIST_UCX_SPIN_US"] = user
    show = "import os; print('spin', os.environ.get('TFDIST_UCX_SPIN_US'))"
    for workers, expected in ((cores + 1, user or "0"), (1, user)):
        out = subprocess.run([sys.executable, "-m", "tfdist_ext.launch", "-np", str(workers),
                              "--output", "all", sys.executable, "-c", show],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=60,
                             check=True).stdout
        assert out.count(f"spin {expected}") == workers, out
