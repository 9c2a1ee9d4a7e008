"""Local SGD: every replica steps on its own; parameters are averaged every H steps.

    Strategy(sync=LocalSGD(period=4, warmup_steps=100))

Reference: Lin, Stich, Patel, Jaggi, "Don't Use Large Mini-Batches, Use Local
SGD", ICLR 2020 (post-local SGD is `warmup_steps` > 0); Stich, "Local SGD
Converges Fast and Communicates Little", ICLR 2019.

Step t (0-based, `optimizer.iterations`):
    * t < warmup_steps: synchronous SGD (gradients all-reduced, as "sync");
    * otherwise each replica applies its own gradient (the mean over its own
      batch) with its own optimizer state;
    * after the update of every step with (t + 1) % period == 0, trainable
      variables are replaced by their average over all replicas: one
      all-reduce of the model per `period` steps instead of one of the
      gradients per step.

Optimizer slots (momentum, Adam moments) are averaged with the parameters by
default (`average_slots=True`): without it each replica's momentum drifts with
its own gradients and the averaged model moves with none of them.
`average_slots=False` keeps them local, as PyTorch's PostLocalSGDOptimizer
does, for half the traffic per round. Non-trainable variables (BatchNorm
statistics) stay local between averages and are averaged at epoch ends.

With a compressor (`Strategy(sync="local_sgd", compression="powersgd")`)
a round sends the change since the last average instead of the parameters:
every replica keeps the averaged values of the last round (the anchor a,
the same everywhere) and the round computes

    d_r = a - w_r                       (the pseudo-gradient of replica r)
    w = a - compress-and-sum(d_r) / N   (error feedback per replica)
    a = w

for the parameters. With a lossless compressor this is the plain average.
Optimizer slots (with `average_slots`) are averaged uncompressed: error
feedback on momentum makes training diverge (the delayed momentum is applied
again through the parameters). The compressor's warm-up counts rounds, and
the warm-up steps of the policy all-reduce gradients through the same
compressor.

Each replica's optimizer steps on the gradient of its own batch (1 / N of
the global one). With an optimizer that normalizes the gradient (Adam,
RMSprop, ...) the learning rate of the local steps is multiplied by sqrt(N)
(`sqrt_lr_scaling`, `tfdist_ext.sync.lr_scaling`), so the averaged model
moves as synchronous training's does; SGD needs no change.

Tuning: H = 2-8 keeps accuracy close to synchronous SGD for small models;
larger H saves more but needs a warm-up of synchronous steps (a few epochs)
and a smaller learning rate. With plain SGD and H = 1, local SGD equals
synchronous SGD.
"""

import dataclasses
import logging

import keras
import tensorflow as tf

from tfdist_ext import _compat, reductions
from tfdist_ext.compression import NoCompression
from tfdist_ext.registry import boolean, positive_int
from tfdist_ext.sync.base import SYNC_POLICIES, SyncPolicy
from tfdist_ext.sync.runner import PolicyRunner, dense_gradients, tf_variable

log = logging.getLogger("tfdist_ext")

OUTER_OPTIMIZERS = ("none", "sgd", "nesterov")
PAPER_OUTER = (0.7, 0.9)  # DiLoCo's outer (learning rate, momentum), for adaptive inner steps
MOMENTUM_OUTER = (0.7, 0.3)  # lr / (1 - m) = 1: for inner SGD with momentum


