"""The dead-peer watcher's settings (tfdist_ext/liveness.py).

What it does when a peer dies or freezes, on both engines, with and without the
launcher: tests/collectives/test_peer_failures.py.
"""

import time

import pytest

from tfdist_ext import cluster, liveness


@pytest.mark.parametrize("text, seconds", [("", 2.0), ("5", 5.0), ("0.5", 0.5), ("0", 0.0)])
def test_peer_timeout_from_the_environment(text, seconds):
    assert liveness.timeout_from_env({"TFDIST_PEER_TIMEOUT": text}) == seconds
    assert liveness.timeout_from_env({}) == liveness.DEFAULT_TIMEOUT_SECONDS


@pytest.mark.parametrize("text", ["-1", "soon", "nan", "inf"])
def test_a_bad_peer_timeout_is_named(text):
    with pytest.raises(ValueError, match=rf"TFDIST_PEER_TIMEOUT='{text}' must be a number of "
                                         r"seconds >= 0 \(default 2; 0 turns the dead-peer "
                                         r"watcher off\)"):
        liveness.timeout_from_env({"TFDIST_PEER_TIMEOUT": text})


@pytest.mark.parametrize("text, heartbeat", [("", liveness.WATCHED_HEARTBEAT_MS),
                                             ("5", liveness.WATCHED_HEARTBEAT_MS),
                                             ("0", 0), ("soon", 0)])
def test_the_coordination_heartbeat_backs_the_watcher_up(text, heartbeat):
    """TF's 10 s default stays where the watcher is off (or Strategy() will name a bad value)."""
    assert liveness.coordination_heartbeat_ms({"TFDIST_PEER_TIMEOUT": text}) == heartbeat


def test_nothing_is_watched_alone_or_when_turned_off(monkeypatch):
    alone = cluster.parse_tf_config(
        '{"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker", "index": 0}}')
    assert liveness.watch(alone, lambda reason, task: None) is None  # servers are not watched
    monkeypatch.setenv("TFDIST_PEER_TIMEOUT", "0")
    pair = cluster.parse_tf_config(
        '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}')
    assert liveness.watch(pair, lambda reason, task: None) is None


def test_the_failure_report_is_awaited_by_one_blocking_read(monkeypatch):
    """A read with a timeout stays pending on the coordination service until its key is set:
    reading the failure report every round grew the chief by ~20 KB a read (450 MB in the
    21,000 reads of an hour at 3 workers)."""
    reads = []

    def spy(key, timeout_in_ms):
        reads.append((key, timeout_in_ms))
        return real(key, timeout_in_ms)

    real = liveness._compat.coordination_key_value
    monkeypatch.setattr(liveness._compat, "coordination_key_value", spy)
    watcher = liveness.Watcher("/job:worker/replica:0/task:0", [], timeout=2.0)
    watcher.start()
    time.sleep(4 * liveness.INTERVAL_SECONDS)
    watcher.stop()
    assert reads and all(timeout == 0 for _, timeout in reads), reads
    assert len(reads) == 1  # no service in this process: retried after RETRY_SECONDS
