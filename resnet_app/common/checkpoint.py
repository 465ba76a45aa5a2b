"""Run checkpoints: saved durably, verified before use, the best one kept whole.

No file is trusted unread: checkpoints are listed from the files, and every
tensor of the one used is read back against its CRC32C.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import os
import shutil
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from resnet_app.common import averaged_checkpoint, disk_space, files, run_dir
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.common.run_dir import CONFIG_FILE

PREFIX = run_dir.CHECKPOINT_PREFIX
EMA = "ema"  # The checkpoint's moving average of the weights (`engine/ema.py`).


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """Every checkpoint in `directory` as (step, path prefix), oldest first."""
    if not tf.io.gfile.isdir(directory):
        return []
    found = []
    for name in tf.io.gfile.listdir(directory):
        step = run_dir.checkpoint_step(name)
        if step is not None:
            found.append((step, os.path.join(directory, name[: -len(".index")])))
    return sorted(found)


def unreadable(prefix: str) -> str | None:
    """Why the checkpoint at `prefix` cannot be read, or None if every tensor reads back."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)  # Checks the stored CRC32C.
    except Exception as error:  # noqa: BLE001 - any failure to read means unusable.
        return first_line(error)
    return None


def find_latest(directory: str) -> tuple[int, str] | None:
    """The newest readable checkpoint (step, prefix), skipping unreadable ones with a
    warning; None without checkpoints, ConfigError when none is readable."""
    found = list_checkpoints(directory)
    for step, prefix in reversed(found):
        reason = unreadable(prefix)
        if reason is None:
            return step, prefix
        logging.warning(
            "Checkpoint %s is unreadable (%s); falling back to the one before it", prefix, reason
        )
    if found:
        raise ConfigError(
            f"none of the {len(found)} checkpoints in {directory} is readable; restore them "
            "from a backup, or start over with --restart"
        )
    return None


def select(directory: str, which: str) -> list[tuple[int, str]]:
    """Checkpoints chosen by name: "latest", "all" (readable ones), "best", "averaged"
    (`resnet-app average`'s), "ckpt-N" or "N"; ConfigError for none, or an unreadable one."""
    if which == run_dir.BEST_CHOICE:
        return [find_best(directory)]
    if which == averaged_checkpoint.CHOICE:
        step, prefix = averaged_checkpoint.find(directory)
        return [(step, _readable(prefix, "the averaged checkpoint"))]
    found = list_checkpoints(directory)
    if not found:
        raise ConfigError(f"{directory} holds no checkpoint ({PREFIX}-N.index); check --model_dir")
    if which == "latest":
        return [find_latest(directory)]
    if which == "all":
        chosen = []
        for step, prefix in found:
            reason = unreadable(prefix)
            if reason:
                logging.warning("Skipping unreadable checkpoint %s (%s)", prefix, reason)
            else:
                chosen.append((step, prefix))
        if not chosen:
            find_latest(directory)  # Raises the none-readable error.
        return chosen
    chosen_step = run_dir.chosen_step(which)
    steps = {step: prefix for step, prefix in found}
    if chosen_step not in steps:
        names = ", ".join(run_dir.checkpoint_name(step) for step in steps)
        kept = (
            ", best" if files.find_complete(run_dir.best_dir(directory), run_dir.BEST_FILE) else ""
        )
        kept += ", averaged" if averaged_checkpoint.read(directory) else ""
        raise ConfigError(
            f"--checkpoint={which}: not in {directory}; use latest, all{kept} or one of: {names}"
        )
    return [(chosen_step, _readable(steps[chosen_step], "checkpoint", "; pick another one"))]


def _readable(prefix: str, what: str, fix: str = "") -> str:
    """`prefix`, or a ConfigError "WHAT PREFIX is unreadable (WHY)FIX"."""
    reason = unreadable(prefix)
    if reason:
        raise ConfigError(f"{what} {prefix} is unreadable ({reason}){fix}")
    return prefix


