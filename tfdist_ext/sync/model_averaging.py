"""Crossbow-style synchronous model averaging (SMA) with several learners per replica.

    Strategy(sync=ModelAveraging(learners_per_device=2))

Reference: Koliousis, Watcharapichat, Weidlich, Mai, Costa, Pietzuch,
"Crossbow: Scaling Deep Learning with Small Batch Sizes on Multi-GPU Servers",
VLDB 2019, section 3 (SMA).

Each replica runs k learners, each a full copy of the model trained on its own
1/k slice of the replica's batch (a small batch). With K = N * k learners in
all, central average model z and its previous value z_prev, every step does,
for each learner j (all with the same z):

    c_j  = alpha * (w_j - z)                          correction
    w_j <- w_j - lr * grad_j(w_j) - c_j               learner step, pulled toward z
    z   <- z + sum_j c_j + momentum * (z - z_prev)    (sum over all K learners)

which costs one all-reduce of the model per step (sum_j c_j). The model's own
variables hold z: it is what `fit` evaluates, checkpoints and saves; learner
weights are extra variables in `Strategy.state` (checkpointed with it).

Implementation: the wrapped train step loads learner j's weights into the
model's variables, runs Keras' own train step on slice j (so losses, metrics
and the user's optimizer apply unchanged; the learner step is the optimizer's
update with the replica's own gradient, whose state is shared by the replica's
learners), stores the result back, and finally writes z. The batch is split
in contiguous slices: learner j gets rows [j * B // k, (j + 1) * B // k).
`optimizer.iterations` still counts batches.

Defaults for the user's optimizer: Crossbow's learners use plain SGD with the
momentum on the central model (0.9). With SGD + momentum the learners'
updates already carry momentum, and a second one on z compounds it, so the
central momentum is 0 then (`central_momentum`, chosen at the first step and
logged). Each learner's optimizer steps on the gradient of 1 / (N k) of the
global batch; an optimizer that normalizes the gradient (Adam, RMSprop, ...)
gets its learning rate multiplied by sqrt(N k) (`sqrt_lr_scaling`,
`tfdist_ext.sync.lr_scaling`), plain and momentum SGD none.

Tuning: alpha defaults to 1 / K (the paper's choice). One learner per replica
(the default) keeps synchronous training's accuracy with SGD, momentum SGD
and Adam at its learning rate; more learners (the point of Crossbow on a
GPU, k = 2-4) split the replica's batch into small ones, which needs the
learning rate of synchronous training at that small batch and costs
accuracy with BatchNormalization (the modes matrix in docs/results.md).
"""

import dataclasses
import logging
import threading
from typing import Optional

import tensorflow as tf

from tfdist_ext import _compat
from tfdist_ext.registry import boolean, positive_int
from tfdist_ext.sync import local_sgd
from tfdist_ext.sync.base import SYNC_POLICIES, SyncPolicy
from tfdist_ext.sync.runner import PolicyRunner, tf_variable

log = logging.getLogger("tfdist_ext")
CROSSBOW_MOMENTUM = 0.9  # the central model's momentum in Crossbow, for plain-SGD learners


@SYNC_POLICIES.register("model_averaging")
@dataclasses.dataclass(frozen=True)
class ModelAveraging(SyncPolicy):
    """k learners per replica, corrected toward a central model with momentum.

    Args:
        learners_per_device: k >= 1 learners per replica.
        alpha: Correction strength in (0, 1]; None means 1 / (total learners).
        momentum: Momentum of the central model in [0, 1); None: 0.9, or 0
            when the optimizer is SGD with momentum (`central_momentum`).
        sqrt_lr_scaling: Multiply a normalizing optimizer's learning rate
            by sqrt(N k) (module doc); False keeps it as given.
    """

    learners_per_device: int = 1
    alpha: Optional[float] = None
    momentum: Optional[float] = None
    sqrt_lr_scaling: bool = True
    communicates = "model corrections every step"
    divergence_advice = "lower `momentum` (e.g. 0.5), `learners_per_device` or the learning rate"

    def __post_init__(self):
        positive_int("learners_per_device", self.learners_per_device)
        if self.alpha is not None and not (isinstance(self.alpha, (int, float))
                                           and 0 < self.alpha <= 1):
            raise ValueError(f"Argument `alpha` must be in (0, 1] or None (1 / total "
                             f"learners); received {self.alpha!r}.")
        if self.momentum is not None and not (
                isinstance(self.momentum, (int, float)) and not isinstance(self.momentum, bool)
                and 0 <= self.momentum < 1):
            raise ValueError(f"Argument `momentum` must be in [0, 1) or None (0.9, or 0 with "
                             f"SGD + momentum); received {self.momentum!r}.")
        boolean("sqrt_lr_scaling", self.sqrt_lr_scaling)

    def central_momentum(self, optimizer) -> float:
        """The central model's momentum: `momentum`, or chosen from `optimizer` if None."""
        if self.momentum is not None:
            return float(self.momentum)
        inner = local_sgd.sgd_momentum(optimizer)
        chosen = 0.0 if inner > 0 else CROSSBOW_MOMENTUM
        log.info("tfdist_ext: sync=%r: central momentum %g, chosen for the %s%s (pass "
                 "momentum= to set it).", self.name, chosen,
                 type(getattr(optimizer, "inner_optimizer", optimizer)).__name__,
                 f" with momentum {inner:g}" if inner else "")
        return chosen

    def runner(self, strategy):
        return _ModelAveragingRunner(strategy, self)


