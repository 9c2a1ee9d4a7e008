"""What survivors do when a worker dies during `fit` (`Strategy(elastic=True)`).

As torchft's per-step fault tolerance (pytorch/torchft, 2025), a failed step is
discarded and the survivors go on in the same processes:

1. Detect: the dead-peer watcher (`tfdist_ext.liveness`) finds a killed or stopped
   worker within about a second and aborts the UCX communicators that exist: the
   step in flight fails on every survivor (one whose step had finished, in its next).
2. Discard: the failed step's batch is consumed and its update not trusted.
3. Agree: the survivors health-check the members and report what they found and
   their step counts; the first survivor in the members' order announces the membership
   (`membership.agree`, in its store, `store.py`: TF's coordination service dies
   with worker 0). Fewer than `min_workers` stops every survivor, naming the missing.
4. Rebuild: new communicators for the new world size and rank (`CrossDeviceOps.
   reconfigure`); Keras' functions traced again, or reused where this worker had the
   same rank among as many members on the same hosts (`keras.elastic_steps`).
5. Agree on state: the first survivor that holds it (not a replacement whose
   admission failed) broadcasts the model's and optimizer's variables; survivors
   that ran fewer steps skip the difference. The first survivor is the chief.

The survivors split each global batch (`keras.local_input`), so no shard is lost.
A replacement (the dead worker's script started again) finds the members
(`beacon`), asks to join in their `fit` and waits (`join`, `joining`); they admit
it after the same step (`admission`, `admit`): a new generation ranked by
`membership.admitted`, the chief's state broadcast, and its `fit` resumes at their
epoch and batch. A death during a recovery or an admission makes the survivors
agree again (`recover_and_share`). SIGTERM or a straggler leaves (`leaving`).
"""

import contextlib
import functools
import json
import logging
import threading
import time
from typing import Dict

import tensorflow as tf

from tfdist_ext import _compat, liveness
from tfdist_ext.collectives import ucx_aborts, ucx_engine
from tfdist_ext.elastic import (admission, beacon, fencing, health, joining, membership,
                                state_sync, store, stragglers)

log = logging.getLogger("tfdist_ext")
RECOVERY_ATTEMPTS = 3  # agreements per failed step (another death can end one)


