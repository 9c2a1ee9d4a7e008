"""The dead-peer watcher's settings (tfdist_ext/liveness.py).

What it does when a peer dies or freezes, on both engines, with and without the
launcher: tests/collectives/test_peer_failures.py.
"""

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


def test_nothing_is_watched_alone_or_when_turned_off(monkeypatch):
    alone = cluster.parse_tf_config(
        '{"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": "worker", "index": 0}}')
    assert liveness.watch(alone, lambda reason, task: None) is None  # servers are not watched
    monkeypatch.setenv("TFDIST_PEER_TIMEOUT", "0")
    pair = cluster.parse_tf_config(
        '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}')
    assert liveness.watch(pair, lambda reason, task: None) is None
