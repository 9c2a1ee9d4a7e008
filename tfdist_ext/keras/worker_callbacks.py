"""Keras' file-writing callbacks in a multi-worker `fit`: one writer per shared path.

Keras 3 runs every callback on every worker, so two workers given
`BackupAndRestore(dir)` write the same HDF5 file at once (and fail on its
lock), and `ModelCheckpoint`, `TensorBoard` and `CSVLogger` write duplicate or
interleaved output. `for_this_worker` adapts the callbacks of one `fit` on
the worker they run on, as tf.keras 2 did:

* The chief (`strategy.extended.should_checkpoint`) writes where the user
  asked. Its `BackupAndRestore` writes each backup to a temporary file in the
  backup directory and renames it into place, so a worker that restores
  never reads a half-written backup (a kill during the save leaves the
  previous one).
* Every other worker runs the same callbacks (saving may read distributed
  variables, which takes collectives every worker must join) but writes into
  a private temporary directory, deleted when `fit` returns. Its
  `BackupAndRestore` restores from the shared backup directory and never
  deletes it. One that becomes the chief (elastic training, after the chief's
  death) writes where the user asked from then on: its CSVLogger appends to
  the dead chief's file.
* `BackupAndRestore` also backs up each worker's `Strategy.state`
  (error-feedback residuals, DGC velocities, step counters, model-averaging
  learners), so a restarted job resumes exactly where the backup was taken.
  Sync policies drain at epoch ends, so an epoch-end backup has no reduction
  in flight; with an integer `save_freq` a relaxed policy's in-flight round
  is not backed up.

`tfdist_ext.keras.CommunicationStats` writes on the chief only by itself.
The callbacks' attributes are restored when `fit` returns.
"""

import contextlib
import itertools
import logging
import os
import shutil
import tempfile

import keras
import tensorflow as tf

log = logging.getLogger("tfdist_ext")


@contextlib.contextmanager
def for_this_worker(callbacks, strategy):
    """Within the context, `callbacks` write as this worker should (see module doc).

    Args:
        callbacks: The list given to `fit` (None, a list or a CallbackList).
        strategy: The model's `tfdist_ext.Strategy`.
    """
    if isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = callbacks.callbacks
    callbacks = list(callbacks or [])
    chief = strategy.extended.should_checkpoint
    backups = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
    if chief and not backups:
        yield
        return
    private = None if chief else tempfile.mkdtemp(prefix="tfdist-worker-")
    restore = []
    try:
        for callback in callbacks:
            if not chief:
                _redirect(callback, private, restore)
        for callback in backups:
            _back_up_state(callback, strategy, private, restore)
        if chief:
            yield
        else:
            redirected = list(restore)
            with strategy.membership.on_promotion(lambda: _write_where_asked(redirected)):
                yield
    finally:
        for obj, name, value, existed in reversed(restore):
            if existed:
                setattr(obj, name, value)
            else:
                delattr(obj, name)
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


def _write_where_asked(redirected):
    """This worker became the chief (elastic training): its callbacks write where the
    user asked from now on. `CSVLogger` appends its next epochs to the dead chief's
    file (a header only if that file is empty); `TensorBoard` writes its next epochs'
    events into new files in the user's log directory, beside the dead chief's
    (batch-level summaries stay in this worker's private directory until `fit`
    ends); `ModelCheckpoint` saves there. A file that cannot be opened there (no
    shared file system) leaves that callback writing privately, with a warning."""
    for obj, name, value, existed in redirected:
        if not existed:
            continue
        try:
            if isinstance(obj, keras.callbacks.ModelCheckpoint) and name == "filepath":
                setattr(obj, name, value)
            elif isinstance(obj, keras.callbacks.CSVLogger) and name == "filename":
                _append_where_asked(obj, value)
            elif isinstance(obj, keras.callbacks.TensorBoard) and name == "log_dir":
                _log_where_asked(obj, value)
        except (OSError, tf.errors.OpError) as err:
            log.warning("tfdist_ext: this worker is now the chief, but its %s cannot write "
                        "to %s (%s); it goes on writing in its private directory.",
                        type(obj).__name__, value, err)


def _append_where_asked(logger, filename):
    exists = tf.io.gfile.exists(filename) and tf.io.gfile.stat(filename).length > 0
    if "://" in filename:  # as Keras opens it: TF's file for a remote path
        appended = tf.io.gfile.GFile(filename, "a")
    else:
        appended = open(filename, "a", encoding="utf-8")  # pylint: disable=R1732
    if logger.csv_file is not None and not logger.csv_file.closed:
        logger.csv_file.close()
    logger.filename, logger.csv_file, logger.append_header = filename, appended, not exists
    logger.writer = None  # made again, over the new file, at the next epoch's end


def _log_where_asked(board, log_dir):
    writers = getattr(board, "_writers", None)
    if writers is None or not hasattr(board, "_log_write_dir"):
        return  # another Keras: it goes on writing in its private directory
    # Not closed: Keras' batch-level summaries may hold one as the default writer.
    for writer in writers.values():
        writer.flush()
    board.log_dir = board._log_write_dir = log_dir  # pylint: disable=protected-access
    board._train_dir = os.path.join(log_dir, "train")  # pylint: disable=protected-access
    board._val_dir = os.path.join(log_dir, "validation")  # pylint: disable=protected-access
    board._writers = {}  # pylint: disable=protected-access