def find_best(directory: str) -> tuple[int, str]:
    """The run's best checkpoint (`train.keep_best`) as (step, prefix); ConfigError if none."""
    found = run_dir.read_best(directory)
    if found is None:
        raise ConfigError(
            f"the run {directory} has no best checkpoint ({run_dir.BEST_DIR}/"
            f"{run_dir.BEST_FILE}): train with --set train.keep_best=true"
        )
    folder, record = found
    prefix = os.path.join(folder, record["checkpoint"])
    return record["step"], _readable(prefix, "the best checkpoint", "; pick another")


def keep_best(model_dir: str, step: int, record: dict[str, Any]) -> str:
    """Copies the rolling checkpoint `ckpt-<step>` to `best/best-<step>`, with `best.json`
    (`record` plus "step" and "checkpoint"), replacing `best/` whole
    (`run_dir.write_kept`); returns its prefix. OSError leaves the old best."""
    source = os.path.join(model_dir, run_dir.checkpoint_name(step))

    def copy(prefix: str) -> None:
        for path in _checkpoint_files(source):
            shutil.copyfile(path, prefix + path[len(source) :])

    name = run_dir.best_checkpoint_name(step)
    return run_dir.write_kept(
        run_dir.best_dir(model_dir), run_dir.BEST_FILE, name, step, record, copy
    )


def recover_best(model_dir: str) -> None:
    """Puts back a best checkpoint a crash left aside, and removes unfinished copies."""
    found = files.recover_directory(run_dir.best_dir(model_dir), run_dir.BEST_FILE)
    if found is not None:
        logging.warning("Putting back the best checkpoint %s, set aside by a crash", found)


def make_durable(prefix: str) -> None:
    """Syncs the checkpoint's files, then its directory (TensorFlow's "sync" is a flush):
    after every save, before older checkpoints are deleted."""
    for path in _checkpoint_files(prefix):
        files.sync_file(path)
    files.sync_directory(os.path.dirname(prefix) or ".")


def remove_leftovers(directory: str) -> list[str]:
    """Removes (and returns) TensorFlow's temporary files killed saves left: only the
    trainer, holding the run lock, writes them, so at its start any found is a leftover."""
    patterns = (f"{PREFIX}-*_temp", "*.tempstate*", f"{run_dir.CHECKPOINT_INDEX_FILE}.tmp*")
    removed = []
    for pattern in patterns:
        for path in glob.glob(os.path.join(glob.escape(directory), pattern)):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            removed.append(path)
    if removed:
        logging.info("Removed what interrupted saves left: %s", ", ".join(sorted(removed)))
    return removed


def _checkpoint_files(prefix: str) -> list[str]:
    """The index and data files of the checkpoint at `prefix`."""
    index = prefix + ".index"
    if not os.path.isfile(index):
        raise FileNotFoundError(errno.ENOENT, "no such checkpoint", index)
    return [index, *sorted(glob.glob(glob.escape(prefix) + ".data-*"))]


def read_value(prefix: str, name: str):
    """A saved `tf.train.Checkpoint` attribute's value (e.g. "global_step"), or None."""
    reader = tf.train.load_checkpoint(prefix)
    key = f"{name}/.ATTRIBUTES/VARIABLE_VALUE"
    return reader.get_tensor(key) if reader.has_tensor(key) else None


@tf.function
def _all_finite(variables):
    return tf.reduce_all(
        [tf.reduce_all(tf.math.is_finite(v)) for v in variables if v.dtype.is_floating]
    )


