"""The members' side of a replacement's join: hearing the request, agreeing on it.

A replacement posts its join request into every member's store
(`joining.ask`). The members' leader (the first member, the chief) watches
its own store: when a request arrives from a replacement whose store answers,
it raises `flag`, a variable every member's next training step all-reduces
(`tfdist_ext.keras.uneven`) into `agreed`. A positive `agreed` after a step
tells every member to admit the replacement after that same step
(`tfdist_ext.elastic.recovery.Recovery.admit`); the leader then `take`s the
pending requests, and after the new membership is written `notify` tells each
replacement its admission. A request from a replacement in another `fit` than the
members' is refused in its store instead (`joining.refusal`).
"""

import json
import threading
from typing import Callable, Dict, Mapping, Tuple

import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.elastic import health, joining, store

POLL_SECONDS = 0.5  # the leader looks again this often (at once for a new request)


class Requests:
    """The join requests in this worker's store, and the flag that carries them.

    Args:
        own: This worker's `store.Store`.
        prefix: The strategy's key prefix (the same on every worker).
        members: Returns the workers in the job now, the chief first.
        leads: Returns whether this worker is the members' leader now (a
            replacement not yet admitted is not).
        fit: Returns the members' fit now (`Recovery.fit`).

    Attributes:
        flag: float32 variable, 1 when this worker (the leader) saw a request
            not yet admitted.
        agreed: float32 variable, the members' sum of `flag` in the last step.
    """

    def __init__(self, own: store.Store, prefix: str, members: Callable[[], tuple],
                 leads: Callable[[], bool], fit: Callable[[], int]):
        self._store, self._key = own, f"{prefix}/join/"
        self._members, self._leads, self._fit = members, leads, fit
        self._handled = set()  # request keys admitted
        self._lock = threading.Lock()
        # Made outside any strategy scope, so that they stay this worker's own.
        with tf.init_scope():
            self.flag = _compat.ResourceVariable(0.0, trainable=False, name="elastic_join")
            self.agreed = _compat.ResourceVariable(0.0, trainable=False,
                                                   name="elastic_join_agreed")
        threading.Thread(target=self._watch, name="tfdist-elastic-joins", daemon=True).start()

    def requested(self) -> bool:
        """Whether the last step's all-reduce carried a request (every member agrees)."""
        if len(self._members()) == 1:  # no all-reduce to carry it
            return float(self.flag.numpy()) > 0
        return float(self.agreed.numpy()) > 0

    def take(self) -> Dict[int, Tuple[str, str]]:
        """The leader, at an admission: the pending requests (worker -> (request key,
        its store address)), from now on handled; lowers `flag`."""
        with self._lock:
            requests, others = self._pending(self._store.items(self._key))
            self._handled.update(key for key, _ in requests.values())
            self.flag.assign(0.0)
        self._refuse(others)
        # An old request of a replacement that died since names a dead store.
        return {w: r for w, r in requests.items() if health.store_answers(r[1])}

    def recheck(self):
        """The leader, as a fit begins: refuses the requests made in the last fit and
        lowers `flag` if none of this fit is left (it was raised after that fit's
        last step)."""
        if not self._leads():
            return
        with self._lock:
            requests, others = self._pending(self._store.items(self._key))
            if not requests:
                self.flag.assign(0.0)
        self._refuse(others)

    def settled(self, joined=()):
        """Every member, at an admission: the agreed request is being acted on, and the
        requests of the `joined` workers in this worker's store are done (were it the
        leader later, it would otherwise admit one again, naming a store that is gone)."""
        self.agreed.assign(0.0)
        joined = set(joined)
        with self._lock:
            self._handled.update(key for key in self._store.items(self._key)
                                 if joining.requester(key) in joined)

    def _pending(self, items: Mapping[str, str]):
        """(the pending requests made in the members' fit, those made in another; the
        latter from now on handled), each as `joining.pending`'s. Holds `_lock`."""
        pending = joining.pending(items, self._members(), self._handled)
        fit = self._fit()
        others = {w: r for w, r in pending.items() if joining.request_fit(r[0]) != fit}
        self._handled.update(key for key, _ in others.values())
        return {w: r for w, r in pending.items() if w not in others}, others

    def _refuse(self, others: Mapping[int, Tuple[str, str]]):
        fit = self._fit()
        for worker, (key, address) in others.items():
            answer = {"refused": joining.refusal(worker, joining.request_fit(key), fit)}
            try:
                store.Client(address).set(joining.admitted_key(key), json.dumps(answer))
            except OSError:
                pass  # it died

    def _watch(self):
        seen = 0
        while True:
            items = self._store.items(self._key, seen, POLL_SECONDS)
            seen = len(items)
            if not self._leads():
                continue
            with self._lock:
                pending, others = self._pending(items)
            self._refuse(others)
            # An old request of a replacement that died since names a dead store.
            if any(health.store_answers(address) for _, address in pending.values()):
                with self._lock:  # not admitted while this looked
                    pending, others = self._pending(items)
                    if pending:
                        self.flag.assign(1.0)
                self._refuse(others)


def notify(requests: Mapping[int, Tuple[str, str]], decision: dict):
    """Writes the admission `decision` into each requesting replacement's store."""
    for key, address in requests.values():
        try:
            store.Client(address).set(joining.admitted_key(key), json.dumps(decision))
        except OSError:
            pass  # it died: the state broadcast fails and the members recover
