"""Rank exchanges through a real store (the elastic store's server in this process):
values in rank order, and a wait that stops when told to (a peer found dead never
publishes its address)."""

import threading
import time

import pytest
import tensorflow as tf

from tfdist_ext import coordination
from tfdist_ext.elastic import store


def test_ranks_get_every_value_in_rank_order_including_one_published_later():
    kv = store.Client(store.Store("127.0.0.1").address)
    kv.set("x/0", "AAE=")  # rank 0's b"\x00\x01", base64
    later = threading.Timer(1.5, kv.set, ("x/3", "Aw=="))  # rank 3's b"\x03", 1.5 s on
    later.start()
    try:
        got = coordination.exchange_ranks("x", [b"one", b""], first_rank=1, world_size=4,
                                          kv=kv, seconds=30, stopped=lambda: None)
    finally:
        later.cancel()
    assert got == [b"\x00\x01", b"one", b"", b"\x03"]


def test_a_wait_stops_within_a_second_of_being_told_naming_the_reason():
    kv = store.Client(store.Store("127.0.0.1").address)
    began = time.monotonic()
    reasons = iter([None, None, "peer task:2 failed: its server is gone"])
    with pytest.raises(tf.errors.AbortedError,
                       match=r"Stopped waiting for 'y/1' in the store: peer task:2 failed: "
                             r"its server is gone"):
        coordination.exchange_ranks("y", [b"zero"], first_rank=0, world_size=2, kv=kv,
                                    seconds=300, stopped=lambda: next(reasons))
    assert 2.5 < time.monotonic() - began < 10  # three one-second waits, not 300 s
    assert kv.get("y/0", 1) == "emVybw=="  # this rank's value was published first


def test_without_a_reason_to_stop_the_wait_ends_at_its_bound():
    kv = store.Client(store.Store("127.0.0.1").address)
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="'z/1' was not set"):
        coordination.exchange_ranks("z", [b"a"], first_rank=0, world_size=2, kv=kv,
                                    seconds=2.5, stopped=lambda: None)
    assert 2.4 < time.monotonic() - began < 8
