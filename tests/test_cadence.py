"""What is due at a step, how far a call may run, and the interval's record: pure Python.

References are computed another way: by walking the steps one at a time
(`walk`), and by hand.
"""

import itertools
import math
import subprocess
import sys

import pytest

from resnet_app.engine import cadence
from resnet_app.engine.train_metrics import Interval
from tests.commands import REPO


def walk(step, intervals, limit=None):
    """The next boundary, found by trying each following step in turn."""
    for candidate in itertools.count(step + 1):
        if (
            candidate == intervals.total
            or candidate - step == intervals.steps_per_loop
            or candidate == limit
            or any(
                candidate % every == 0
                for every in (
                    intervals.log_every,
                    intervals.eval_every,
                    intervals.checkpoint_every,
                )
            )
        ):
            return candidate


@pytest.mark.parametrize(
    "total,log_every,eval_every,checkpoint_every,steps_per_loop",
    [(10, 3, 4, 5, 3), (17, 5, 7, 7, 2), (12, 100, 100, 100, 100), (9, 1, 2, 4, 1)],
)
def test_next_boundary_is_the_first_step_that_ends_a_call(
    total, log_every, eval_every, checkpoint_every, steps_per_loop
):
    intervals = cadence.Intervals(total, log_every, eval_every, checkpoint_every, steps_per_loop)
    for step in range(total):
        assert cadence.next_boundary(step, intervals) == walk(step, intervals), step
        for limit in range(step + 1, total + 1):
            assert cadence.next_boundary(step, intervals, None, limit) == walk(
                step, intervals, limit
            )


def test_a_run_visits_the_boundaries_worked_out_by_hand():
    """10 steps, records every 3, evaluations every 4, checkpoints every 5, 3 steps a call."""
    intervals = cadence.create_intervals(
        10, steps_per_epoch=4, log_every=3, checkpoint_every=5, steps_per_loop=None
    )
    assert intervals == cadence.Intervals(10, 3, 4, 5, 3)
    step, visited = 0, []
    while step < intervals.total:
        step = cadence.next_boundary(step, intervals)
        visited.append((step, cadence.due_at(step, intervals)))
    assert [s for s, _ in visited] == [3, 4, 5, 6, 8, 9, 10]
    assert [s for s, due in visited if due.log] == [3, 6, 9, 10]  # And at the end.
    assert [s for s, due in visited if due.read_override] == [3, 6, 9, 10]
    assert [s for s, due in visited if due.evaluate] == [4, 8, 10]  # And at the end.
    assert [s for s, due in visited if due.checkpoint] == [5, 10]


def test_every_epoch_of_a_run_whose_epoch_is_not_whole_evaluates_once_at_the_end():
    """3 epochs of 60,000 images in batches of 128: 1,407 steps, an epoch is 468.75."""
    intervals = cadence.create_intervals(1407, steps_per_epoch=468, log_every=100)
    due = [step for step in range(1, 1408) if cadence.due_at(step, intervals).evaluate]
    saved = [step for step in range(1, 1408) if cadence.due_at(step, intervals).checkpoint]
    assert due == [468, 936, 1407]  # Not 1,404 and then 1,407.
    assert saved == [468, 936]  # The end's save is decided at the end.
    # A quarter of an interval or more before the end, it stays.
    intervals = cadence.create_intervals(1521, steps_per_epoch=468, log_every=100)
    due = [step for step in range(1, 1522) if cadence.due_at(step, intervals).evaluate]
    assert due == [468, 936, 1404, 1521]


def test_defaults_and_alignment_of_the_intervals():
    # eval_every: an epoch; checkpoint_every: eval_every; steps_per_loop: log_every.
    assert cadence.create_intervals(50, 7, log_every=5) == cadence.Intervals(50, 5, 7, 7, 5)
    assert cadence.create_intervals(
        50, 7, log_every=5, eval_every=4, checkpoint_every=6, steps_per_loop=2
    ) == cadence.Intervals(50, 5, 4, 6, 2)
    # Model averaging every 3 steps rounds evaluations and checkpoints up, not records.
    asked = []

    def align(name, every):
        asked.append(name)
        return cadence.round_up(every, 3)

    aligned = cadence.create_intervals(50, 7, log_every=5, checkpoint_every=2, align=align)
    assert aligned == cadence.Intervals(50, 5, 9, 3, 5)
    assert asked == ["eval_every", "checkpoint_every"]


def test_small_helpers():
    assert [cadence.next_multiple(s, 4) for s in (0, 3, 4, 5)] == [4, 4, 8, 8]
    assert [cadence.round_up(e, 3) for e in (1, 3, 4, 6)] == [3, 3, 6, 6]
    assert cadence.is_due(6, 3) and not cadence.is_due(7, 3) and cadence.is_due(7, 3, total=7)
    assert cadence.due_at(7, cadence.Intervals(8, 2, 4, 4, 2)) == cadence.Due()


class Result:
    """What a compiled call returns (`step.LoopResult`), by hand."""

    def __init__(self, steps, examples, loss, correct, regularization, input_wait):
        self.steps = steps
        self.sums = {
            "examples": examples,
            "loss": loss,
            "correct": correct,
            "regularization": regularization,
        }
        self.input_wait = input_wait


def test_interval_record_by_hand():
    interval = Interval(clock=lambda: 1234.5)
    interval.add(Result(2, 32.0, 64.0, 8.0, 0.2, 0.5), seconds=2.0)
    interval.add(Result(0, 0.0, 0.0, 0.0, 0.0, 0.0), seconds=1.0)  # Stopped at once: time only.
    interval.add(Result(1, 16.0, 16.0, 4.0, 0.1, 0.25), seconds=1.0)
    record = interval.take(step=3, epoch=0.75, learning_rate=0.05)
    # 80 nats over 48 examples, plus 0.3 of regularization over 3 steps.
    assert record == {
        "step": 3,
        "epoch": 0.75,
        "loss": pytest.approx(80 / 48 + 0.1),
        "accuracy": pytest.approx(12 / 48),
        "learning_rate": 0.05,
        "examples_per_sec": pytest.approx(48 / 4),
        "input_wait": pytest.approx(0.75 / 4),
        "time": 1234.5,
    }
    # Taken: the next interval starts empty.
    assert interval.steps == 0 and interval.seconds == 0 and not any(interval.sums.values())
    empty = interval.take(step=3, epoch=0.75, learning_rate=0.05)
    assert empty["loss"] == 0 and empty["accuracy"] == 0 and math.isfinite(empty["input_wait"])


def test_input_wait_is_a_fraction():
    interval = Interval()
    interval.add(Result(1, 16.0, 16.0, 4.0, 0.0, input_wait=3.0), seconds=2.0)
    assert interval.take(1, 0.25, 0.1)["input_wait"] == 1.0


def test_the_pure_loop_modules_need_no_tensorflow():
    """cadence, train_metrics, plan and the resume guard import without TensorFlow or Keras."""
    code = (
        "import sys\n"
        "from resnet_app.engine import cadence, plan, resume, train_metrics\n"
        "heavy = sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
