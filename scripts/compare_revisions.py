"""Training speed of two revisions, side by side: each one's `scripts/benchmark.py`, in rounds.

    python scripts/compare_revisions.py --before=3687e08
    python scripts/compare_revisions.py --before=main~5 --variants=fp32,bf16 --rounds=4
    python scripts/compare_revisions.py --before=A --after=B --variants=fp32   # to bisect

A refactoring must not slow training. This exports revision `--before` (git
archive, into a temporary directory) beside the working tree (or revision
`--after`, exported alike), and runs each one's own `scripts/benchmark.py` with its own
code first on PYTHONPATH, once per round, in alternating order, so that a
slow spell of a shared machine falls on both. Every benchmark process times
`keras_fit` too: each variant's speed is taken as its ratio to that
`keras_fit`, measured in the same process's round, which cancels most of the
machine's drift. The table gives, per variant, each revision's median ratio
over the rounds and after / before; the spread over the rounds says what
noise is. The first line is the CPU (its kind decides the kernels), as every
benchmark here prints it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from resnet_app.common import cli  # noqa: E402

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined when it runs (importing the module defines none)."""
    flags.DEFINE_string("before", None, "The git revision to compare against.")
    flags.DEFINE_string("after", None, "The revision to compare (default: the working tree).")
    flags.DEFINE_string(
        "variants", "fp32,bf16", "benchmark.py's trainer variants to time (keras_fit is added)."
    )
    flags.DEFINE_integer("rounds", 3, "Benchmark processes per revision.")
    flags.DEFINE_string("model", "resnet20", "The model preset.")
    flags.DEFINE_integer("batch_size", 128, "Global batch.")
    flags.DEFINE_integer("steps", 20, "Steps per timed window.")
    flags.DEFINE_integer("windows", 3, "Timed windows per variant (their median).")


def export_revision(revision: str, directory: str, name: str = "before") -> str:
    """`revision`'s tree under `directory`; its path. Raises ConfigError if git cannot."""
    from resnet_app.common.errors import ConfigError

    archive = os.path.join(directory, "tree.tar")
    result = subprocess.run(
        ["git", "-C", REPO, "archive", "--format=tar", f"--output={archive}", revision],
        capture_output=True,
        text=True,
    )
    if result.returncode:
        raise ConfigError(f"--before={revision}: git cannot export it ({result.stderr.strip()})")
    tree = os.path.join(directory, name)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def run_benchmark(tree: str, variants: list[str]) -> dict:
    """One `scripts/benchmark.py --json` run of the code in `tree`."""
    command = [
        sys.executable,
        os.path.join(tree, "scripts", "benchmark.py"),
        f"--variants={','.join(['keras_fit', *variants])}",
        f"--model={FLAGS.model}",
        f"--batch_size={FLAGS.batch_size}",
        f"--steps={FLAGS.steps}",
        f"--windows={FLAGS.windows}",
        "--json",
    ]
    env = {**os.environ, "PYTHONPATH": tree}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
    if result.returncode:
        raise RuntimeError(f"benchmark in {tree} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout)


def ratios(report: dict, variants: list[str]) -> dict[str, float]:
    """Each variant's images/s over keras_fit's, in one benchmark run."""
    base = report["variants"]["keras_fit"]["images_per_sec"]
    return {v: report["variants"][v]["images_per_sec"] / base for v in variants}


def table(before: list[dict], after: list[dict], variants: list[str]) -> list[str]:
    """The comparison, one row per variant."""
    rows = ["variant   before x fit (rounds)        after x fit (rounds)         after/before"]
    for variant in variants:
        old = [r[variant] for r in before]
        new = [r[variant] for r in after]
        shown = [
            f"{statistics.median(v):.3f} ({' '.join(f'{x:.2f}' for x in v)})" for v in (old, new)
        ]
        change = statistics.median(new) / statistics.median(old)
        rows.append(f"{variant:<9} {shown[0]:<28} {shown[1]:<28} {change:.3f}")
    return rows


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if not FLAGS.before:
        cli.fail("--before: name the git revision to compare against, e.g. --before=main~3")
    if FLAGS.rounds < 1:
        cli.fail(f"--rounds={FLAGS.rounds}: use 1 or more")
    variants = [v.strip() for v in FLAGS.variants.split(",") if v.strip() and v != "keras_fit"]
    with tempfile.TemporaryDirectory(prefix="compare_revisions_") as directory:
        after = export_revision(FLAGS.after, directory, "after") if FLAGS.after else REPO
        trees = {"before": export_revision(FLAGS.before, directory), "after": after}
        results: dict[str, list[dict]] = {"before": [], "after": []}
        cpu = None
        for round_number in range(FLAGS.rounds):
            order = ("before", "after") if round_number % 2 == 0 else ("after", "before")
            for side in order:
                report = run_benchmark(trees[side], variants)
                cpu = cpu or report["cpu"]
                results[side].append(ratios(report, variants))
                print(f"round {round_number + 1} {side}: {results[side][-1]}", flush=True)
    print(
        f"CPU: {cpu['model']} [{', '.join(cpu['isa'])}], oneDNN {'on' if cpu['onednn'] else 'off'}"
    )
    print(
        f"{FLAGS.model}, batch {FLAGS.batch_size}, {FLAGS.steps} steps x {FLAGS.windows} "
        f"windows; before = {FLAGS.before}, after = {FLAGS.after or 'the working tree'}"
    )
    print("\n".join(table(results["before"], results["after"], variants)))


if __name__ == "__main__":
    define_flags()
    cli.run(main)
