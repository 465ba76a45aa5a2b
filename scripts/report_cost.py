"""`benchmark.py report`: `resnet-app report` against `resnet-app evaluate`, launch to exit.

Both commands on the same checkpoint and split, alternating in each round (the
order reversed every other round), each writing into its own fresh report
directory; the ratio of their median wall times.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import timing
from timing import median

COMMANDS = ("evaluate", "report")


def seconds(command: str, options: dict, root: str) -> float:
    argv = [sys.executable, "-m", f"resnet_app.{command}", f"--model_dir={options['model_dir']}"]
    argv += [f"--report_dir={tempfile.mkdtemp(dir=root)}"] + options["flags"].split()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=timing.REPO)
    if done.returncode:
        timing.fail(f"{command} failed: {done.stderr.strip().splitlines()[-1]}")
    return time.perf_counter() - start


def report(options: dict) -> dict:
    if not os.path.isdir(options["model_dir"]):
        timing.fail(f"--model_dir={options['model_dir']}: no such run directory")
    with tempfile.TemporaryDirectory() as root:
        found = timing.in_rounds(
            COMMANDS, options["rounds"], lambda c: seconds(c, options, root), alternate=True
        )
    return {"cpu": timing.cpu().to_dict(), "model_dir": options["model_dir"], "seconds": found}


def text(result: dict) -> str:
    evaluate, page = (median(result["seconds"][c]) for c in COMMANDS)
    rows = [[c, *(f"{s:.1f}" for s in result["seconds"][c])] for c in COMMANDS]
    rounds = len(result["seconds"]["evaluate"])
    header = ["command", *(f"round {i + 1} (s)" for i in range(rounds))]
    return (
        f"{timing.cpu_line(result['cpu'])}\n{result['model_dir']}\n\n"
        f"{timing.markdown_table(header, rows)}\n\n"
        f"report / evaluate, medians: {page / evaluate:.3f} ({page:.1f} s / {evaluate:.1f} s)"
    )


def add_parser(commands) -> None:
    sub = commands.add_parser("report", help="resnet-app report against evaluate, wall time")
    sub.add_argument("--model_dir", required=True, help="a run directory with a checkpoint")
    sub.add_argument("--flags", default="", help="more flags for both, e.g. '--split=test'")
    sub.add_argument("--rounds", type=int, default=3, help="runs of each command")
    sub.add_argument("--json", action="store_true", help="one JSON object, not a table")
