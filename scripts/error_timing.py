"""How fast ten common mistakes are answered, and with how much else on the screen.

    python scripts/error_timing.py                      # this checkout
    python scripts/error_timing.py --root=/tmp/old      # another checkout, to compare

Runs each mistake as a user would (`python -m resnet_app.train ...` from an
empty folder, the network probe pointed at a closed port so that "offline" is
the same everywhere) and prints, per mistake: the seconds to the exit, whether
TensorFlow was imported (a module that cannot be imported stands in for it
in a second run: the mistake is found before TensorFlow when that run gives
the same one line), the count of other stderr lines, and the error line.
Times depend on the machine: compare the two columns of one run of this
script, or two checkouts run one after the other, never across machines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_ROOT = flags.DEFINE_string(
    "root",
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "The checkout whose resnet_app runs (PYTHONPATH).",
)

MISTAKES = (
    ("misspelled flag", "resnet_app.train", "--batch_sise=64"),
    ("unknown config key", "resnet_app.train", "--set", "train.bogus=1"),
    ("missing recipe", "resnet_app.train", "--config=cifar10_resnet57"),
    ("unknown model", "resnet_app.train", "--model=resnet51"),
    ("unknown dataset", "resnet_app.train", "--dataset=cifar11"),
    ("cifar10 offline", "resnet_app.train", "--dataset=cifar10"),
    ("missing folder", "resnet_app.train", "--dataset=folder:/nonexistent/dir"),
    ("missing table", "resnet_app.train", "--dataset=csv:/nonexistent/table.csv"),
    ("missing init_from", "resnet_app.train", "--init_from=/nonexistent/weights.h5"),
    (
        "unknown export format",
        "resnet_app.export",
        "--model_dir=/nonexistent",
        "--export_dir=out",
        "--format=onnxx",
    ),
)


def run(module: str, args: tuple[str, ...], work: str, no_tensorflow: str | None):
    """(seconds, the error line, other stderr lines)."""
    path = os.pathsep.join(p for p in (no_tensorflow, _ROOT.value) if p)
    env = {**os.environ, "PYTHONPATH": path, "RESNET_APP_NETWORK_PROBE": "127.0.0.1:9"}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=work, capture_output=True, text=True, env=env
    )
    seconds = time.monotonic() - started
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    return seconds, (errors[-1] if errors else "(no error line)"), len(lines) - len(errors)


def main(argv: list[str]) -> None:
    del argv
    work = tempfile.mkdtemp(prefix="error_timing_")
    blocked = os.path.join(work, "no_tensorflow")
    os.makedirs(os.path.join(blocked, "tensorflow"))
    with open(os.path.join(blocked, "tensorflow", "__init__.py"), "w") as f:
        f.write("raise ImportError('TensorFlow was imported')\n")
    sys.stdout.write(f"root: {_ROOT.value}\n")
    sys.stdout.write(f"{'mistake':<22} {'seconds':>7}  {'before TF':<9} {'other':>5}  error line\n")
    for name, module, *args in MISTAKES:
        seconds, line, others = run(module, tuple(args), work, None)
        _, blocked_line, _ = run(module, tuple(args), work, blocked)
        before = "yes" if blocked_line == line and line.startswith("error: ") else "no"
        shown = line if len(line) <= 110 else line[:107] + "..."
        sys.stdout.write(f"{name:<22} {seconds:7.2f}  {before:<9} {others:5d}  {shown}\n")


if __name__ == "__main__":
    app.run(main)
