"""MG-WFBP's backward times, profiled in `fit`, and the bucket plan tuned from them."""

import logging
import time

import keras
import numpy as np

from tfdist_ext import bucketing
from tfdist_ext.collectives import calibration

log = logging.getLogger("tfdist_ext")


class BackwardProfile(keras.callbacks.Callback):
    """Profiles when each gradient exists, then plans (and tunes) the buckets (MG-WFBP).

    1. While no backward times are known, the strategy's gradient reduction
       stamps (`tf.timestamp`) the moment each gradient is computed on the
       chief's first replica. After `profile_steps` batches the mean stamps
       become per-gradient backward times (backward order), the chief's
       (`calibration.broadcast_from_chief`) so every worker plans alike.
    2. With `tune`, each distinct plan among MG-WFBP's for alpha x
       `ALPHA_SCALES` and equal-size splits into `EQUAL_PARTS` buckets is
       traced and timed for `profile_steps` batches (after one batch that pays
       the re-trace); the chief's fastest wins.
    3. The train function is re-traced with the chosen plan.

    The strategy keeps one instance, so a tuning cut short by the end of a
    `fit` continues in the next.
    """

    ALPHA_SCALES = (1 / 16, 1 / 4, 1.0, 4.0, 1e6)  # 1e6: one bucket
    EQUAL_PARTS = (4, 8)

    def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self.cross_ops = strategy.extended.cross_device_ops
        self.planner = strategy.config.bucketing
        self.phase = "profile"
        self.steps = 0
        self.candidates = []  # ((kind, value), plan)
        self.medians = []
        self.durations = []
        self._began = None

    @property
    def done(self):
        return self.phase == "done"

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        if self.phase == "profile":
            self.steps += 1
            if self.steps >= self.planner.profile_steps:
                self._profiled()
        elif self.phase == "trial":
            self.durations.append(time.perf_counter() - self._began)
            if len(self.durations) > self.planner.profile_steps:
                self.medians.append(float(np.median(self.durations[1:])))
                self._next_trial()

    def _profiled(self):
        state = self.strategy.state
        ready = state.ready_sum.numpy() / max(1, int(state.ready_count.numpy()))
        times = self._chief(backward_times(ready[::-1]))
        self.cross_ops.buckets.use_backward_times(times)
        log.info("tfdist_ext: profiled backward times (ms, backward order): %s",
                 ", ".join(f"{t * 1e3:.2f}" for t in times))
        if not self.planner.tune or self.cross_ops.buckets.plan_inputs is None:
            self._finish(None)
            return
        sizes, alpha, beta = self.cross_ops.buckets.plan_inputs
        plans = [(("alpha", scale), self.planner.plan(list(sizes), times, alpha * scale, beta))
                 for scale in self.ALPHA_SCALES]
        # Equal-size buckets: TF runs independent collectives concurrently, which
        # MG-WFBP's one-channel model does not capture (docs/results.md#gradient-bucketing).
        plans += [(("parts", parts), bucketing.FixedSize(
            max(1, -(-sum(sizes) // parts))).plan(list(sizes))) for parts in self.EQUAL_PARTS]
        seen = set()
        for choice, plan in plans:
            if plan not in seen:
                seen.add(plan)
                self.candidates.append((choice, plan))
        self.phase = "trial"
        self._start_trial()

    def _chief(self, values):
        """The chief's `values` (floats), so that every worker plans alike."""
        return calibration.broadcast_from_chief(self.cross_ops, values,
                                                self.cross_ops.first_rank)

    def _start_trial(self):
        self.durations = []
        self.cross_ops.buckets.use_plan(self.candidates[len(self.medians)][1])
        self.model.make_train_function(force=True)

    def _next_trial(self):
        if len(self.medians) < len(self.candidates):
            self._start_trial()
            return
        best = int(self._chief([int(np.argmin(self.medians))])[0])
        self.trials = [{"candidate": f"{kind} {value:g}", "buckets": len(plan),
                        "step_seconds": median, "chosen": i == best}
                       for i, (((kind, value), plan), median) in enumerate(
                           zip(self.candidates, self.medians))]
        for trial in self.trials:
            log.info("tfdist_ext: bucket plan %s: %d bucket(s), %.2f ms/step%s",
                     trial["candidate"], trial["buckets"], trial["step_seconds"] * 1e3,
                     "  <- chosen" if trial["chosen"] else "")
        self._finish(self.candidates[best][1])

    def _finish(self, plan):
        self.cross_ops.buckets.use_plan(plan)
        self.model.make_train_function(force=True)
        self.phase = "done"


def backward_times(ready):
    """Per-gradient backward seconds from ready stamps in backward order.

    Gradient i's time is how much later than every earlier gradient it was
    ready (never negative), so the prefix sums are the running maximum.
    """
    times, latest = [], None
    for stamp in ready:
        times.append(0.0 if latest is None else max(0.0, float(stamp) - latest))
        latest = float(stamp) if latest is None else max(latest, float(stamp))
    return times
