"""The test suite's most expensive files, from pytest's JUnit XML report.

    .venv/bin/python -m pytest -q --junitxml=/tmp/suite.xml
    python scripts/test_durations.py /tmp/suite.xml              # the 15 costliest files
    python scripts/test_durations.py /tmp/suite.xml --before=/tmp/old.xml --top=20

Prints a Markdown table (BUILD.md's "Tests and lint" keeps one): per file, its
tests, the seconds they took (setup, call and teardown, summed over both xdist
processes) and the slowest test; with --before, that report's seconds beside
them. The total is CPU-process seconds, about twice the wall time on 2 workers.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ElementTree


def read(path: str) -> dict[str, list[tuple[float, str]]]:
    """{test file: [(seconds, test name), ...]} of a JUnit XML report."""
    files = collections.defaultdict(list)
    for case in ElementTree.parse(path).iter("testcase"):
        module = case.get("classname", "")
        name = module.replace(".", "/") + ".py"
        files[name].append((float(case.get("time", 0)), case.get("name", "")))
    return dict(files)


def table(files: dict, top: int, before: dict | None = None) -> list[str]:
    totals = {name: sum(t for t, _ in cases) for name, cases in files.items()}
    ranked = sorted(totals, key=totals.get, reverse=True)[:top]
    header = "| file | tests | seconds |" + (" before |" if before is not None else "")
    lines = [header + " slowest test |", "|---|---|---|" + ("---|" if before else "") + "---|"]
    for name in ranked:
        seconds, slowest = max(files[name])
        row = f"| {name.removeprefix('tests/')} | {len(files[name])} | {totals[name]:.0f} |"
        if before is not None:
            row += f" {sum(t for t, _ in before.get(name, [])):.0f} |"
        lines.append(row + f" {slowest[:60]} ({seconds:.0f} s) |")
    everything = sum(totals.values())
    count = sum(len(cases) for cases in files.values())
    total = f"| all {len(files)} files | {count} | {everything:.0f} |"
    if before is not None:
        total += f" {sum(t for cases in before.values() for t, _ in cases):.0f} |"
    return [*lines, total + " |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", help="pytest --junitxml output")
    parser.add_argument("--before", help="an earlier report, for a column beside")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    before = read(args.before) if args.before else None
    print("\n".join(table(read(args.report), args.top, before)))


if __name__ == "__main__":
    main()
