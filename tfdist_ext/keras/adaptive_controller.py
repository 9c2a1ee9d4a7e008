"""`AdaptiveCompression`: the controller of `compression="adaptive"` in `fit`.

`fit` adds it by itself (`Strategy.fit_callbacks`) when the strategy's
compressor is `tfdist_ext.compression.Adaptive`; see that class for what is
probed, decided and watched. Every worker runs the same phases at the same
batches; only the chief measures, and its decisions (and its drift verdicts)
are broadcast, so all workers set the same choice on every bucket.
"""

import logging
import statistics
import time

import keras

from tfdist_ext.compression import adaptive

log = logging.getLogger("tfdist_ext")

_CHOICE, _STATS = "_adaptive_choice", "_adaptive_stats"


class AdaptiveCompression(keras.callbacks.Callback):
    """Probes the candidates, sets each bucket's choice, re-probes on drift.

    The strategy keeps one instance, so a probe cut short by the end of a
    `fit` continues in the next.

    Attributes:
        decisions: One dict per decision round: "step", "reason", "candidates"
            (labels), "step_seconds" (median step per candidate) and "buckets"
            (per bucket: "key", "seconds", "errors" and "lags" per candidate, "choice").
    """

    def __init__(self, strategy):
        super().__init__()
        self.strategy = strategy
        self.compressor = strategy.config.compression
        self.labels = self.compressor.candidate_names()
        self.decisions = []
        self.phase = "warmup"
        self._step = None
        self._began = None
        self._reason = "start"

    @property
    def _chief(self):
        return self.strategy.worker_index == 0

    def on_train_begin(self, logs=None):
        if self._step is None:
            self._step = int(self.strategy.state.steps[0].numpy())

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        seconds = time.perf_counter() - self._began
        self._step += 1
        if self.phase == "warmup":
            if self._step >= self.compressor.warmup_steps:
                self._start_probe()
        elif self.phase == "probe":
            self._probe_step(seconds)
        else:
            self._watch_step(seconds)

    # -- probing --------------------------------------------------------------

    def _buckets(self):
        """{bucket key: its per-replica choice variables}, in the same order everywhere."""
        return {key[:-len(_CHOICE)]: variables
                for key, variables in self.strategy.state.buffers_ending(_CHOICE).items()}

    def _set_choices(self, choices, measuring=False):
        for variables, choice in zip(self._buckets().values(), choices):
            for variable in variables:
                variable.assign([int(choice), int(measuring)])

    def _start_probe(self):
        self.phase = "probe"
        self._candidate = 0
        self._trial = []
        self._seconds = [[] for _ in self.labels]
        self._bucket_stats = [[] for _ in self.labels]
        self._set_choices([0] * len(self._buckets()), measuring=True)

    def _probe_step(self, seconds):
        self._trial.append(seconds)
        if len(self._trial) == 1:  # the first step after a switch is not measured
            return
        if self._chief:
            stats = self.strategy.state.buffers_ending(_STATS)
            self._bucket_stats[self._candidate].append(
                [tuple(float(v) for v in stats[key + _STATS][0].numpy())
                 for key in self._buckets()])
        self._seconds[self._candidate].append(seconds)
        if len(self._trial) <= self.compressor.probe_steps:
            return
        self._candidate += 1
        self._trial = []
        if self._candidate < len(self.labels):
            self._set_choices([self._candidate] * len(self._buckets()), measuring=True)
        else:
            self._decide()

    def _decide(self):
        keys = list(self._buckets())
        n = len(keys)
        if self._chief:
            # The fastest probe step: this host's noise only ever adds time.
            seconds = [[min(s[b][0] for s in runs) for b in range(n)]
                       for runs in self._bucket_stats]
            errors = [[statistics.median(s[b][1] for s in runs) for b in range(n)]
                      for runs in self._bucket_stats]
            lags = [[max(s[b][2] for s in runs) for b in range(n)] for runs in self._bucket_stats]
            choices = adaptive.choose(seconds, errors, self.compressor.max_error,
                                      self.compressor.tolerance, lags, self.compressor.max_lag)
            flat = [float(c) for c in choices] + [
                v for table in (seconds, errors, lags) for row in table for v in row]
        else:
            flat = [0.0] * (n + 3 * n * len(self.labels))
        flat = self.strategy.broadcast_from_chief(flat)
        choices = [int(v) for v in flat[:n]]
        c_n = len(self.labels) * n
        table, errors, lags = ([flat[n + k * c_n + c * n:n + k * c_n + (c + 1) * n]
                                for c in range(len(self.labels))] for k in range(3))
        self._set_choices(choices)
        decision = {
            "step": self._step, "reason": self._reason, "candidates": list(self.labels),
            "step_seconds": [statistics.median(s) for s in self._seconds],
            "buckets": [{"key": key, "choice": self.labels[choice],
                         "seconds": [table[c][b] for c in range(len(self.labels))],
                         "errors": [errors[c][b] for c in range(len(self.labels))],
                         "lags": [lags[c][b] for c in range(len(self.labels))]}
                        for b, (key, choice) in enumerate(zip(keys, choices))]}
        self.decisions.append(decision)
        if self._chief:
            log.warning("tfdist_ext: adaptive compression at step %d (%s):\n%s", self._step,
                        self._reason, format_decision(decision))
        self.phase = "settle"
        self._window = []
        self._since_probe = 0

    # -- watching -------------------------------------------------------------

    def _watch_step(self, seconds):
        self._window.append(seconds)
        self._since_probe += 1
        if len(self._window) < self.compressor.check_every:
            return
        window, self._window = self._window, []
        if self.phase == "settle":
            self._baseline = statistics.median(window)
            self._suspect = False
            self.phase = "watch"
            return
        verdict = [0.0, 0.0]
        if self._chief:
            drift = adaptive.drifted(window, self._baseline, self.compressor.drift)
            if drift and self._suspect:  # a burst of noise rarely lasts two windows
                verdict = [statistics.median(window), self._baseline]
            self._suspect = drift
        reprobe = self.compressor.reprobe_steps
        due = reprobe and self._since_probe >= reprobe
        now, then = self.strategy.broadcast_from_chief(verdict)
        if now:
            self._reason = (f"step time {now * 1e3:.1f} ms against {then * 1e3:.1f} ms "
                            "after the last decision")
            self._start_probe()
        elif due:
            self._reason = f"{reprobe} steps since the last probe"
            self._start_probe()


def format_decision(decision):
    """A decision round as a text table (candidates x buckets, ms and error)."""
    labels = decision["candidates"]
    width = max(len(label) for label in labels)
    lines = [f"    {'candidate':<{width}}  step ms  " + "  ".join(
        f"{b['key'][:32]:>32}" for b in decision["buckets"])]
    for c, label in enumerate(labels):
        cells = [f"{b['seconds'][c] * 1e3:9.2f} ms e={b['errors'][c]:.2f} "
                 f"lag={b['lags'][c]:.1f}" for b in decision["buckets"]]
        lines.append(f"    {label:<{width}}  {decision['step_seconds'][c] * 1e3:7.1f}  "
                     + "  ".join(f"{cell:>32}" for cell in cells))
    lines.append(f"    {'chosen':<{width}}           " + "  ".join(
        f"{b['choice']:>32}" for b in decision["buckets"]))
    return "\n".join(lines)
