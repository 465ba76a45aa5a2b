"""A run that diverged: a non-finite loss or weights, then an error or a rollback.

The controller raises `DivergedError` for a non-finite loss, `sync.GlobalModel` for
non-finite weights (checked before every evaluation and save). `roll_back` makes it
a one-line error (`train.on_nan=stop`) or restores the last good checkpoint with the
rate times `train.nan_lr_factor`, at most `config.MAX_ROLLBACKS` times.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import logging

from resnet_app import config as config_lib
from resnet_app.common import checkpoint
from resnet_app.common.errors import ConfigError
from resnet_app.common.metrics import MetricsWriter

if TYPE_CHECKING:
    from resnet_app.engine.setup import Run


class DivergedError(Exception):
    """`what` ("the loss" or "the weights") went non-finite at `step` (never shown:
    `roll_back` turns it into a `ConfigError` or a rollback)."""

    def __init__(self, step: int, what: str):
        super().__init__(step, what)
        self.step = step
        self.what = what


def roll_back(run: Run, writer: MetricsWriter, diverged: DivergedError) -> int:
    """Restores the last good checkpoint into `run` and returns its step, or raises
    `ConfigError` (`on_nan=stop`, no checkpoint, or `MAX_ROLLBACKS` used up)."""
    train, step = run.config.train, diverged.step
    latest = checkpoint.find_latest(run.model_dir)
    kept = f"the last good checkpoint is {latest[1]}" if latest else "no checkpoint was written"
    if train.on_nan != "rollback":
        raise ConfigError(
            f"training diverged: {diverged.what} is not finite at step {step}; {kept}. Lower "
            "the learning rate (optimizer.learning_rate), or rerun with --on_nan=rollback"
        )
    count = int(run.rollback_count.numpy())
    if latest is None or count >= config_lib.MAX_ROLLBACKS:
        raise ConfigError(
            f"training diverged at step {step} after {count} rollback(s) (at most "
            f"{config_lib.MAX_ROLLBACKS}); {kept}. Lower the learning rate "
            "(optimizer.learning_rate)"
        )
    scale = run.learning_rate.state()[1]
    run.restore(latest[1], verb="Rolled back to")
    value, restored_scale = run.learning_rate.state()
    # A second rollback to the same checkpoint lowers the rate further; the checkpoint
    # is not rewritten (a crash while overwriting it would lose it).
    new_scale = min(scale, restored_scale) * train.nan_lr_factor
    run.learning_rate.set_state(value, new_scale)
    run.rollback_count.assign(count + 1)
    logging.error(
        "ROLLBACK %d/%d: %s is not finite at step %d; restored step %d from %s and "
        "multiplied the learning rate by %g (now x%g of the schedule)",
        count + 1, config_lib.MAX_ROLLBACKS, diverged.what, step, latest[0], latest[1],
        train.nan_lr_factor, new_scale,
    )  # fmt: skip
    writer.write({"step": step, "event": "rollback", "to_step": latest[0], "lr_scale": new_scale})
    return latest[0]
