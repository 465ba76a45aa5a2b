"""What making a checkpoint durable costs: a save with and without the sync to disk.

  python scripts/checkpoint_sync_benchmark.py [--models=resnet20,resnet50] [--rounds=5]
      [--directory=DIR]

Saves each model's training checkpoint (the weights, BatchNorm statistics and
the momentum slots, as the trainer saves them) with the trainer's
`checkpoint.RunCheckpoint`, alternating a durable save (the chief's: every
file and the directory synced before older checkpoints are deleted) with the
same save without the sync, `--rounds` times each, keeping 2 checkpoints as
a rotating run does. Prints the CPU, the filesystem of `--directory` (the
sync's cost is the disk's, so run it where your runs write), and per model
the checkpoint's size, the median seconds per save of each kind and their
ratio, measured in this process.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time

from absl import flags

from resnet_app.common import cli

_MODELS = flags.DEFINE_list("models", ["resnet20", "resnet50"], "Model presets.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Saves of each kind per model (median).")
_DIRECTORY = flags.DEFINE_string(
    "directory", None, "Where to save (default: a temporary directory)."
)


def filesystem(path: str) -> str:
    found = subprocess.run(
        ["df", "--output=fstype,source", path], capture_output=True, text=True, check=False
    ).stdout.split("\n")
    return " ".join(found[1].split()) if len(found) > 1 else "unknown"


def build(name: str):
    import tensorflow as tf

    from resnet_app.engine import optim
    from resnet_app.nets import presets
    from resnet_app.nets.resnet import create_model

    # The variables do not depend on the image size: build on small images.
    imagenet = presets.get_config(name).init_max_pool
    model = create_model(name, num_classes=1000 if imagenet else 10)
    model.build((None, 64, 64, 3))
    optimizer = optim.create_optimizer({"class": "momentum", "learning_rate": 0.1})
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    return dict(model=model, optimizer=optimizer, global_step=step)


def measure(name: str, directory: str, rounds: int) -> dict[str, float]:
    from resnet_app.common import checkpoint, disk_space

    saved = checkpoint.RunCheckpoint(directory, chief=True, max_to_keep=2, **build(name))
    times: dict[bool, list[float]] = {True: [], False: []}
    step = 0
    for _ in range(rounds + 1):  # The first round warms up.
        for durable in (True, False):
            step += 1
            saved._durable = durable  # noqa: SLF001 - the one switch we measure.
            start = time.perf_counter()
            prefix = saved.save(step)
            times[durable].append(time.perf_counter() - start)
    size = disk_space.files_size(checkpoint._checkpoint_files(prefix))  # noqa: SLF001
    durable, plain = (statistics.median(times[kind][1:]) for kind in (True, False))
    return {"bytes": size, "durable": durable, "plain": plain}


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    from resnet_app.common import disk_space, hardware

    directory = _DIRECTORY.value or tempfile.mkdtemp(prefix="checkpoint_sync_")
    print(f"CPU: {hardware.read_cpu_info().describe()}")
    print(f"directory: {directory} ({filesystem(directory)}); median of {_ROUNDS.value} saves")
    print(f"{'model':<10} {'checkpoint':>10} {'plain s':>8} {'durable s':>9} {'ratio':>6}")
    for name in _MODELS.value:
        run = os.path.join(directory, name)
        shutil.rmtree(run, ignore_errors=True)
        found = measure(name, run, _ROUNDS.value)
        print(
            f"{name:<10} {disk_space.format_bytes(found['bytes']):>10} {found['plain']:>8.3f} "
            f"{found['durable']:>9.3f} {found['durable'] / found['plain']:>5.2f}x"
        )
        shutil.rmtree(run, ignore_errors=True)
    if not _DIRECTORY.value:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    cli.run(main)