def _set(restore, obj, name, value):
    existed = name in vars(obj)
    restore.append((obj, name, vars(obj).get(name), existed))
    setattr(obj, name, value)


def _private_path(private, path):
    """`path` (absolute or relative) re-rooted under the private directory."""
    return os.path.join(private, os.path.abspath(str(path)).lstrip(os.sep))


def _redirect(callback, private, restore):
    if isinstance(callback, keras.callbacks.ModelCheckpoint):
        _set(restore, callback, "filepath", _private_path(private, callback.filepath))
    elif isinstance(callback, keras.callbacks.TensorBoard):
        _set(restore, callback, "log_dir", _private_path(private, callback.log_dir))
    elif isinstance(callback, keras.callbacks.CSVLogger):
        path = _private_path(private, callback.filename)
        os.makedirs(os.path.dirname(path), exist_ok=True)  # it opens the file, in no folder
        _set(restore, callback, "filename", path)
        _set(restore, callback, "append_header", callback.append_header)  # promotion sets it


_BACKUP_PATHS = ("backup_dir", "_weights_path", "_training_metadata_path",
                 "_prev_weights_path", "_prev_training_metadata_path")


@contextlib.contextmanager
def _backup_paths(callback, root):
    """`callback`'s backup files, re-rooted under `root` for the duration."""
    saved = {name: getattr(callback, name) for name in _BACKUP_PATHS}
    try:
        for name, path in saved.items():
            setattr(callback, name, os.path.join(root, os.path.relpath(path,
                                                                       saved["backup_dir"])))
        yield saved
    finally:
        for name, path in saved.items():
            setattr(callback, name, path)


def _private_save(callback, private):
    save = type(callback)._save_model  # pylint: disable=protected-access

    def save_privately():
        with _backup_paths(callback, os.path.join(private, "backup")):
            save(callback)

    return save_privately


def _atomic_save(callback):
    """The chief's save: into a fresh directory, then renamed file by file into place."""
    save = type(callback)._save_model  # pylint: disable=protected-access

    def save_atomically():
        os.makedirs(callback.backup_dir, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".saving-", dir=callback.backup_dir)
        try:
            with _backup_paths(callback, staging) as final:
                for name in ("_weights_path", "_training_metadata_path"):
                    if callback.double_checkpoint and os.path.exists(final[name]):
                        # Keras copies the previous backup aside; keep that behaviour.
                        shutil.copy(final[name], getattr(callback, name))
                save(callback)
                staged = {name: getattr(callback, name) for name in _BACKUP_PATHS[1:]}
            # The weights first: metadata naming an epoch is only ever next to
            # weights at least that recent.
            for name in ("_prev_weights_path", "_prev_training_metadata_path",
                         "_weights_path", "_training_metadata_path"):
                if os.path.exists(staged[name]):
                    os.replace(staged[name], final[name])
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    return save_atomically


_ends = itertools.count()  # the same sequence on every worker (SPMD)


def _back_up_state(callback, strategy, private, restore):
    """Backs up and restores `strategy.state` (residuals, step counters) with the weights.

    Each worker writes its own state (residuals differ per replica) to
    ``<backup_dir>/tfdist-worker<i>/``; the chief deletes the backup
    directory at the end of `fit` only after every worker has finished
    writing there.
    """
    atomic = _atomic_save(callback)
    private_save = None if private is None else _private_save(callback, private)
    load = callback.on_train_begin
    end = callback.on_train_end
    checkpoint = tf.train.Checkpoint(tfdist=strategy.state)
    directory = os.path.join(callback.backup_dir, f"tfdist-worker{strategy.worker_index}")

    def save_model():
        # The chief's role can move to this worker during elastic training.
        (atomic if strategy.extended.should_checkpoint else private_save)()
        staging = f"{directory}.saving"
        shutil.rmtree(staging, ignore_errors=True)
        checkpoint.write(os.path.join(staging, "state"))
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(staging, directory)

    def on_train_begin(logs=None):
        load(logs)
        if os.path.exists(callback._training_metadata_path):  # pylint: disable=protected-access
            if not os.path.isdir(directory) and _has_state(strategy):
                raise FileNotFoundError(
                    f"BackupAndRestore({callback.backup_dir!r}) holds a backup of the "
                    f"weights but not of worker {strategy.worker_index}'s tfdist_ext state "
                    f"(error-feedback residuals, step counters), expected in {directory}. "
                    "Resuming without it would silently drop the residuals; delete the "
                    "backup directory to start over.")
            if os.path.isdir(directory):
                # Residuals created later (when the train step is first traced)
                # are filled in then.
                checkpoint.read(os.path.join(directory, "state"))

    def on_train_end(logs=None):
        strategy.exchange(f"backup-end/{next(_ends)}", 1)  # everyone has saved
        if strategy.extended.should_checkpoint:
            end(logs)

    _set(restore, callback, "_save_model", save_model)
    _set(restore, callback, "on_train_begin", on_train_begin)
    _set(restore, callback, "on_train_end", on_train_end)


def _has_state(strategy):
    """Whether resuming without `strategy.state` would change training."""
    from tfdist_ext.compression import NoCompression  # pylint: disable=import-outside-toplevel
    return (strategy.sync_runner is not None
            or not isinstance(strategy.config.compression, NoCompression))