class _ModelAveragingRunner(PolicyRunner):
    worker_local_logs = False  # one all-reduce per step anyway

    def __init__(self, strategy, policy):
        super().__init__(strategy)
        self.k = policy.learners_per_device
        self.alpha = policy.alpha or 1.0 / (self.k * self.world_size)
        self.policy = policy
        self.momentum = None  # the central momentum, resolved at the first traced step
        self._lock = threading.Lock()
        self.learners = {}  # (variable index) -> [replica][learner] variables
        self.previous = {}  # (variable index) -> [replica] z_prev
        with _compat.init_scope(), tf.device(self.cross_ops.devices[0]):
            self.rounds = _compat.ResourceVariable(tf.constant(0, tf.int64), trainable=False,
                                                   name="model_averaging_rounds")
        strategy.state.sync_rounds = self.rounds
        strategy.state.learners = self.learners
        strategy.state.previous = self.previous

    def _copies(self, index, variable):
        """Learner and z_prev variables of `variable` on every local replica."""
        index = f"v{index}"  # string keys: tf.Module checkpoints dicts by key
        with self._lock:
            if index not in self.learners:
                learners, previous = [], []
                with _compat.init_scope():
                    for r, component in enumerate(variable.values):
                        with tf.device(component.device):
                            value = component.read_value()
                            learners.append([_compat.ResourceVariable(
                                value, trainable=False, name=f"learner{j}_{index}_{r}")
                                for j in range(self.k)])
                            previous.append(_compat.ResourceVariable(
                                value, trainable=False, name=f"z_prev_{index}_{r}"))
                self.learners[index] = learners
                self.previous[index] = previous
        return self.learners[index], self.previous[index]

    def wrap_train_step(self, model, train_step):
        def learners_step(data):
            return self._step(model, train_step, data)

        return learners_step

    def update_step(self, optimizer, grads, variables, learning_rate):
        """A learner's local step, at the square-root scaled rate (module doc)."""
        super().update_step(optimizer, grads, variables, self.sqrt_scaled(
            optimizer, learning_rate, self.world_size * self.k, self.policy.sqrt_lr_scaling))

    def _step(self, model, train_step, data):
        if self.momentum is None:
            self.momentum = self.policy.central_momentum(model.optimizer)
        model_variables = [tf_variable(v) for v in model.trainable_variables]
        replica = self.local_index()
        copies = [self._copies(i, v) for i, v in enumerate(model_variables)]
        z = [tf.identity(v) for v in model_variables]
        corrections = [tf.zeros_like(t) for t in z]
        logs = None
        for j in range(self.k):
            learner = [learners[replica][j] for learners, _ in copies]
            old = [tf.identity(w) for w in learner]
            pulls = [tf.cast(self.alpha, w.dtype) * (w - c) for w, c in zip(old, z)]
            loads = [v.assign(w) for v, w in zip(model_variables, old)]
            with tf.control_dependencies(loads):
                logs = train_step(_slice(data, j, self.k))
            with tf.control_dependencies(tf.nest.flatten(logs)):
                stores = [w.assign(tf.identity(v) - p)
                          for w, v, p in zip(learner, model_variables, pulls)]
            with tf.control_dependencies(stores):
                corrections = [c + p for c, p in zip(corrections, pulls)]
        total = self.all_reduce_dense(_compat.ReduceOp.SUM, corrections)
        updates = []
        for v, zc, t, (_, previous) in zip(model_variables, z, total, copies):
            momentum = tf.cast(self.momentum, zc.dtype)
            z_new = zc + t + momentum * (zc - previous[replica])
            with tf.control_dependencies([z_new]):
                updates.append(previous[replica].assign(zc))
            updates.append(v.assign(z_new))
        if self.k > 1:
            updates.append(model.optimizer.iterations.assign_sub(self.k - 1))
        if replica == 0:
            updates.append(self.rounds.assign_add(1))
        with tf.control_dependencies(updates):
            return tf.nest.map_structure(tf.identity, logs)

    def drain(self, model):
        """Averages the BatchNorm statistics (the variables already hold the central model)."""
        self.average_buffers(model)

    def stats(self):
        return {"sync_rounds": int(self.rounds.numpy())}


def _slice(data, j, k):
    """Rows [j * B // k, (j + 1) * B // k) of every batched tensor in `data`."""
    first = next(t for t in tf.nest.flatten(data) if t is not None)
    batch = tf.shape(first)[0]
    start, end = (j * batch) // k, ((j + 1) * batch) // k
    return tf.nest.map_structure(lambda t: None if t is None else t[start:end], data)
