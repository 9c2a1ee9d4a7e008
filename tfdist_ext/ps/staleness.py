"""Which pushed gradient a parameter server may apply next (pure, no TensorFlow).

The staleness of a gradient is the number of updates the server applied
between the moment its worker received the parameters it was computed on
and the moment it is applied (the tau of w_{t+1} = w_t - eta G_{t - tau}).
Without a bound, gradients are applied in arrival order. With a bound s, a
gradient is applied only if it is at most s old and, afterwards, the other
active workers could still all be applied within s, oldest first (the j-th
oldest, pulled at version p_j, at version V + j: V + j - p_j <= s). A fast
worker's push therefore waits while a slower one would otherwise fall
behind (stale-synchronous parallel on a parameter server, in update units).
Every worker starts from the same version, so the last of the first N
pushes has staleness N - 1: the bound must be at least N - 1.

A worker that rests (evaluation, the barrier at the end of `fit`) does not
hold the others back; a gradient it pushes afterwards that is already older
than the bound is refused (`next` returns it as `DROP`), and the worker
receives the current parameters instead.
"""

from typing import Dict, Iterable, Optional


class Admission:
    """The version counter and each worker's pulled version.

    Args:
        bound: Largest staleness a gradient may have when applied, or None.
    """

    def __init__(self, bound: Optional[int] = None):
        self.bound = bound
        self.version = 0
        self._pulled: Dict[int, int] = {}  # worker -> version it computes on
        self._resting = set()

    def pulled(self, worker: int, rest: bool = False) -> None:
        """`worker` received the current parameters; with `rest` it pauses."""
        self._pulled[worker] = self.version
        if rest:
            self._resting.add(worker)
        else:
            self._resting.discard(worker)

    def rest(self, worker: int) -> None:
        """`worker` pauses (it pushes nothing until it is sent parameters again)."""
        self._resting.add(worker)

    def wake(self, worker: int) -> None:
        """`worker` pushed: it holds the others back again."""
        self._resting.discard(worker)

    def staleness(self, worker: int) -> int:
        """Updates applied since `worker` pulled (its gradient's staleness if applied now)."""
        return self.version - self._pulled[worker]

    def _safe_after(self, worker: int) -> bool:
        active = sorted(v for w, v in self._pulled.items()
                        if w != worker and w not in self._resting)
        return all(self.version + j - v <= self.bound for j, v in enumerate(active, 1))

    def next(self, pending: Iterable[int]):
        """(worker, apply) for the pending gradient to handle now, or None to wait.

        `apply` is False for a gradient to refuse (older than the bound).

        Args:
            pending: Workers whose pushed gradients wait, in arrival order.
        """
        pending = [w for w in pending if w in self._pulled]
        if not pending:
            return None
        if self.bound is None:
            return pending[0], True
        for worker in pending:
            if self.staleness(worker) > self.bound:
                return worker, False
        for worker in sorted(pending, key=lambda w: self._pulled[w]):  # oldest first
            if self._safe_after(worker):
                return worker, True
        return None

    def applied(self, worker: int) -> int:
        """Records `worker`'s gradient as applied; returns its staleness.

        The worker then receives the new parameters (its next pull version).
        """
        staleness = self.staleness(worker)
        self.version += 1
        self.pulled(worker)
        return staleness