class RunCheckpoint:
    """A run's `tf.train.Checkpoint` of `objects` and its manager. Only the chief's saves
    are kept; the others' go to a scratch directory per run and worker (`close`)."""

    def __init__(
        self,
        directory: str,
        chief: bool = True,
        max_to_keep: int = 3,
        keep_every_n_hours: float | None = None,
        worker: int = 0,
        **objects,
    ):
        self.directory = directory
        self.save_dir = directory
        if not chief:
            run = hashlib.sha1(os.path.abspath(directory).encode()).hexdigest()[:12]
            self.save_dir = os.path.join(
                tempfile.gettempdir(), f"resnet_app_{os.getuid()}_{run}_worker{worker}"
            )
            shutil.rmtree(self.save_dir, ignore_errors=True)
            max_to_keep, keep_every_n_hours = 1, None
        else:
            remove_leftovers(directory)
        self._durable = chief  # A scratch copy need not survive a power cut.
        self._objects = objects
        self.checkpoint = tf.train.Checkpoint(**objects)
        # Checked by `finite`: other state may hold NaN on purpose.
        self._variables = [
            v
            for name in ("model", EMA, "optimizer")
            for v in getattr(objects.get(name), "variables", [])
        ]
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            self.save_dir,
            max_to_keep=max_to_keep,
            keep_checkpoint_every_n_hours=keep_every_n_hours,
            checkpoint_name=PREFIX,
        )

    def finite(self) -> bool:
        """Whether every floating-point variable of the model, average and optimizer is finite."""
        return bool(_all_finite(self._variables))

    def save(self, step: int) -> str:
        """Saves as `ckpt-<step>` (the caller checked `finite()`); returns its prefix. A failed
        save leaves nothing of it; a full disk is one line (`DiskFullError`)."""
        self._warn_if_space_is_low(step)
        with self._failed_save_cleaned(os.path.join(self.save_dir, run_dir.checkpoint_name(step))):
            # Ours runs before the manager's own callback deletes older checkpoints
            # (it appends to the options' list: a new one per save).
            callbacks = [make_durable] if self._durable else None
            options = tf.train.CheckpointOptions(experimental_write_callbacks=callbacks)
            return self.manager.save(checkpoint_number=step, options=options)

    def write_now(self, prefix: str) -> str:
        """Writes a checkpoint at `prefix` outside the manager and lists it in the `checkpoint`
        file (a lost worker's survivor's save, `engine/lost_worker.py`)."""
        with self._failed_save_cleaned(prefix):
            # Counted (and so saved) as `save` counts.
            self.checkpoint.save_counter.assign_add(1)
            self.checkpoint.write(prefix)
            make_durable(prefix)
        directory = os.path.dirname(prefix)
        tf.compat.v1.train.update_checkpoint_state(
            directory,
            prefix,
            all_model_checkpoint_paths=[path for _, path in list_checkpoints(directory)],
        )
        return prefix

    @contextlib.contextmanager
    def _failed_save_cleaned(self, prefix: str):
        """A failed save to `prefix` leaves nothing of it; a full disk is `DiskFullError`."""
        try:
            yield
        except (tf.errors.OpError, OSError) as error:
            _remove_partial(prefix)
            if disk_space.is_disk_full(error):
                step = run_dir.checkpoint_step(os.path.basename(prefix) + ".index")
                raise self._disk_full(step, os.path.dirname(prefix)) from None
            raise

    def _expected_size(self, step: int, directory: str | None = None) -> int:
        """What a checkpoint takes: the newest one's files, else the variables' bytes."""
        for saved, prefix in reversed(list_checkpoints(directory or self.save_dir)):
            if saved != step:
                return disk_space.files_size(_checkpoint_files(prefix))
        return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in self._variables)

    def _warn_if_space_is_low(self, step: int) -> None:
        free = disk_space.free_bytes(self.save_dir)
        needed = self._expected_size(step)
        if free is not None and free < disk_space.LOW_SPACE_CHECKPOINTS * needed:
            logging.warning(
                "Only %s free in %s; a checkpoint takes %s: free some space before the disk fills",
                disk_space.format_bytes(free),
                self.save_dir,
                disk_space.format_bytes(needed),
            )

    def _disk_full(self, step: int, directory: str) -> disk_space.DiskFullError:
        earlier = [(s, p) for s, p in list_checkpoints(directory) if s != step]
        kept = (
            f"the last checkpoint, {os.path.basename(earlier[-1][1])}, is intact: free some "
            "space and rerun the same command to resume from it"
            if earlier
            else "there is no earlier checkpoint: free some space and rerun to start over"
        )
        return disk_space.DiskFullError(
            f"no space left in {directory} to save {run_dir.checkpoint_name(step)} at step "
            f"{step}: {disk_space.format_bytes(disk_space.free_bytes(directory))} free, a "
            f"checkpoint takes {disk_space.format_bytes(self._expected_size(step, directory))}; "
            f"{kept}"
        )

    def restore(self, prefix: str, without: tuple[str, ...] = ()) -> None:
        """Restores everything from `prefix` but the objects named in `without`."""
        checkpoint = self.checkpoint
        if without:
            kept = {name: value for name, value in self._objects.items() if name not in without}
            checkpoint = tf.train.Checkpoint(**kept)
        try:
            checkpoint.restore(prefix).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            raise ConfigError(
                f"cannot resume from {prefix} ({first_line(error)}); it was saved by another model "
                "or optimizer; use a new --model_dir, or --restart to move the old run aside"
            ) from None

    def close(self) -> None:
        if self.save_dir != self.directory:
            shutil.rmtree(self.save_dir, ignore_errors=True)


