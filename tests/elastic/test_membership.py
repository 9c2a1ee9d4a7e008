"""Elastic training's agreement, join requests and beacon, in one process.

`membership.agree` runs in threads over a shared dict; `joining`, `admission` and `beacon`
over real stores and UDP sockets on 127.0.0.1.
"""

import threading
import time

import pytest

from tfdist_ext.elastic import (MembershipError, admission, beacon, fencing, joining,
                                membership, store)
from tfdist_ext.launch import free_ports


class _Store:
    """A key-value store shared by threads (each key set once), for `membership.agree`."""

    def __init__(self):
        self.values, self.changed = {}, threading.Condition()

    def set(self, key, value):
        with self.changed:
            assert key not in self.values, key
            self.values[key] = value
            self.changed.notify_all()

    def get(self, key, seconds):
        with self.changed:
            if not self.changed.wait_for(lambda: key in self.values, seconds):
                raise TimeoutError(key)
            return self.values[key]


def _agree_all(shared, reports, timeout=2.0):
    results = {}

    def run(me, alive, steps):
        try:
            results[me] = membership.agree(shared.set, shared.get, "g1", me, alive, steps, timeout)
        except MembershipError as err:
            results[me] = err

    threads = [threading.Thread(target=run, args=r) for r in reports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_survivors_agree_on_members_and_the_step_to_resume_at():
    results = _agree_all(_Store(), [(0, (0, 1, 3), 11), (1, (0, 1, 3), 12), (3, (0, 1, 3), 11)])
    assert results == {w: ((0, 1, 3), 12, 0) for w in (0, 1, 3)}
    assert membership.survivors((0, 1, 2, 3), [2]) == (0, 1, 3)
    assert membership.position((0, 1, 3), 3) == 2


def test_the_state_comes_from_the_first_survivor_that_holds_it():
    # Worker 1 replaced a dead worker; the chief died before the admission's state
    # broadcast reached it. Worker 1 leads the agreement (first in rank order) but the
    # state must come from worker 2, or the members would take the replacement's
    # fresh variables.
    shared = _Store()
    results = {}

    def run(me, holds):
        results[me] = membership.agree(shared.set, shared.get, "g", me, (1, 2), 30, 2.0,
                                       holds_state=holds)

    threads = [threading.Thread(target=run, args=(1, False)),
               threading.Thread(target=run, args=(2, True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {1: ((1, 2), 30, 2), 2: ((1, 2), 30, 2)}
    # Nobody left holds it: every survivor stops, saying so, instead of going on with
    # a replacement's variables.
    shared = _Store()
    errors = {}

    def lost(me):
        try:
            membership.agree(shared.set, shared.get, "h", me, (1, 3), 30, 2.0,
                             holds_state=False)
        except MembershipError as err:
            errors[me] = str(err)

    threads = [threading.Thread(target=lost, args=(w,)) for w in (1, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(errors) == [1, 3]
    assert all("no survivor of (1, 3) holds the model's and optimizer's state" in e and
               "Start the job again" in e for e in errors.values()), errors


def test_too_few_survivors_are_named_with_their_addresses():
    addresses = {0: "h0:1", 1: "h1:2", 2: "h2:3"}
    membership.check_enough((0, 2), {1}, 2, addresses)
    with pytest.raises(MembershipError, match=r"worker\(s\) \[1, 2\] \(h1:2, h2:3\) died; "
                       r"1 worker\(s\) \[0\] are left, fewer than Elastic\(min_workers=2\)"):
        membership.check_enough((0,), {2, 1}, 2, addresses)


def test_a_silent_survivor_is_left_out_and_told_so():
    shared = _Store()
    results = _agree_all(shared, [(0, (0, 1, 2), 5), (1, (0, 1, 2), 5)], timeout=0.5)
    assert results[0] == ((0, 1), 5, 0) and results[1] == ((0, 1), 5, 0)
    late = _agree_all(shared, [(2, (0, 1, 2), 5)])[2]
    assert isinstance(late, MembershipError) and "worker 2 was left out" in str(late)


def test_the_leader_stops_waiting_for_a_worker_that_died_after_the_health_check():
    # Worker 2 (a replacement that crashed while joining) passed the survivors' health
    # check but never reports: the leader asks `gone` instead of waiting out the timeout.
    asked = []

    def gone(worker):
        asked.append(worker)
        return worker == 2

    shared, began = _Store(), time.monotonic()
    members = membership.agree(shared.set, shared.get, "g", 0, (0, 2), 7, 60.0, gone)
    assert members == ((0,), 7, 0)
    assert time.monotonic() - began < 3 * membership.CHECK_SECONDS
    assert asked == [2]


def test_a_slow_worker_still_alive_is_waited_for():
    shared = _Store()
    threading.Timer(2.5 * membership.CHECK_SECONDS, shared.set,
                    ("g/report/1", '{"alive": [0, 1], "steps": 9}')).start()
    asked = []
    members = membership.agree(shared.set, shared.get, "g", 0, (0, 1), 7, 60.0,
                               lambda worker: asked.append(worker) or False)
    # Asked each second until the report arrives (twice, or three times on a busy machine).
    assert members == ((0, 1), 9, 0) and set(asked) == {1} and 2 <= len(asked) <= 3


def test_only_the_latest_request_of_a_worker_not_in_the_job_counts():
    items = {"p/join/2/0000001000.000000-7": "h:1", "p/join/2/0000002000.000000-9": "h:2",
             "p/join/1/0000001500.000000-8": "h:3", "p/join/0/0000001600.000000-5": "h:4"}
    assert joining.pending(items, members=(0, 3), handled=()) == {
        2: ("p/join/2/0000002000.000000-9", "h:2"), 1: ("p/join/1/0000001500.000000-8", "h:3")}
    # Worker 2's latest request was admitted: its older one names a dead store.
    assert joining.pending(items, members=(0,), handled={"p/join/2/0000002000.000000-9"}) == {
        1: ("p/join/1/0000001500.000000-8", "h:3")}
    assert joining.admitted_key("p/join/2/x") == "p/admitted/2/x"


def test_a_replacement_nobody_admits_stops_naming_join_seconds_or_the_ended_job():
    own, member = store.Store("127.0.0.1"), store.Store("127.0.0.1")
    stores = {0: member.address, 2: own.address}
    request, asked = joining.ask("p", 2, own.address, stores, [0, 2], 1)
    assert asked == [0] and member.items("p/join/") == {request: own.address}
    with pytest.raises(MembershipError, match=r"worker 2 was not taken into the running job "
                       r"within join_seconds=0.5 s \(asked workers \[0\]\)"):
        joining.wait_admitted(own, request, stores, asked, 0.5, 2)
    member.close()  # the members finished
    with pytest.raises(MembershipError, match=r"asked workers \[0\] to take it into the "
                       r"running job, but they went away before they did: the job ended"):
        joining.wait_admitted(own, request, stores, asked, 30.0, 2)
    with pytest.raises(MembershipError, match=r"no member of the running job \(\[0, 2\]\) "
                       "answered at its store"):
        joining.ask("p", 2, own.address, stores, [0, 2], 1)
    threading.Timer(0.2, lambda: store.Client(own.address).set(
        joining.admitted_key(request), "{}")).start()
    assert joining.wait_admitted(own, request, stores, asked, 30.0, 2) == "{}"
    own.close()


def test_the_members_answer_a_replacement_at_their_tf_config_port():
    port = free_ports(1)[0]
    assert beacon.running_job([f"127.0.0.1:{port}"], tries=1, seconds=0.2) is None
    state = {"stores": {"0": "127.0.0.1:1"}, "members": [0, 1], "generation": 3, "fit": 2}
    answering = [state]
    assert beacon.serve(f"127.0.0.1:{port}", "tfdist/x", lambda: answering[0])
    assert beacon.running_job([f"127.0.0.1:{free_ports(1)[0]}", f"127.0.0.1:{port}"]) == {
        "tfdist/x": state}
    # `Recovery.look_again`: the members and their stores as a member answers now, the
    # asking worker's own store left out; None when no member answers for the strategy.
    addresses = {0: f"127.0.0.1:{port}", 1: f"127.0.0.1:{free_ports(1)[0]}"}
    state.update(stores={"0": "127.0.0.1:7", "1": "127.0.0.1:8", "2": "127.0.0.1:9"},
                 members=[0, 2])
    assert joining.members_now("tfdist/x", 1, addresses) == (
        (0, 2), {0: "127.0.0.1:7", 2: "127.0.0.1:9"}, 2)
    state["members"] = [0]
    assert joining.members_now("tfdist/x", 1, addresses)[0] == (0,)
    assert joining.members_now("tfdist/other", 1, addresses) is None
    # A replacement not yet admitted (its state None) does not answer: another replacement
    # asking it must not take the TF_CONFIG workers it starts with for the running job.
    answering[0] = None
    assert beacon.running_job([f"127.0.0.1:{port}"], tries=1, seconds=0.3) is None
    assert joining.members_now("tfdist/x", 1, addresses) is None


def test_the_leader_hears_of_a_join_request_when_it_arrives():
    own = store.Store("127.0.0.1")
    assert own.items("p/join/", 0, 0.05) == {}  # waited, nothing came
    threading.Timer(0.2, lambda: store.Client(own.address).set("p/join/2/x", "h:2")).start()
    start = time.monotonic()
    assert own.items("p/join/", 0, 30.0) == {"p/join/2/x": "h:2"}
    assert time.monotonic() - start < 10.0  # woken by the request, not the 30 s timeout
    assert own.items("p/join/", 1, 0.05) == {"p/join/2/x": "h:2"}  # nothing new: times out
    own.close()


def test_a_wait_in_a_store_ends_when_its_check_raises():
    own = store.Store("127.0.0.1")
    checks = []

    def check():
        checks.append(time.monotonic())
        if len(checks) == 2:
            raise ConnectionAbortedError("worker 1 died")

    start = time.monotonic()
    with pytest.raises(ConnectionAbortedError, match="worker 1 died"):
        store.Client(own.address, check, check_seconds=0.2).get("k", 60.0)
    assert len(checks) == 2 and time.monotonic() - start < 10.0
    with pytest.raises(TimeoutError, match=r"'k' was not set in the store at .* within 0.5 s"):
        store.Client(own.address, lambda: None, check_seconds=0.2).get("k", 0.5)
    threading.Timer(0.3, lambda: store.Client(own.address).set("k", "v")).start()
    assert store.Client(own.address, lambda: None, check_seconds=0.1).get("k", 30.0) == "v"
    own.close()


def test_the_leader_raises_the_join_flag_for_a_live_replacement_only():
    own, replacement = store.Store("127.0.0.1"), store.Store("127.0.0.1")
    dead = store.Store("127.0.0.1")
    dead_address = dead.address
    dead.close()
    client = store.Client(own.address)
    client.set(joining.request_key("p", 2, "1", 1), dead_address)  # died since it asked
    looks = threading.Semaphore(0)

    def leads():  # the watcher asks before it judges what it found in the store
        looks.release()
        return True

    requests = admission.Requests(own, "p", lambda: (0, 1), leads, lambda: 1)
    for _ in range(2):  # the second look comes after the dead request was judged
        assert looks.acquire(timeout=30)
    assert float(requests.flag.numpy()) == 0.0
    assert not requests.requested()
    client.set(joining.request_key("p", 2, "2", 1), replacement.address)  # its replacement
    deadline = time.monotonic() + 30
    while float(requests.flag.numpy()) == 0.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert float(requests.flag.numpy()) == 1.0
    requests.agreed.assign(1.0)  # what the members' all-reduce of the flag sums to
    assert requests.requested()
    assert requests.take() == {2: ("p/join/2/2-fit1", replacement.address)}
    assert float(requests.flag.numpy()) == 0.0 and requests.take() == {}
    requests.settled()
    assert not requests.requested()
    own.close()
    replacement.close()


def test_a_request_admitted_by_another_leader_is_not_admitted_again():
    """Worker 0's replacement asked members 1 and 2; 2 led and admitted it. Later 0
    died again and 1 leads: the old request in 1's store must not count (its store is
    gone), while the new replacement's does."""
    own, first, second = (store.Store("127.0.0.1") for _ in range(3))
    members = [1, 2]
    requests = admission.Requests(own, "p", lambda: tuple(members), lambda: False, lambda: 1)
    client = store.Client(own.address)
    client.set(joining.request_key("p", 0, "1", 1), first.address)
    requests.settled({0})  # the admission of worker 0 that worker 2 led
    first.close()  # that replacement died, and worker 0 is no member again
    assert requests.take() == {}
    client.set(joining.request_key("p", 0, "2", 1), second.address)
    assert requests.take() == {0: ("p/join/0/2-fit1", second.address)}
    # Without the settle, a request whose store is gone is still not taken.
    client.set(joining.request_key("p", 3, "1", 1), first.address)
    members.append(0)
    assert requests.take() == {}
    own.close()
    second.close()


def test_a_replacement_in_another_fit_than_the_members_is_refused():
    """A replacement runs its script from the start: in a script of several fits it may
    ask in its first while the members run a later one. It is refused, naming both fits,
    and never raises the join flag; one asking in the members' fit is taken."""
    own, early, timely = (store.Store("127.0.0.1") for _ in range(3))
    fit = [2]
    requests = admission.Requests(own, "p", lambda: (0, 1), lambda: True, lambda: fit[0])
    stores = {0: own.address, 2: early.address}
    request, _ = joining.ask("p", 2, early.address, stores, [0], 1)
    refused = (r"worker 2 replaces a dead worker and asked to join in fit 1 of its script "
               r"\(a replacement runs the script from the start\), but the running job is in "
               r"fit 2: a replacement joins only in the fit the members run\. The job goes on "
               r"without it\. To use every worker again, restart the whole job")
    with pytest.raises(joining.JoinRefused, match=refused):
        joining.wait_admitted(early, request, stores, [0], 30.0, 2)
    assert float(requests.flag.numpy()) == 0.0 and requests.take() == {}
    # The replacement's own check, from the members' answer, before it traces anything.
    with pytest.raises(joining.JoinRefused, match=refused):
        joining.check_fit(2, 1, 2)
    joining.check_fit(2, 2, 2)
    joining.check_fit(2, 1, None)  # members of a version that does not say
    assert joining.request_fit("p/join/2/0000001000.000000-7") == 0  # nor its request
    assert joining.request_fit(joining.request_key("p", 2, "0000001000.000000-7", 12)) == 12
    # A request of the members' fit raises the flag; if their fit ends before a step
    # carries it, the next fit's start refuses it and lowers the flag.
    request, _ = joining.ask("p", 2, timely.address, {0: own.address}, [0], 2)
    deadline = time.monotonic() + 30
    while float(requests.flag.numpy()) == 0.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert float(requests.flag.numpy()) == 1.0
    fit[0] = 3
    requests.recheck()
    assert float(requests.flag.numpy()) == 0.0
    with pytest.raises(joining.JoinRefused, match="asked to join in fit 2 .* in fit 3"):
        joining.wait_admitted(timely, request, {0: own.address}, [0], 30.0, 2)
    for each in (own, early, timely):
        each.close()


@pytest.mark.parametrize("members, alive, gone, goes_on", [
    ((0, 1, 2), (0, 1), (), True),        # one stopped or cut off: the two go on
    ((0, 1, 2), (2,), (), False),         # ... and it stops
    ((0, 1), (0,), (), False),            # two that lose each other: neither goes on
    ((0, 1), (0,), (1,), True),           # the other's server refused: it died
    ((0, 1, 2), (1,), (0, 2), True),      # the rest died
    ((0, 1, 2, 3), (0, 1), (), False),    # half is no majority
    ((0, 1, 2, 3), (0, 1), (3,), True),
])
def test_only_a_majority_of_the_members_not_known_dead_goes_on(members, alive, gone, goes_on):
    if goes_on:
        fencing.check_quorum(alive[0], members, alive, gone)
        return
    with pytest.raises(MembershipError) as caught:
        fencing.check_quorum(alive[0], members, alive, gone)
    silent = sorted(set(members) - set(alive) - set(gone))
    assert f"worker {alive[0]} cannot reach worker(s) {silent}" in str(caught.value)
    assert "not a majority" in str(caught.value) and "as a replacement" in str(caught.value)


def test_a_frozen_worker_goes_on_only_while_it_is_still_a_member():
    state = {"members": [0, 1, 2], "generation": 3}
    fencing.check_not_frozen(2, 3, None, lambda: None)  # not frozen: nothing asked
    fencing.check_not_frozen(2, 3, 12.0, lambda: state)  # still a member
    removed = {"members": [0, 1], "generation": 4}
    with pytest.raises(MembershipError, match=r"worker 2 did not run for 12 s .* removed it "
                                              r"and went on without it as 2 worker\(s\) "
                                              r"\[0, 1\] \(generation 4\)"):
        fencing.check_not_frozen(2, 3, 12.0, lambda: removed)
    with pytest.raises(MembershipError, match="no other worker answers now"):
        fencing.check_not_frozen(2, 3, 12.0, lambda: None)


def test_a_function_traced_for_one_membership_serves_another_of_the_same_rank_size_and_hosts():
    one_host = ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]
    two_hosts = ["10.0.0.1:5000", "10.0.0.1:5001", "10.0.0.2:5000"]
    key = membership.traced_for
    # Ranks follow the worker indices whoever is the chief (members[0]): one trace serves.
    for worker in range(3):
        assert key((0, 1, 2), worker, one_host) == key((1, 0, 2), worker, one_host) == key(
            (2, 0, 1), worker, one_host) == (3, worker, ("127.0.0.1",) * 3)
        assert key((0, 1, 2), worker, two_hosts) == key((2, 1, 0), worker, two_hosts)
    # A death changes the size, and the ranks of the workers after the dead one.
    assert key((0, 1), 0, one_host) != key((0, 1, 2), 0, one_host)
    assert key((0, 2), 2, one_host) == (2, 1, ("127.0.0.1",) * 2)
    # The hosts in rank order shape the schedules: across hosts the members count too.
    assert key((0, 2), 0, two_hosts) != key((0, 1), 0, two_hosts)


def test_an_admission_keeps_the_chief_first_and_ranks_the_others_by_index():
    # The chief leads and checkpoints; every rank is the worker's place by index, so at
    # the full size every worker is back at its own index, where its step function is
    # kept, the chief's death and a new chief included (it used to move the new chief
    # to rank 0, where it traced again).
    assert membership.admitted((0, 2), [1]) == (0, 1, 2)
    assert membership.admitted((0, 1), [2]) == (0, 1, 2)
    assert membership.admitted((1, 2), [0]) == (1, 0, 2)
    assert membership.admitted((2,), [1, 0]) == (2, 0, 1)
    assert membership.admitted((0, 1, 3), []) == (0, 1, 3)
    full = (0, 1, 2, 3)
    for dead in full:
        back = membership.admitted(membership.survivors(full, [dead]), [dead])
        assert [membership.position(back, w) for w in full] == list(full), (dead, back)
    assert membership.position((1, 0, 2), 1) == 1 and membership.position((2, 0), 2) == 1