class Recovery:
    """Elastic membership of one strategy.

    Args:
        strategy: The `tfdist_ext.Strategy` (one replica per worker).
        options: Its `tfdist_ext.elastic.Elastic`.
        key_prefix: Unique to the strategy, the same on every worker.

    Attributes:
        members: TF_CONFIG indices of the workers in the job now.
        generation: How many times the membership changed.
        failures: One dict per change: "generation", "step" (this worker's steps so
            far, the failed one included), "dead", "members", "skipped" (steps this
            worker skips to be level), "source" (the worker the state came from),
            "seconds" (from the failed step to the new membership), "time".
        joins: One dict per admission of replacement workers: "generation",
            "step", "joined", "members", "time", "pause" (seconds of its parts).
        leaves: One dict per departure (`leaving`): "generation", "step", "left",
            "members", "time" and "reason".
        replacement: Whether this process joined a running job (a replacement).
        holds_state, state_root: Whether this worker holds the training state (a
            replacement once its admission's broadcast completed); the chief's rank, or
            after a recovery that of the first survivor that holds the state.
        found, found_fit: The members a replacement found running (at its start,
            `look_again`) and their fit (None: not known).
        fit: `fit` calls begun on this strategy (`begin_fit`).
        rehearsing: A replacement traces its step as a member (`rehearsal`).
        join_flag, join_agreed: float32 variables: a join request this worker (the
            members' leader) saw, and the members' sum of it in the last step.
        stragglers: The `stragglers.Monitor`, or None (`straggler_factor` off).
    """

    def __init__(self, strategy, options, key_prefix):
        self.options = options
        self.me = strategy.worker_index
        self.members = tuple(range(strategy.num_workers))
        self.generation, self._attempted = 0, 0  # (the last generation this worker tried)
        self.failures, self.joins, self.leaves = [], [], []  # (see Attributes)
        self._strategy, self._prefix = strategy, key_prefix
        self._addresses = dict(enumerate(strategy.cluster.worker_addresses))
        # Keras' input splits each global batch by these (`data_split`); made here,
        # outside any strategy scope, so that they stay this worker's own.
        with tf.init_scope():
            self._split = tuple(_compat.ResourceVariable(value, dtype=tf.int64, trainable=False,
                                                         name=name) for value, name in (
                (self.me, "elastic_part"), (len(self.members), "elastic_parts")))
        self._lock = threading.Lock()  # the watcher's aborts against a membership change
        self._reported_dead = {}  # worker -> health.GONE / UNREACHABLE, from the watcher
        self.frozen, self._on_promotion = None, []  # (why this worker, frozen, was removed)
        self.position, self.steps = (0, 0), 0  # the running fit's (epoch, batch), steps
        self.state_stale = False  # the members changed outside a step function
        # Every worker serves a store; the members meet in their leader's.
        self._store = store.Store(self._addresses[self.me].rpartition(":")[0].strip("[]"))
        self.catching_up = self.rehearsing = False  # (joined, the members' fit ahead)
        self._stores, running, self.found_fit = joining.stores_at_start(
            self._prefix, self.me, self.members, self._store.address)
        self.joining = self.replacement = running is not None
        self.holds_state, self.state_root = not self.joining, 0  # (see Attributes)
        self.found, self.fit = tuple(running or ()), 0
        beacon.serve(self._addresses[self.me], self._prefix, self._beacon_state)
        self._requests = admission.Requests(
            self._store, self._prefix, lambda: self.members,
            lambda: not self.joining and self.members[0] == self.me, lambda: self.fit)
        self.join_flag, self.join_agreed = self._requests.flag, self._requests.agreed
        self.stragglers = None if options.straggler_factor is None else stragglers.Monitor(
            self.me, len(self._addresses), options.straggler_factor, options.straggler_steps)

    def _beacon_state(self):  # a replacement not yet admitted does not answer (None)
        stores = {str(w): a for w, a in self._stores.items()}
        return None if self.joining else {"stores": stores, "members": list(self.members),
                                          "generation": self.generation, "fit": self.fit}

    def begin_fit(self):
        """At each `fit`'s start: counts it; a replacement in another fit than the
        members' stops (`joining.check_fit`); their leader refuses earlier fits' requests."""
        self.fit += 1
        if self.joining:
            joining.check_fit(self.me, self.fit, self.found_fit)
        self._requests.recheck()

    def join_requested(self) -> bool:
        """Whether the last step's all-reduce carried a join request (every member agrees)."""
        return self._requests.requested()

    def admit(self, steps: int, test_steps: int = 0):
        """Every member, after the same step: takes in the workers that asked to join.

        Args:
            steps: Training steps this worker ran (the same on every member).
            test_steps: Test steps it ran (`evaluate`, validation), likewise.
        """
        generation = self.next_generation()
        prefix = f"{self._prefix}/elastic/{generation}"
        if self.members[0] == self.me:
            requests = self._requests.take()
            # A replacement's store is new: everyone learns its address here.
            stores = {str(w): address for w, (_, address) in requests.items()}
            decision = {"generation": generation, "stores": stores,
                        "members": list(membership.admitted(self.members, requests)),
                        "steps": steps, "test_steps": test_steps,
                        "epoch": self.position[0], "batch": self.position[1] + 1}
            self.kv().set(f"{prefix}/admission", json.dumps(decision))
            admission.notify(requests, decision)
        else:
            decision = json.loads(self.kv().get(f"{prefix}/admission",
                                                2 * self.options.recover_seconds))
        self._requests.settled(set(decision["members"]) - set(self.members))
        self._stores.update({int(w): address for w, address in decision["stores"].items()})
        joiners = sorted(set(decision["members"]) - set(self.members))
        self._alive_again(joiners)
        self.change(generation, tuple(decision["members"]))
        self.joins.append({"generation": generation, "step": steps, "joined": joiners,
                           "members": list(decision["members"]), "time": time.time()})
        log.warning("tfdist_ext: worker(s) %s joined at step %d; %d workers %s (generation %d).",
                    joiners, steps, len(decision["members"]), decision["members"], generation)

    def join(self, variables) -> dict:
        """A replacement worker: asks the members to take it in and waits until they do.

        Args:
            variables: The model's and optimizer's variables, received from the chief.

        Returns:
            The admission: "generation", "members", "stores", "steps" and "test_steps"
            (the members' train and test steps so far), "epoch" and "batch" (the epoch
            the members are in, and how many of its batches they ran).

        Raises:
            joining.JoinRefused: the members run another fit.
        """
        ucx_engine.load_library()  # not while the members wait for it to wire up
        request, asked = joining.ask(self._prefix, self.me, self._store.address,
                                     self._stores, list(self.found or self.members), self.fit)
        log.warning("tfdist_ext: worker %d asks worker(s) %s to take it into the running job.",
                    self.me, asked)
        decision = json.loads(joining.wait_admitted(self._store, request, self._stores, asked,
                                                    self.options.join_seconds, self.me))
        self._stores.update({int(w): address for w, address in decision["stores"].items()})
        self.joining, self.catching_up = False, True
        # A death this replacement saw while it waited may be of a worker whose own
        # replacement joins with it: the leader's decision says who is alive now.
        self._alive_again([w for w in decision["members"] if w in self._reported_dead])
        self.change(decision["generation"], tuple(decision["members"]))
        try:
            self.broadcast_state(variables)
        except (tf.errors.OpError, OSError, TimeoutError) as err:  # a member died (OSError:
            # its store refused the wire-up); a member now, it agrees at the admission's step
            self.recover_and_share(err, decision["steps"], lambda: variables)
        log.warning("tfdist_ext: worker %d joined at step %d (epoch %d, batch %d).",
                    self.me, decision["steps"], decision["epoch"], decision["batch"])
        return decision

    def change(self, generation, members):
        """Goes on as a member of `members` (generation `generation`)."""
        was_chief = self.members[0] == self.me and not self.joining
        rank, chief = membership.position(members, self.me), members[0] == self.me
        self.state_root = membership.position(members, members[0])
        with self._lock:
            self.generation, self.members = generation, members
            self._strategy.reconfigure_workers(rank, len(members), generation, self._meeting(),
                                               chief=chief)
        self._split[0].assign(rank)
        self._split[1].assign(len(members))
        if self.stragglers is not None:
            self.stragglers.reset()
        if chief and not was_chief:
            log.warning("tfdist_ext: worker %d is now the chief (it writes the checkpoints).",
                        self.me)
            for callback in list(self._on_promotion):
                callback()

    def _alive_again(self, workers):
        """Forgets reported deaths of `workers` (replacements now); watches them again."""
        with self._lock:
            self._reported_dead = {w: k for w, k in self._reported_dead.items() if w not in workers}
        for worker in workers:  # TF's channel may fail a while; a dead store will not
            liveness.rewatch(liveness.task_name("worker", worker), self._addresses[worker],
                             alive=functools.partial(health.store_answers, self._stores[worker]))

    def _meeting(self):  # the members' store, for the wire-up of new communicators
        def check():  # fails a wait for a member found dead (it never publishes its address)
            with self._lock:
                dead = sorted(set(self._reported_dead) & set(self.members))
            if dead:
                raise tf.errors.UnavailableError(None, None, (
                    f"tfdist_ext: worker(s) {dead} died while the members wired up "
                    f"generation {self.generation}'s communicators."))
        return store.Client(self._stores[self.members[0]], check)

    def kv(self, leader=None):  # the members' meeting place: `leader`'s (or the chief's) store
        return store.Client(self._stores[self.members[0] if leader is None else leader])

    @contextlib.contextmanager
    def on_promotion(self, callback):
        """Within the context, `callback()` runs if this worker becomes the chief."""
        self._on_promotion.append(callback)
        try:
            yield
        finally:
            self._on_promotion.remove(callback)

    def data_split(self):
        """(rank, members): int64 variables; Keras' input splits by them (`local_input`)."""
        return self._split

    def look_again(self) -> bool:
        """A replacement not yet admitted: whether the members changed since it `found` them
        (`joining.members_now`); if so, updates `found` and their stores (`check_fit`)."""
        now = joining.members_now(self._prefix, self.me, self._addresses)
        if now is None or now[0] == self.found:
            return False
        self.found, self.found_fit = now[0], now[2]
        self._stores.update(now[1])
        joining.check_fit(self.me, self.fit, self.found_fit)
        return True

    def abort_communicators(self, reason: str, task: str) -> bool:
        """Fails the collectives in flight (not communicators made later) if `task`, from
        the watcher, is another member (a replacement not yet admitted only notes it: its
        `rehearsal` meets no peer), or is this worker, frozen and removed (`fencing`).
        Returns whether another member's death failed them."""
        dead = {w for w in self._addresses if liveness.task_name("worker", w) == task}
        if self.me in dead:
            try:
                fencing.check_not_frozen(self.me, self.generation,
                                         liveness.frozen_seconds() or 0.0, self._running)
            except membership.MembershipError as removed:
                self.frozen = removed
                ucx_aborts.abort(reason, later=False)
            return False
        kind = health.UNREACHABLE if liveness.UNREACHABLE in reason else health.GONE
        with self._lock:
            self._reported_dead.update((w, kind) for w in dead)
            member = bool(dead & set(self.members)) and not self.joining
            if member:
                ucx_aborts.abort(reason, later=False)
        return member

    def between_steps(self, run, alone):
        """`run()`, an eager collective outside Keras' step functions (Keras reading its
        metrics at an epoch end); after a death in it the survivors agree and this worker
        returns `alone()` (running `run` again could pair with another survivor's next
        collective); the next step broadcasts `state_root`'s state (`state_stale`). A
        replacement not yet admitted (no members to agree with) raises the error."""
        try:
            return run()
        except tf.errors.OpError as err:
            if self.joining:
                raise
            self.recover(err, self.steps)
            self.state_stale = True
            return alone()

    def _running(self):  # the members' state as the others answer it (`fencing`)
        others = [self._addresses[w] for w in self.members if w != self.me]
        return fencing.members_state(self._prefix, others, beacon.running_job)

    def dead_members(self, workers=None) -> Dict[int, str]:
        """Members (or `workers`) but this one that do not answer (`health`)."""
        with self._lock:
            known = dict(self._reported_dead)
        return health.dead_members(self.members if workers is None else workers, self.me,
                                   self._stores, known)

    def recover(self, error: Exception, steps: int) -> int:
        """Goes on without the dead workers after `error` failed a training step.

        Args:
            error: What the failed step raised.
            steps: Training steps this worker ran in this `fit`, the failed one included.

        Returns:
            Steps this worker must skip to be level with the others.

        Raises:
            The `error` itself when no member is dead (not a failure this handles);
            `membership.MembershipError` when the survivors cannot agree or are fewer
            than `min_workers`. A member that dies during the agreement (the leader,
            whose store is the meeting place) makes the others agree again, up to
            `RECOVERY_ATTEMPTS` times.
        """
        start, last = time.monotonic(), error
        for attempt in range(RECOVERY_ATTEMPTS):
            if self.frozen is not None:
                raise self.frozen
            dead = self.dead_members()
            if not dead:
                raise last
            try:
                return self._recover_once(error, steps, dead, start)
            except (membership.LeaderLost, OSError, TimeoutError) as again:
                if attempt + 1 == RECOVERY_ATTEMPTS:
                    raise
                log.warning("tfdist_ext: worker %d: another death during the recovery (%s); "
                            "the survivors agree again.", self.me,
                            " ".join(str(again).split())[:200])
                last = again
        raise AssertionError("unreachable")

    def recover_and_share(self, error, steps, variables, rebuild=lambda: None) -> int:
        """`recover`, `rebuild()`, then the state to everyone (`broadcast_state`
        of `variables()`); a death in the broadcast makes the survivors agree again, up
        to `RECOVERY_ATTEMPTS` times. Returns the steps to skip (as `recover`)."""
        for attempt in range(RECOVERY_ATTEMPTS):
            skip = self.recover(error, steps)
            rebuild()
            try:
                self.broadcast_state(variables())
                return skip
            except (tf.errors.OpError, OSError, TimeoutError) as again:  # another death
                if attempt + 1 == RECOVERY_ATTEMPTS:
                    raise
                error = again
        raise AssertionError("unreachable")

    def next_generation(self) -> int:
        """The generation of the next membership change: one past any this worker tried,
        so that survivors whose last attempt failed at different points meet alike."""
        self._attempted = max(self.generation, self._attempted) + 1
        return self._attempted

    def _recover_once(self, error, steps, dead, start):
        alive = membership.survivors(self.members, dead)
        fencing.check_quorum(self.me, self.members, alive,
                             [w for w, kind in dead.items() if kind == health.GONE])
        membership.check_enough(alive, dead, self.options.min_workers, self._addresses)
        generation = self.next_generation()
        meeting = self.kv(leader=alive[0])
        members, level, source = membership.agree(
            meeting.set, meeting.get, f"{self._prefix}/elastic/{generation}", self.me, alive,
            steps, self.options.recover_seconds,
            gone=lambda worker: bool(self.dead_members([worker])), holds_state=self.holds_state)
        membership.check_enough(members, set(self.members) - set(members),
                                self.options.min_workers, self._addresses)
        lost = sorted(set(self.members) - set(members))
        self.change(generation, members)
        self.state_root = membership.position(members, source)  # not a replacement's
        self.failures.append({"generation": generation, "step": steps, "dead": lost,
                              "members": list(members), "skipped": level - steps,
                              "source": source, "seconds": time.monotonic() - start,
                              "time": time.time()})
        log.warning("tfdist_ext: worker(s) %s died (%s); step %d discarded, %d worker(s) %s "
                    "go on (generation %d, %.1f s).", lost,
                    " ".join(str(error).split())[:200], steps, len(members), list(members),
                    generation, time.monotonic() - start)
        return level - steps

    def broadcast_state(self, variables):
        """Gives every member rank `state_root`'s `variables` (`state_sync.broadcast`)."""
        state_sync.broadcast(self._strategy.extended.cross_device_ops.engines.main(),
                             variables, root=self.state_root)
        self.holds_state = True
