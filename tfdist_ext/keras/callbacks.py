"""`CommunicationStats`: TensorBoard scalars of a `tfdist_ext.Strategy`'s traffic.

    strategy = tfdist_ext.Strategy(compression="topk")
    with strategy.scope():
        model = build_model()
        model.compile(...)
    model.fit(data, callbacks=[tfdist_ext.keras.CommunicationStats("logs/comm")])

then ``tensorboard --logdir logs``. Only the chief (worker 0) writes.
"""

import numbers
import time

import keras
import tensorflow as tf

from tfdist_ext import frontends
from tfdist_ext.collectives import auto

_UPDATE_FREQS = ("epoch", "batch")


class CommunicationStats(keras.callbacks.Callback):
    """Writes `Strategy.communication_stats()` to TensorBoard, per epoch (and batch).

    Scalars, at step = epoch index (``tfdist/...``) and, when `update_freq`
    asks for it, at step = batches trained by this callback
    (``tfdist/batch/...``):

    * ``bytes_sent``, ``dense_bytes``, ``reductions``: this worker's counts
      during the interval; ``<name>_total``: since the strategy was created.
    * ``compression_ratio``: dense / sent bytes during the interval (1.0 when
      nothing was sent); ``compression_ratio_total``: over all time.
    * ``seconds_per_step``: wall-clock seconds per training batch during the
      interval (includes callbacks and input, like Keras' own timings).
    * any other numeric key `communication_stats()` returns (the sync
      policy's ``staleness``, ``staleness_max``, ``staleness_mean``; the
      number of gradient ``buckets``) as its current value, ``tfdist/<key>``;
      keys listed in `COUNTERS` (also the policy's ``sync_rounds``) get deltas
      and totals instead.
    * ``tfdist/compression_decisions`` (text, at the epoch of each decision
      of ``compression="adaptive"``): candidates x buckets, ms and error.
    * ``tfdist/bucket_plan`` (text, at the epoch it first appears or changes):
      each gradient bucket's bytes, gradient count and algorithm.

    Once per callback: ``tfdist/config`` (text, `strategy.config.describe()`)
    and, with ``allreduce="auto"``, ``tfdist/allreduce_decisions`` (text, the
    modelled-time table "auto" decides with).

    Args:
        log_dir: Directory of the event files (a `tf.summary` file writer).
            Use a subdirectory of `keras.callbacks.TensorBoard`'s `log_dir`
            (e.g. ``logs/comm``) to see both in one TensorBoard.
        update_freq: "epoch" (default), "batch" (every batch) or an integer N
            (every N batches, plus every epoch). Reading the counters costs a
            device-to-host copy, so prefer N >= 100 for short steps.

    Raises:
        ValueError: Bad `update_freq`.
        TypeError: At `fit`, when the model was not built under a
            `tfdist_ext.Strategy` scope.
    """

    COUNTERS = ("bytes_sent", "dense_bytes", "reductions", "sync_rounds")

    def __init__(self, log_dir, update_freq="epoch"):
        super().__init__()
        if update_freq in _UPDATE_FREQS:
            batch_period = 1 if update_freq == "batch" else 0
        elif isinstance(update_freq, int) and not isinstance(update_freq, bool) \
                and update_freq >= 1:
            batch_period = update_freq
        else:
            raise ValueError(
                f"Argument `update_freq` must be 'epoch', 'batch' or an integer >= 1; "
                f"received {update_freq!r}.")
        self.log_dir = str(log_dir)
        self.update_freq = update_freq
        self._batch_period = batch_period
        self._strategy = None
        self._writer = None
        self._wrote_config = False
        self._global_batch = 0

    # --- Keras hooks ---------------------------------------------------------------

    def on_train_begin(self, logs=None):
        self._strategy = _tfdist_strategy(self.model)
        if not _is_chief(self._strategy):
            return
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        if not self._wrote_config:
            self._write_config()
            self._wrote_config = True
        stats = self._stats()
        self._epoch_mark = self._batch_mark = (stats, time.perf_counter(), 0)
        self._batches_this_fit = 0

    def on_epoch_begin(self, epoch, logs=None):
        if self._writer is not None:
            self._epoch_mark = (self._stats(), time.perf_counter(), self._batches_this_fit)

    def on_train_batch_end(self, batch, logs=None):
        if self._writer is None:
            return
        self._batches_this_fit += 1
        self._global_batch += 1
        if self._batch_period and self._global_batch % self._batch_period == 0:
            self._batch_mark = self._write("tfdist/batch/", self._global_batch,
                                           self._batch_mark)

    def on_epoch_end(self, epoch, logs=None):
        if self._writer is not None:
            self._write("tfdist/", epoch, self._epoch_mark)
            self._write_buckets(epoch)
            self._write_decisions(epoch)
            self._writer.flush()

    def _write_buckets(self, epoch):
        plan = self._strategy.bucket_plan
        if not plan or plan == getattr(self, "_written_plan", None):
            return
        lines = [f"    b{i:<3d} {b['bytes']:>12,d} B  {b['gradients']:>3d} gradient(s)  "
                 f"{b['algorithm']}" for i, b in enumerate(plan)]
        with self._writer.as_default(step=epoch):
            tf.summary.text("tfdist/bucket_plan", "\n".join(lines))
        self._written_plan = plan

    def _write_decisions(self, epoch):
        decisions = self._strategy.compression_decisions
        written = getattr(self, "_written_decisions", 0)
        if len(decisions) <= written:
            return
        from tfdist_ext.keras import adaptive_controller  # pylint: disable=import-outside-toplevel
        with self._writer.as_default(step=epoch):
            for decision in decisions[written:]:
                tf.summary.text("tfdist/compression_decisions",
                                f"step {decision['step']} ({decision['reason']}):\n\n"
                                + adaptive_controller.format_decision(decision))
        self._written_decisions = len(decisions)

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()

    # --- writing -------------------------------------------------------------------

    def _stats(self):
        return self._strategy.communication_stats()

    def _write(self, prefix, step, mark):
        """Writes the interval since `mark`; returns the new mark."""
        before, started, batches_before = mark
        now, stats = time.perf_counter(), self._stats()
        batches = self._batches_this_fit - batches_before
        with self._writer.as_default(step=step):
            for key, value in stats.items():
                if not _is_number(value) or key == "compression_ratio":
                    continue
                if key in self.COUNTERS:
                    tf.summary.scalar(prefix + key, value - before.get(key, 0))
                    tf.summary.scalar(f"{prefix}{key}_total", value)
                else:
                    tf.summary.scalar(prefix + key, value)
            if "bytes_sent" in stats and "dense_bytes" in stats:
                sent = stats["bytes_sent"] - before.get("bytes_sent", 0)
                dense = stats["dense_bytes"] - before.get("dense_bytes", 0)
                tf.summary.scalar(prefix + "compression_ratio", dense / sent if sent else 1.0)
            if _is_number(stats.get("compression_ratio")):
                tf.summary.scalar(prefix + "compression_ratio_total",
                                  stats["compression_ratio"])
            if batches:
                tf.summary.scalar(prefix + "seconds_per_step", (now - started) / batches)
        return stats, now, self._batches_this_fit

    def _write_config(self):
        strategy = self._strategy
        with self._writer.as_default(step=0):
            tf.summary.text("tfdist/config", strategy.config.describe())
            decisions = strategy.allreduce_decisions
            if decisions:
                table = auto.format_table(strategy.calibration, decisions)
                # Indented: TensorBoard renders text as Markdown; keep the columns.
                tf.summary.text("tfdist/allreduce_decisions",
                                "\n".join("    " + line for line in table.splitlines()))
        self._writer.flush()


def _tfdist_strategy(model):
    strategy = model.distribute_strategy
    if frontends.our_strategy(strategy) is None:
        raise TypeError(
            f"CommunicationStats needs a model built and compiled under a "
            f"tfdist_ext.Strategy scope; this model's distribute_strategy is "
            f"{type(strategy).__module__}.{type(strategy).__qualname__}. Create the "
            "model inside `with tfdist_ext.Strategy(...).scope():`, or drop the callback.")
    return strategy


def _is_chief(strategy):
    return strategy.extended.should_checkpoint  # rank 0 (it can move in elastic training)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
