"""What every benchmark here shares: child processes, rounds, medians and the report.

Each measurement runs in a fresh process that prints one JSON line (its peak
memory is its own, and no measurement warms up another), in rounds: each kind
once per round, so that a slow spell of a shared machine falls on every kind.
A report is one JSON object, or markdown tables under the CPU it ran on (its
kind decides the kernels: compare ratios of one run, never times across machines).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The trainer's command in a child that prints its peak memory at the end; the
# variant "last_step" keeps the copy of the last step that multi-worker runs keep.
TRAINER = """
import json, os, resource, runpy, sys
if sys.argv.pop(1) == "last_step":
    from resnet_app.engine import loop
    assert hasattr(loop, "keeps_last_step"), "the loop no longer asks keeps_last_step"
    loop.keeps_last_step = lambda run: True
sys.argv[0] = "train"
try:
    runpy.run_module("resnet_app.train", run_name="__main__")
except SystemExit as done:
    if done.code:
        raise
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
bfc = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true")
print(json.dumps({"peak_rss_mb": rss, "bfc_allocator": bfc}))
"""


class Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one `error:` line and exit status 2, as the app's."""

    def error(self, message: str):
        fail(message)


def fail(message: str):
    sys.stderr.write(f"error: {message}\n")
    sys.exit(2)


def run_child(argv: Sequence[str], tree: str = REPO, env: dict | None = None) -> dict:
    """Runs `python ARGV` on the code in `tree`; the JSON of its last line."""
    environment = {**os.environ, "PYTHONPATH": tree, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    # The working directory comes first on sys.path: it must be the tree measured.
    done = subprocess.run(
        [sys.executable, *argv], cwd=tree, capture_output=True, text=True, env=environment
    )
    if done.returncode:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(argv[:3])[:80]} failed: {tail}")
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def run_trainer(variant: str, args: Sequence[str], tree: str = REPO) -> dict:
    """`python -m resnet_app.train ARGS` of `tree`, through TRAINER."""
    return run_child(["-c", TRAINER, variant, *args], tree)


def read_records(path: str) -> list[dict]:
    """A run's metrics.jsonl (a file format the app keeps, so its code is not imported)."""
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


def window_rates(times: Sequence[float], per_window: int) -> list[float]:
    """Items/s between consecutive times, the first window (the warm-up) dropped."""
    return [per_window / (b - a) for a, b in zip(times[1:], times[2:])]


def in_rounds(kinds: Iterable, rounds: int, measure: Callable, alternate: bool = False) -> dict:
    """{kind: [measure(kind) of each round]}; `alternate` reverses every other round."""
    kinds, found = list(kinds), {kind: [] for kind in kinds}
    for number in range(rounds):
        for kind in kinds[::-1] if alternate and number % 2 else kinds:
            found[kind].append(measure(kind))
    return found


def median(values: Iterable[float | None]) -> float | None:
    """The median, or None when any value is None (a run that missed)."""
    values = list(values)
    return None if not values or None in values else statistics.median(values)


def number(value: float | None, form: str = ".1f") -> str:
    return "-" if value is None else format(value, form)


def cpu():
    """This machine's `hardware.CpuInfo`."""
    from resnet_app.common import hardware

    return hardware.read_cpu_info()


def cpu_line(found: dict) -> str:
    from resnet_app.common import hardware

    return f"CPU: {hardware.CpuInfo.from_dict(found).describe()}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> str:
    """A markdown table, columns padded to line up; columns of numbers right-aligned."""
    rows = [[str(cell) for cell in row] for row in rows]
    columns = range(len(header))
    widths = [max([len(header[i]), *(len(r[i]) for r in rows)]) for i in columns]
    numeric = [i and all(r[i][:1].isdigit() or r[i] == "-" for r in rows) for i in columns]

    def line(cells):
        padded = (c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cells, widths, numeric))
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * (w + 1) + ":" if n else "-" * (w + 2) for w, n in zip(widths, numeric)]
    return "\n".join([line(header), "|" + "|".join(rule) + "|", *map(line, rows)])


def emit(report: dict, text: Callable[[dict], str], as_json: bool) -> None:
    """Prints the report as one JSON object, or as `text(report)`."""
    sys.stdout.write((json.dumps(report, indent=1) if as_json else text(report)) + "\n")
