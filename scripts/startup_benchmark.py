"""What a run's start costs with resnet_app's functions traced as written, against AutoGraph.

    python scripts/startup_benchmark.py                        # tiny and resnet20
    python scripts/startup_benchmark.py --models=resnet50 --image_size=224 --batch_size=8

Runs the same short training command in fresh processes, alternating two
variants round by round: `as_written`, the trainer as shipped
(`compat.trace_as_written`: AutoGraph converts only the functions a
`tf.function` wraps and the ones marked `converted_by_autograph`), and
`autograph`, the same trainer with that rule undone, so that AutoGraph
rewrites every resnet_app function it meets, as TensorFlow does by default.
Prints the CPU, then per model and variant the median wall and CPU seconds of
the whole process (import, set-up, tracing, the steps, an evaluation) and the
ratio of the two variants. Compare ratios of one run of this script, never
seconds across machines.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_MODELS = flags.DEFINE_list("models", ["tiny", "resnet20"], "Presets to start.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds; each runs every variant once.")
_STEPS = flags.DEFINE_integer("steps", 10, "Training steps per run.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Global batch size.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", None, "Training image size (preset's default).")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("as_written", "autograph")

# The trainer, with AutoGraph's rule for resnet_app undone when asked.
CHILD = """
import runpy, sys
variant = sys.argv.pop(1)
if variant == "autograph":
    from tensorflow.python.autograph.core import config
    from resnet_app.common import compat
    rules = config.CONVERSION_RULES
    config.CONVERSION_RULES = tuple(r for r in rules if "resnet_app" not in str(r))
    compat.trace_as_written = lambda package="resnet_app": None
sys.argv = ["train", *sys.argv[1:]]
runpy.run_module("resnet_app.train", run_name="__main__")
"""


def run_once(variant: str, model: str, work: str, index: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one training process."""
    args = [
        "--dataset=shapes",
        f"--model={model}",
        f"--batch_size={_BATCH.value}",
        f"--train_steps={_STEPS.value}",
        f"--eval_every={_STEPS.value}",
        f"--log_every={_STEPS.value}",
        "--set=data.train_examples=512",
        "--set=data.eval_examples=100",
        f"--set=data.data_dir={os.path.join(work, 'data')}",
        f"--model_dir={os.path.join(work, f'{model}_{variant}_{index}')}",
    ]
    if _IMAGE_SIZE.value:
        args.append(f"--set=data.image_size={_IMAGE_SIZE.value}")
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", CHILD, variant, *args], capture_output=True, text=True, env=env
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode:
        sys.exit(f"error: the {variant} run of {model} failed: {result.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str]) -> None:
    del argv
    sys.path.insert(0, ROOT)
    from resnet_app.common import hardware

    work = tempfile.mkdtemp(prefix="startup_benchmark_")
    sys.stdout.write(f"cpu: {hardware.read_cpu_info().describe()}\n")
    sys.stdout.write(f"{_STEPS.value} steps at batch {_BATCH.value}, {_ROUNDS.value} rounds\n")
    run_once("as_written", _MODELS.value[0], work, -1)  # Writes the dataset's cache.
    for model in _MODELS.value:
        times = {variant: [] for variant in VARIANTS}
        for index in range(_ROUNDS.value):
            for variant in VARIANTS:
                times[variant].append(run_once(variant, model, work, index))
        median = {v: [statistics.median(t[i] for t in times[v]) for i in (0, 1)] for v in VARIANTS}
        for variant in VARIANTS:
            wall, cpu = median[variant]
            sys.stdout.write(f"{model:<10} {variant:<11} wall {wall:6.2f} s  cpu {cpu:6.2f} s\n")
        (wall, cpu), (base_wall, base_cpu) = median["as_written"], median["autograph"]
        sys.stdout.write(
            f"{model:<10} as_written / autograph: wall {wall / base_wall:.2f}x, "
            f"cpu {cpu / base_cpu:.2f}x ({base_cpu - cpu:.2f} CPU s less per start)\n"
        )


if __name__ == "__main__":
    app.run(main)
