"""What is due at a step, and how far a compiled call may run: pure functions of the step.

The controller (`controller.py`) runs the compiled multi-step function up to
the next boundary, `next_boundary`: the end of the run, `steps_per_loop`
steps on (Orbit's `min(steps - current, steps_per_loop)`), or the next step
that logs, evaluates or saves, whichever comes first. At that step it asks
`due_at` which of the periodic jobs are due (big_vision's `itstime`): a
training record (and with it a read of `model_dir/lr_override`) every
`log_every` steps and at the end, an evaluation every `eval_every` steps and
at the end, a checkpoint every `checkpoint_every` steps (the last evaluation
and checkpoint before the end are left out when the end is under a quarter of
their interval later: the end's evaluation and save come instead).

No TensorFlow here: these are unit-tested in milliseconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


def is_due(step: int, every: int, total: int | None = None) -> bool:
    """Whether a job run every `every` steps (and at `total`, if given) is due at `step`.

    Args:
      step: the step just finished (1 or more).
      every: the job's interval in steps.
      total: the run's last step, when the job is also due there.

    Returns:
      True at every multiple of `every`, and at `total`.
    """
    return step % every == 0 or step == total


# A periodic evaluation or checkpoint this close to the end (under a quarter of
# its interval) is left to the end's: with an epoch of 468.75 steps, "every
# epoch" of a 3-epoch run would evaluate at 1,404 and again at 1,407.
NEAR_END_FRACTION = 4


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
    """How often the loop does each of its jobs, in steps.

    Attributes:
      total: the run's last step.
      log_every: a training record (and a read of the LR override).
      eval_every: an evaluation (also at the end).
      checkpoint_every: a checkpoint (also at every evaluation).
      steps_per_loop: the most steps one compiled call runs.
    """

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
    """The run's intervals from its `train.` settings, with their defaults.

    Args:
      total: the run's length in steps.
      steps_per_epoch: the default of `eval_every`.
      log_every: `train.log_every`, also the default of `steps_per_loop`.
      eval_every: `train.eval_every`, or None for once per epoch.
      checkpoint_every: `train.checkpoint_every`, or None for every evaluation.
      steps_per_loop: `train.steps_per_loop`, or None for `log_every`.
      align: (name, interval) -> the interval the sync policy allows (model
        averaging rounds evaluations and checkpoints up to its averages).

    Returns:
      The `Intervals`.
    """
    align = align or (lambda name, every: every)
    evaluations = eval_every or steps_per_epoch
    checkpoints = checkpoint_every or evaluations
    return Intervals(
        total=total,
        log_every=log_every,
        eval_every=align("eval_every", evaluations),
        checkpoint_every=align("checkpoint_every", checkpoints),
        steps_per_loop=steps_per_loop or log_every,
    )


@dataclasses.dataclass(frozen=True)
class Due:
    """Which periodic jobs are due at a step.

    Attributes:
      log: write a training record.
      evaluate: evaluate the whole evaluation split.
      checkpoint: save a checkpoint.
    """

    log: bool = False
    evaluate: bool = False
    checkpoint: bool = False

    @property
    def read_override(self) -> bool:
        """Read `model_dir/lr_override`: at every training record."""
        return self.log


def due_at(step: int, intervals: Intervals) -> Due:
    """What is due at `step`, the last step of a call.

    Args:
      step: the step just finished.
      intervals: the run's intervals.

    Returns:
      The `Due` jobs: records and evaluations every interval and at the end,
      checkpoints every `checkpoint_every` steps (and, decided elsewhere, at
      evaluations and after an override); an evaluation or checkpoint under a
      quarter of its interval before the end is left to the end's.
    """
    return Due(
        log=is_due(step, intervals.log_every, intervals.total),
        evaluate=is_due_before_the_end(step, intervals.eval_every, intervals.total),
        checkpoint=step % intervals.checkpoint_every == 0
        and is_due_before_the_end(step, intervals.checkpoint_every, intervals.total),
    )


def next_boundary(step: int, intervals: Intervals, *limits: int | None) -> int:
    """The last step of the next compiled call, which starts after `step`.

    A call never crosses the end of the run, a training record, an
    evaluation or a checkpoint, nor runs more than `steps_per_loop` steps.

    Args:
      step: the step the call starts after.
      intervals: the run's intervals.
      *limits: more steps the call must not run past (None: no limit), e.g.
        the next model average when a save waits for it.

    Returns:
      A step in (step, total].
    """
    return min(
        intervals.total,
        step + intervals.steps_per_loop,
        next_multiple(step, intervals.log_every),
        next_multiple(step, intervals.eval_every),
        next_multiple(step, intervals.checkpoint_every),
        *(limit for limit in limits if limit is not None),
    )