def _remove_partial(prefix: str) -> None:
    """Removes a failed save's temporary files, and its files unless complete and readable."""
    shutil.rmtree(prefix + "_temp", ignore_errors=True)
    leftovers = glob.glob(glob.escape(prefix) + ".*tempstate*")
    if not os.path.isfile(prefix + ".index") or unreadable(prefix) is not None:
        leftovers += glob.glob(glob.escape(prefix) + ".index")
        leftovers += glob.glob(glob.escape(prefix) + ".data-*")
    for path in leftovers:
        with contextlib.suppress(OSError):
            os.remove(path)


def has_ema(prefix: str) -> bool:
    """Whether the checkpoint at `prefix` holds a moving average of the weights."""
    names = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    return any(name.startswith(EMA + "/") for name in names)


def chosen_weights(prefix: str, weights: str = "auto") -> str:
    """ "ema" or "raw": what `weights` ("auto", "ema" or "raw") picks in the checkpoint."""
    if weights not in run_dir.WEIGHTS:
        raise ConfigError(f"--weights={weights}: use one of: {', '.join(run_dir.WEIGHTS)}")
    if weights == "raw":
        return "raw"
    if has_ema(prefix):
        return "ema"
    if weights == "ema":
        raise ConfigError(
            f"--weights=ema: {prefix} holds no moving average of the weights (its run had "
            "no train.ema_decay or train.swa_start); use --weights=raw"
        )
    return "raw"


def restore_model(model, prefix: str, weights: str = "raw") -> str:
    """Restores only the model (`weights`: "raw", "ema" or "auto") from a training
    checkpoint; returns "ema" or "raw"."""
    try:
        chosen = chosen_weights(prefix, weights)
        name = EMA if chosen == "ema" else "model"
        status = tf.train.Checkpoint(**{name: model}).restore(prefix).expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        if not os.path.exists(prefix + ".index"):
            raise CheckpointGoneError(
                f"checkpoint {prefix} was removed before it could be read (a running trainer "
                "rotated it out, or replaced its best)"
            ) from None
        raise ConfigError(
            f"checkpoint {prefix} does not match the model of the run's {CONFIG_FILE} "
            f"({first_line(error)})"
        ) from None
    return chosen


class CheckpointGoneError(ConfigError):
    """A checkpoint removed between its choice and its restore (rotation, a new best)."""


def restore_selected(
    model, directory: str, which: str, step: int, prefix: str, weights: str = "raw"
) -> tuple[int, str, str]:
    """`restore_model` of (step, prefix) chosen by `select(directory, which)`; returns
    (step, prefix, "ema" or "raw"). A "latest" or "best" rotated out meanwhile is
    chosen again; a name gone is refused as `select` would."""
    for _ in range(_RECHOOSE_ATTEMPTS):
        try:
            return step, prefix, restore_model(model, prefix, weights)
        except CheckpointGoneError as gone:
            if which not in ("latest", run_dir.BEST_CHOICE):
                select(directory, which)  # Raises: the name is gone; lists the others.
                raise
            logging.warning("%s; choosing the %s checkpoint again", gone, which)
            [(step, prefix)] = select(directory, which)
    return step, prefix, restore_model(model, prefix, weights)


# How often a checkpoint removed under a reader is chosen again before giving up.
_RECHOOSE_ATTEMPTS = 3
