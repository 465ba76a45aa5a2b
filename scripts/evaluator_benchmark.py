"""What an evaluator beside the trainer costs the trainer: its step rate alone and with one.

  python scripts/evaluator_benchmark.py [--config=shapes_quickstart] [--epochs=1]
      [--checkpoint_every=250] [--rounds=2]

Trains the same run (a new run directory each time) with `resnet-app train`,
its own evaluation off but at the end and a checkpoint every
`--checkpoint_every` steps, alternately alone and with `resnet-app evaluate
--watch` following it from a second process on the same machine, `--rounds`
times each. Prints the CPU, each run's training rate (the median of the
trainer's logged examples/s, its first record left out as warm-up), whether
the watcher evaluated every checkpoint, and the ratio of the medians
(with / alone), measured in this run.

On one machine the two processes share its cores, so the ratio is the worst
case; an evaluator on its own machine or pod (a TFJob's evaluator replica, a
SLURM step on another node) takes nothing from the trainer but the reads of
the shared run directory.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import flags

from resnet_app.common import cli, hardware, run_dir

_CONFIG = flags.DEFINE_string("config", "shapes_quickstart", "The recipe trained.")
_EPOCHS = flags.DEFINE_float("epochs", 1.0, "Epochs per run (the recipe's warmup must fit).")
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 250, "Steps between checkpoints.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Runs of each kind (alone, with the watcher).")


def train(model_dir: str, watched: bool) -> tuple[float, int, int]:
    """Trains one run; returns its median examples/s, the checkpoints it saved and those
    the watcher reported."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    watcher = None
    if watched:
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "resnet_app.evaluate",
                f"--model_dir={model_dir}",
                "--watch",
                "--watch_every=1",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    try:
        trained = subprocess.run(
            [
                sys.executable,
                "-m",
                "resnet_app.train",
                f"--config={_CONFIG.value}",
                f"--model_dir={model_dir}",
                f"--epochs={_EPOCHS.value}",
                "--set=train.eval_every=1000000000",
                f"--set=train.checkpoint_every={_CHECKPOINT_EVERY.value}",
                "--set=train.keep_checkpoints=1000",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if trained.returncode != 0:
            raise RuntimeError(f"training failed: {trained.stderr.strip().splitlines()[-1:]}")
        reported = 0
        if watcher is not None:
            output, _ = watcher.communicate(timeout=3600)
            if watcher.returncode != 0:
                raise RuntimeError(f"the watcher failed with status {watcher.returncode}")
            reported = len(output.splitlines())
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()  # Training failed, or the watcher hung: leave no process behind.
            watcher.wait()
    with open(os.path.join(model_dir, run_dir.METRICS_FILE)) as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    rates = [r["examples_per_sec"] for r in records if "examples_per_sec" in r][1:]
    saved = len([name for name in os.listdir(model_dir) if run_dir.checkpoint_step(name)])
    return statistics.median(rates), saved, reported


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    print(f"CPU: {hardware.read_cpu_info().describe()}")
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as root:
        for round_index in range(_ROUNDS.value):
            for watched in (False, True):
                model_dir = os.path.join(root, f"run{round_index}_{int(watched)}")
                rate, saved, reported = train(model_dir, watched)
                rates[watched].append(rate)
                kind = "with the watcher" if watched else "alone"
                extra = (
                    f", the watcher reported {reported} of {saved} checkpoints" if watched else ""
                )
                print(f"round {round_index}: {kind:16s} {rate:8.1f} examples/s{extra}", flush=True)
    alone, beside = statistics.median(rates[False]), statistics.median(rates[True])
    print(
        f"trainer's rate with the watcher / alone: {beside / alone:.3f} "
        f"({beside:.1f} / {alone:.1f} examples/s, medians of {_ROUNDS.value})"
    )


if __name__ == "__main__":
    cli.run(main)
