"""A timed run's way to a target accuracy, read from its events (no TF).

The events are `metrics.jsonl`'s records, as the trainer writes them and as
`keras_baseline.fit_recipe` writes them for Keras `fit`:
- {"event": "start", "time"}: the first step is about to run;
- training marks {"step", "time"} (the trainer's records also have
  "input_wait", the fraction of the interval spent waiting for data);
- evaluations {"step", "top1", "time" (at their end), "seconds"}.
Times are Unix seconds; the run was launched at `launched`.

Where the time goes, up to the end of the crossing evaluation:
- start-up: launch to the start event (imports, data, model, compile calls
  that run before the loop);
- compile: the first interval's excess over the steady per-step time (the
  median of the later intervals', each less the evaluations inside it);
- evaluation: the evaluations up to the crossing;
- input: the trainer's wait for its batches (None for `fit`: Keras does not say);
- steps: the rest (later compiles, such as a new image size's, included).
"""

from __future__ import annotations

import dataclasses
import statistics

from resnet_app.common import metrics


@dataclasses.dataclass(frozen=True)
class Timing:
    """One run's way to the target.

    Attributes:
      seconds: launch to the end of the first evaluation at or above the
        target (None: never reached).
      without_evals: `seconds` less the evaluations up to it.
      step, images, epochs: where the target was reached (None: never).
      final_top1, best_top1: the last evaluation's and the best.
      startup, compile, evaluation, input, steps: `seconds` split as the
        module docstring says (up to the last evaluation when missed).
      total: launch to the end of the last evaluation.
    """

    seconds: float | None
    without_evals: float | None
    step: int | None
    images: int | None
    epochs: float | None
    final_top1: float
    best_top1: float
    startup: float
    compile: float
    evaluation: float
    input: float | None
    steps: float
    total: float


def read_events(path: str) -> list[dict]:
    return metrics.read_records(path)


def _intervals(marks: list[dict], evals: list[dict], start: float) -> list[tuple[dict, int, float]]:
    """(mark, steps, training seconds) of each interval: its wall time less its evaluations."""
    intervals, step, clock = [], 0, start
    for mark in marks:
        inside = sum(e["seconds"] for e in evals if step <= e["step"] < mark["step"])
        intervals.append((mark, mark["step"] - step, mark["time"] - clock - inside))
        step, clock = mark["step"], mark["time"]
    return intervals


def timing(
    records: list[dict], launched: float, target: float, batch_size: int, examples: int
) -> Timing:
    """A run's `Timing` from its events.

    Args:
      records: the run's events (`read_events`).
      launched: when its process was launched (Unix seconds).
      target: the test top-1 to reach.
      batch_size: its global batch (for the images to the target).
      examples: its training examples per epoch.
    """
    start = next(r["time"] for r in records if r.get("event") == "start")
    evals = [r for r in records if "top1" in r and "time" in r]
    marks = [r for r in records if "time" in r and "event" not in r and "top1" not in r]
    if not evals or len(marks) < 2:
        raise ValueError("a timed run needs evaluations and at least two training marks")
    crossing = next((e for e in evals if e["top1"] >= target), None)
    end = crossing or evals[-1]
    evaluation = sum(e["seconds"] for e in evals if e["step"] <= end["step"])
    intervals = _intervals(marks, evals, start)
    steady = statistics.median(seconds / steps for _, steps, seconds in intervals[1:])
    compile_seconds = max(0.0, intervals[0][2] - intervals[0][1] * steady)
    waited = None
    if all("input_wait" in mark for mark, _, _ in intervals):
        waited = sum(m["input_wait"] * s for m, _, s in intervals if m["step"] <= end["step"])
    seconds = end["time"] - launched
    startup = start - launched
    reached = crossing is not None
    return Timing(
        seconds=seconds if reached else None,
        without_evals=seconds - evaluation if reached else None,
        step=end["step"] if reached else None,
        images=end["step"] * batch_size if reached else None,
        epochs=end["step"] * batch_size / examples if reached else None,
        final_top1=evals[-1]["top1"],
        best_top1=max(e["top1"] for e in evals),
        startup=startup,
        compile=compile_seconds,
        evaluation=evaluation,
        input=waited,
        steps=seconds - startup - compile_seconds - evaluation - (waited or 0.0),
        total=evals[-1]["time"] - launched,
    )


def speedup(ours: list[Timing], theirs: list[Timing], key: str = "seconds") -> float | None:
    """Their median time over ours (`key`: seconds or without_evals); None if one missed."""
    mine, other = [getattr(t, key) for t in ours], [getattr(t, key) for t in theirs]
    if not mine or not other or None in mine or None in other:
        return None
    return statistics.median(other) / statistics.median(mine)
