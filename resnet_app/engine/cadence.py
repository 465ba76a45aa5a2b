"""What is due at a step, and how far a compiled call may run: pure functions of the step.

A call runs to `next_boundary`: the end, `steps_per_loop` steps on (Orbit's
`min(steps - current, steps_per_loop)`) or the next step that logs, evaluates
or saves. There `due_at` says what is due (big_vision's `itstime`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

# A periodic evaluation or checkpoint under every/4 steps before the end is left to
# the end's: "every epoch" of 468.75 steps would evaluate at 1,404 and again at 1,407.
NEAR_END_FRACTION = 4


def is_due(step: int, every: int, total: int | None = None) -> bool:
    """Whether a job run every `every` steps (and at `total`, if given) is due at `step`."""
    return step % every == 0 or step == total


def is_due_before_the_end(step: int, every: int, total: int) -> bool:
    """`is_due(step, every, total)`, but not at a multiple under every/4 steps from the end."""
    if step == total:
        return True
    return step % every == 0 and total - step >= max(1, every // NEAR_END_FRACTION)


def next_multiple(step: int, every: int) -> int:
    """The first multiple of `every` after `step`."""
    return (step // every + 1) * every


def round_up(every: int, multiple: int) -> int:
    """`every` rounded up to a multiple of `multiple`."""
    return -(-every // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Intervals:
    """The run's last step, and how often (in steps) it logs (and reads the LR
    override), evaluates, saves, and the most steps one compiled call runs."""

    total: int
    log_every: int
    eval_every: int
    checkpoint_every: int
    steps_per_loop: int


def create_intervals(
    total: int,
    steps_per_epoch: int,
    log_every: int,
    eval_every: int | None = None,
    checkpoint_every: int | None = None,
    steps_per_loop: int | None = None,
    align: Callable[[str, int], int] | None = None,
) -> Intervals:
    """The intervals from the `train.` settings: evaluations once per epoch, checkpoints
    at every evaluation and calls of `log_every` steps unless set; `align(name, every)`
    is the sync policy's rounding (model averaging saves only at averages)."""
    align = align or (lambda name, every: every)
    evaluations = eval_every or steps_per_epoch
    eval_every = align("eval_every", evaluations)
    checkpoint_every = align("checkpoint_every", checkpoint_every or evaluations)
    return Intervals(total, log_every, eval_every, checkpoint_every, steps_per_loop or log_every)


@dataclasses.dataclass(frozen=True)
class Due:
    """Which periodic jobs are due at a step: a training record, an evaluation, a save."""

    log: bool = False
    evaluate: bool = False
    checkpoint: bool = False

    @property
    def read_override(self) -> bool:
        """Read `model_dir/lr_override`: at every training record."""
        return self.log


def due_at(step: int, intervals: Intervals) -> Due:
    """What is due at `step`, the last step of a call: records and evaluations also at
    the end; the end's checkpoint is decided elsewhere (actions.py)."""
    return Due(
        log=is_due(step, intervals.log_every, intervals.total),
        evaluate=is_due_before_the_end(step, intervals.eval_every, intervals.total),
        checkpoint=step % intervals.checkpoint_every == 0
        and is_due_before_the_end(step, intervals.checkpoint_every, intervals.total),
    )


def next_boundary(step: int, intervals: Intervals, *limits: int | None) -> int:
    """The last step of the next call after `step`, in (step, total]; `limits` are more
    steps it must not run past (None: none), e.g. the next model average a save waits for."""
    return min(
        intervals.total,
        step + intervals.steps_per_loop,
        next_multiple(step, intervals.log_every),
        next_multiple(step, intervals.eval_every),
        next_multiple(step, intervals.checkpoint_every),
        *(limit for limit in limits if limit is not None),
    )
