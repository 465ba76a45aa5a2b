"""Run checkpoints: saved atomically, verified before use, never non-finite (the trainer checks).

A run directory holds `ckpt-<step>.index` / `.data-*` pairs written by
`tf.train.CheckpointManager`, and its `checkpoint` pointer file (the names
are `common/run_dir.py`'s). TensorFlow
writes a checkpoint's data, then its index, and only then (atomically)
repoints the `checkpoint` file, so a crash during a save leaves the pointer on
the previous checkpoint. We go further and never trust a file we have not
read: `find_latest` lists the checkpoints from the files themselves (a corrupt
pointer file does not matter) and reads every tensor of the newest one, whose
index stores a CRC32C per tensor. A truncated or garbled checkpoint is skipped
with a warning and the previous one is used; if none is readable, that is an
error.

What a training checkpoint holds is the trainer's business (see
`engine/setup.py`): the model (with BatchNorm moving statistics), the
optimizer (slots and iterations), the global step, the data position and the
learning-rate state.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.common.run_dir import CONFIG_FILE

PREFIX = run_dir.CHECKPOINT_PREFIX


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
    """The newest readable checkpoint in `directory`, as (step, prefix).

    Unreadable newer ones are skipped with a warning.

    Returns:
      None when the directory has no checkpoint.

    Raises:
      ConfigError: when there are checkpoints but none is readable.
    """
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
    """Checkpoints chosen by name: "latest", "all" (readable ones), "ckpt-N" or "N".

    Raises:
      ConfigError: for a directory without checkpoints, an unknown name or an
        unreadable checkpoint.
    """
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
        raise ConfigError(
            f"--checkpoint={which}: not in {directory}; use latest, all or one of: {names}"
        )
    prefix = steps[chosen_step]
    reason = unreadable(prefix)
    if reason:
        raise ConfigError(f"checkpoint {prefix} is unreadable ({reason}); pick another one")
    return [(chosen_step, prefix)]


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
    """A run's `tf.train.Checkpoint` and its manager.

    Every worker of a multi-worker run takes part in a save (the variables
    are read collectively), but only the chief's copy is kept: the others
    write their newest one only, to a scratch directory of their own (named
    by the run and the worker, so that a killed worker's is reused, not
    leaked), removed by `close`.

    Args:
      directory: the run directory.
      chief: whether this worker writes the real checkpoints.
      max_to_keep: the newest checkpoints kept.
      keep_every_n_hours: also keep one checkpoint per this many hours.
      worker: this worker's index (names a non-chief's scratch directory).
      **objects: what to save, as for `tf.train.Checkpoint`.
    """

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
        self.checkpoint = tf.train.Checkpoint(**objects)
        # The weights and optimizer state; other state may hold NaN on purpose.
        self._variables = [
            v for name in ("model", "optimizer") for v in _variables_of(objects.get(name))
        ]
        self.manager = tf.train.CheckpointManager(
            self.checkpoint,
            self.save_dir,
            max_to_keep=max_to_keep,
            keep_checkpoint_every_n_hours=keep_every_n_hours,
            checkpoint_name=PREFIX,
        )

    def finite(self) -> bool:
        """Whether every floating-point variable of the model and optimizer is finite."""
        return bool(_all_finite(self._variables))

    def save(self, step: int) -> str:
        """Saves as `ckpt-<step>`; returns its prefix.

        The caller makes sure the weights are finite first (`finite()`): the
        trainer's `sync.GlobalModel.ready` checks once per step, on every
        worker, before any save.
        """
        return self.manager.save(checkpoint_number=step)

    def restore(self, prefix: str) -> None:
        """Restores everything from `prefix`.

        Raises:
          ConfigError: when the checkpoint does not match the objects (another
            model or optimizer saved it).
        """
        try:
            self.checkpoint.restore(prefix).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as error:
            raise ConfigError(
                f"cannot resume from {prefix} ({first_line(error)}); it was saved by another model "
                "or optimizer; use a new --model_dir, or --restart to move the old run aside"
            ) from None

    def close(self) -> None:
        if self.save_dir != self.directory:
            shutil.rmtree(self.save_dir, ignore_errors=True)


def _variables_of(obj) -> list[tf.Variable]:
    return list(getattr(obj, "variables", [])) if obj is not None else []


def restore_model(model, prefix: str) -> None:
    """Restores only the model from a training checkpoint (which holds more).

    Raises:
      ConfigError: when the checkpoint holds another model.
    """
    try:
        status = tf.train.Checkpoint(model=model).restore(prefix).expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        raise ConfigError(
            f"checkpoint {prefix} does not match the model of the run's {CONFIG_FILE} "
            f"({first_line(error)})"
        ) from None