def sgd_momentum(optimizer) -> float:
    """The momentum of `optimizer` if it is Keras' SGD (also inside a
    LossScaleOptimizer), else 0.0 (any other optimizer, or None)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(inner, keras.optimizers.SGD):
        return float(inner.momentum or 0.0)
    return 0.0


def outer_settings(policy, optimizer):
    """The outer step's (learning rate, momentum): the policy's, or chosen from `optimizer`.

    None in `outer_learning_rate` / `outer_momentum` means: DiLoCo's 0.7 / 0.9
    (`PAPER_OUTER`, Douillard et al. 2023, measured there with AdamW inner steps)
    unless the inner optimizer is SGD with momentum, whose steps already carry
    momentum between rounds; then 0.7 / 0.3 (`MOMENTUM_OUTER`). In steady
    state a Nesterov outer step moves lr / (1 - m) times the averaged change:
    7x for 0.7 / 0.9, on top of the 1 / (1 - 0.9) = 10x that inner momentum
    0.9 already applies, which diverges; 0.7 / 0.3 moves 1x (the slow momentum
    of SlowMo, Wang, Tantia, Ballas, Rabbat, ICLR 2020, which also runs
    momentum SGD inside, smooths rounds without amplifying them).
    """
    rate, momentum = policy.outer_learning_rate, policy.outer_momentum
    if rate is not None and momentum is not None:
        return float(rate), float(momentum)
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer
    inner_momentum = sgd_momentum(optimizer)
    chosen = MOMENTUM_OUTER if inner_momentum > 0 else PAPER_OUTER
    rate = chosen[0] if rate is None else float(rate)
    momentum = chosen[1] if momentum is None else float(momentum)
    log.info("tfdist_ext: sync=%r: outer %s step with learning rate %g, momentum %g, chosen "
             "for the inner %s%s (pass outer_learning_rate= and outer_momentum= to set them).",
             policy.name, policy.outer_optimizer, rate, momentum, type(inner).__name__,
             f" with momentum {inner_momentum:g}" if inner_momentum else "")
    return rate, momentum


@SYNC_POLICIES.register("local_sgd")
@dataclasses.dataclass(frozen=True)
class LocalSGD(SyncPolicy):
    """Average parameters every `period` steps (after `warmup_steps` synchronous ones).

    Args:
        period: H >= 1, steps between averaging rounds.
        warmup_steps: Synchronous steps first (>= 0).
        average_slots: Average the optimizer's slot variables too.
        outer_optimizer: How a round moves the parameters by the averaged
            change D = mean_r(a - w_r) since the last round: "none" (a -= D,
            the plain average), "sgd" (v = m v + D; a -= lr v) or "nesterov"
            (v = m v + D; a -= lr (D + m v)), as in DiLoCo (`sync="diloco"`).
            The outer momentum v is per parameter, the same on every replica
            and in the strategy state (checkpointed).
        outer_learning_rate: lr above, > 0, or None: chosen from the inner
            optimizer at the first step (`outer_settings`).
        outer_momentum: m above, in [0, 1), or None (as `outer_learning_rate`).
        sqrt_lr_scaling: Multiply the learning rate of the local steps by
            sqrt(N) when the optimizer normalizes the gradient
            (`tfdist_ext.sync.lr_scaling`); plain averaging only (an outer
            optimizer's settings are tuned for the inner steps as given).
    """

    period: int = 4
    warmup_steps: int = 0
    average_slots: bool = True
    outer_optimizer: str = "none"
    outer_learning_rate: float = 1.0
    outer_momentum: float = 0.0
    sqrt_lr_scaling: bool = True
    communicates = "parameters every `period` steps"
    divergence_advice = ("lower `period` (e.g. 2) or add `warmup_steps` (an epoch of "
                         "synchronous steps)")

    def __post_init__(self):
        positive_int("period", self.period)
        positive_int("warmup_steps", self.warmup_steps, minimum=0)
        boolean("average_slots", self.average_slots)
        boolean("sqrt_lr_scaling", self.sqrt_lr_scaling)
        if self.outer_optimizer not in OUTER_OPTIMIZERS:
            raise ValueError(
                f"Argument `outer_optimizer` must be one of "
                f"{', '.join(repr(o) for o in OUTER_OPTIMIZERS)}; received "
                f"{self.outer_optimizer!r}. 'nesterov' is DiLoCo's outer step, 'none' the "
                "plain average.")
        rate, momentum = self.outer_learning_rate, self.outer_momentum
        if (rate is None or momentum is None) and self.outer_optimizer == "none":
            raise ValueError("Arguments `outer_learning_rate` and `outer_momentum` may be None "
                             "(chosen from the optimizer) only with an outer optimizer; "
                             "received outer_optimizer='none'. Pass outer_optimizer='nesterov' "
                             "or numbers.")
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                 or not rate > 0):
            raise ValueError(f"Argument `outer_learning_rate` must be a number > 0 (or None: "
                             f"chosen from the optimizer); received {rate!r}. DiLoCo uses "
                             "0.7; 1.0 with outer_momentum=0 is the plain average.")
        if momentum is not None and (isinstance(momentum, bool)
                                     or not isinstance(momentum, (int, float))
                                     or not 0 <= momentum < 1):
            raise ValueError(f"Argument `outer_momentum` must be in [0, 1) (or None: chosen "
                             f"from the optimizer); received {momentum!r}. DiLoCo uses 0.9 "
                             "(0.3 with inner momentum SGD).")

    @property
    def sends_changes(self) -> bool:
        """Whether rounds go through the parameter changes (always with an outer step)."""
        return self.outer_optimizer != "none" or self.outer_learning_rate != 1

    def check_compression(self, compressor) -> None:
        """Every compressor applies to the plain average's changes but DGC momentum correction.

        An outer optimizer (DiLoCo) takes no compressor yet, nor does
        "adaptive" (its controller times per-step gradient all-reduces).
        """
        if getattr(compressor, "name", None) == "adaptive":
            raise ValueError(
                f"Arguments `sync` and `compression` conflict: compression='adaptive' "
                f"times the per-step gradient all-reduce, which sync={self.name!r} does not "
                "do. Name a compressor (e.g. compression='powersgd'), or use sync='sync' "
                "with compression='adaptive'.")
        if self.sends_changes and not isinstance(compressor, NoCompression):
            raise ValueError(
                f"Arguments `sync` and `compression` conflict: compressing the outer "
                f"gradients of sync={self.name!r} (outer_optimizer="
                f"{self.outer_optimizer!r}) is not supported yet (error feedback under "
                "outer momentum diverges). Use sync='local_sgd' with compression="
                f"{getattr(compressor, 'name', type(compressor).__name__)!r}, or "
                f"sync={self.name!r} uncompressed.")
        if compressor.momentum:
            raise ValueError(
                f"Arguments `sync` and `compression` conflict: sync={self.name!r} sends "
                "parameter changes, to which DGC momentum correction (compression "
                f"momentum={compressor.momentum!r}) does not apply. Set the compressor's "
                "momentum to 0 and keep the optimizer's momentum.")

    def runner(self, strategy):
        return _LocalSGDRunner(strategy, self)


class _LocalSGDRunner(PolicyRunner):

    def __init__(self, strategy, policy):
        super().__init__(strategy)
        self.policy = policy
        with _compat.init_scope(), tf.device(self.cross_ops.devices[0]):
            self.rounds = _compat.ResourceVariable(tf.constant(0, tf.int64), trainable=False,
                                                   name="local_sgd_rounds")
        strategy.state.sync_rounds = self.rounds
        self.sends_changes = (not isinstance(strategy.config.compression, NoCompression)
                             or policy.sends_changes)  # anchors and changes, not values
        self._anchored = []  # the variables whose anchors exist, in key order
        self.outer = None  # (learning rate, momentum), resolved at the first traced step
        self._num_slots = 0  # the averaged slots come last in the averaged list

    def update_step(self, optimizer, grads, variables, learning_rate):
        if self.outer is None:
            self.outer = outer_settings(self.policy, optimizer)
        grads = dense_gradients(grads)
        step = tf.cast(optimizer.iterations, tf.int64)
        scale = float(self.world_size)
        local = [g * tf.cast(scale, g.dtype) for g in grads]
        if self.policy.warmup_steps:
            replica = tf.distribute.get_replica_context()
            grads = replica.merge_call(self._warmup_merge, args=(step, grads, local))
        else:
            grads = local
        scaled = self.sqrt_scaled(optimizer, learning_rate, self.world_size,
                                  self.policy.sqrt_lr_scaling and not self.policy.sends_changes)
        if self.lr_factor != 1.0:
            learning_rate = (tf.where(step < self.policy.warmup_steps, learning_rate, scaled)
                             if self.policy.warmup_steps else scaled)
        self.apply(optimizer, grads, variables, learning_rate)
        averaged = list(variables)
        slots = _compat.optimizer_slots(optimizer) if self.policy.average_slots else []
        self._num_slots = len(slots)
        averaged += slots
        tf_variables = [tf_variable(v) for v in averaged]
        tf.distribute.get_replica_context().merge_call(
            self._average_merge, args=(step, tf_variables))

    def _warmup_merge(self, strategy, step, grads, local):
        step = strategy.experimental_local_results(step)[0]  # equal on all replicas
        # In cross-replica context (docs/tf_internals.md): every replica takes
        # the same branch, so the all-reduce in it is issued by all or none.
        def reduced():
            return strategy.extended.batch_reduce_to(
                _compat.ReduceOp.SUM, [(g, g) for g in grads])

        return _per_replica_cond(strategy, step < self.policy.warmup_steps, reduced,
                                 lambda: local)

    def _average_merge(self, strategy, step, variables):
        step = strategy.experimental_local_results(step)[0]  # equal on all replicas
        parameters = variables[:len(variables) - self._num_slots]
        slots = variables[len(parameters):]

        def average():
            if self.sends_changes:
                updates = self._pseudo_gradient_round(strategy, parameters)
                if slots:
                    updates += self._dense_average(strategy, slots)
            else:
                updates = self._dense_average(strategy, variables)
            with tf.control_dependencies(updates):
                return self.rounds.assign_add(1)

        due = tf.logical_and(step >= self.policy.warmup_steps,
                             (step + 1) % self.policy.period == 0)
        idle = self.rounds.read_value
        if self.sends_changes and self.policy.warmup_steps:
            def follow():  # synchronous steps move the anchors along
                with tf.control_dependencies(self._reset_anchors(strategy, parameters)):
                    return self.rounds.read_value()

            idle = lambda: tf.cond(step < self.policy.warmup_steps, follow,  # noqa: E731
                                   self.rounds.read_value)
        return tf.cond(due, average, idle)

    def _dense_average(self, strategy, variables):
        """Assignments of the plain average (uncompressed), its bytes counted."""
        means = strategy.extended.batch_reduce_to(
            _compat.ReduceOp.MEAN, [(v, v) for v in variables],
            options=reductions.options(reductions.DENSE))
        updates = [v.assign(m) for v, m in zip(variables, means)]
        sent = sum(self.cross_ops.wire.dense(v.shape.num_elements(), v.dtype)
                   for v in variables)
        updates.append(self.cross_ops.state.count(sent, sent, reductions=0))
        return updates

    def _anchors(self, strategy, variables):
        """Per variable, the list of its local replicas' anchor variables (flat)."""
        anchors = []
        for j, variable in enumerate(variables):
            components = strategy.experimental_local_results(variable)
            n = components[0].shape.num_elements()
            initial = lambda c=components[0]: tf.reshape(c.read_value(), [-1])  # noqa: E731
            anchors.append([self.strategy.state.buffer(f"local_sgd_anchor_{j}", i, n,
                                                       components[0].dtype, initial=initial)
                            for i in range(len(components))])
        self._anchored = list(variables)
        return anchors

    def _pseudo_gradient_round(self, strategy, variables):
        """Parameters: w = a - outer(compress-and-sum(a - w_r) / N); a = w (module docstring)."""
        anchors = self._anchors(strategy, variables)
        deltas = []
        for variable, mine in zip(variables, anchors):
            components = strategy.experimental_local_results(variable)
            deltas.append(_compat.PerReplica([
                tf.reshape(a.read_value(), c.shape) - c.read_value()
                for a, c in zip(mine, components)]))
        sums = strategy.extended.batch_reduce_to(
            _compat.ReduceOp.SUM, [(d, d) for d in deltas],
            options=reductions.options(reductions.PSEUDO_GRADIENTS))
        updates = []
        for j, (variable, mine, summed) in enumerate(zip(variables, anchors, sums)):
            components = strategy.experimental_local_results(variable)
            for i, (a, c, total) in enumerate(
                    zip(mine, components, strategy.experimental_local_results(summed))):
                with tf.device(c.device):
                    change = tf.reshape(total / tf.cast(self.world_size, total.dtype), [-1])
                    change, outer_updates = self._outer_step(j, i, change)
                    updates += outer_updates
                    new = a.read_value() - change
                    updates += [c.assign(tf.reshape(new, c.shape)), a.assign(new)]
        return updates

    def _outer_step(self, j, replica, change):
        """The step the outer optimizer takes for averaged change D of parameter j."""
        policy = self.policy
        if policy.outer_optimizer == "none":
            step = change
            updates = []
        else:
            velocity = self.strategy.state.buffer(f"local_sgd_outer_{j}", replica,
                                                  change.shape.num_elements(), change.dtype)
            momentum = tf.cast(self.outer[1], change.dtype)
            new_velocity = momentum * velocity.read_value() + change
            step = new_velocity if policy.outer_optimizer == "sgd" else (
                change + momentum * new_velocity)
            updates = [velocity.assign(new_velocity)]
        return tf.cast(self.outer[0], change.dtype) * step, updates

    def _reset_anchors(self, strategy, variables):
        """Anchors := this replica's current values (all equal when this is called)."""
        updates = []
        for variable, mine in zip(variables, self._anchors(strategy, variables)):
            for a, c in zip(mine, strategy.experimental_local_results(variable)):
                updates.append(a.assign(tf.reshape(c.read_value(), [-1])))
        return updates

    def drain(self, model):
        """Averages the parameters (base class), then re-anchors them there."""
        super().drain(model)
        if self.sends_changes and self._anchored:
            self._reset_anchors(self.strategy, self._anchored)

    def stats(self):
        return {"sync_rounds": int(self.rounds.numpy())}


def _per_replica_cond(strategy, predicate, true_fn, false_fn):
    """`tf.cond` over lists of per-replica values (cross-replica context)."""

    def components(values):
        return [c for v in values for c in strategy.experimental_local_results(v)]

    flat = tf.cond(predicate, lambda: components(true_fn()), lambda: components(false_fn()))
    replicas = len(strategy.extended.worker_devices)
    return [_compat.PerReplica(flat[i * replicas:(i + 1) * replicas])
            for i in range(len(flat) // replicas)]
