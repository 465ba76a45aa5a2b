"""Dry run of a config's learning-rate schedule: print it, and optionally save or plot it.

    resnet-app schedule --config=configs/imagenet_resnet50.yaml
    resnet-app schedule --config=configs/cifar10_resnet20.yaml --csv=lr.csv --plot=lr.png
    resnet-app schedule --lr_schedule=my_schedule.py:learning_rate --dataset=cifar10

It takes every flag of `python -m resnet_app.train` and prints the function the
trainer calls (before any live override), without training or reading data: the
epoch length is the dataset's known size (or --examples_per_epoch). With
`data.progressive`, each row has its image size.
"""

from __future__ import annotations

import csv
import sys

from absl import flags, logging

from resnet_app.common import cli, files
from resnet_app.common.errors import ConfigError
from resnet_app.data import repeats
from resnet_app.engine import command_line
from resnet_app.engine.plan import plan_run

# Training split sizes of the datasets people schedule most often.
KNOWN_SIZES = {
    "shapes": 50_000,
    "synthetic": 50_000,
    "cifar10": 50_000,
    "cifar100": 50_000,
    "mnist": 60_000,
    "fashion_mnist": 60_000,
    "imagenet2012": 1_281_167,
    "imagenette": 9_469,
}

_EXAMPLES = flags.DEFINE_integer(
    "examples_per_epoch",
    None,
    "Training examples per epoch (default: the dataset's known size, less any "
    "validation_split, or data.train_examples).",
)
_CSV = flags.DEFINE_string("csv", None, "Write every step's learning rate to this CSV file.")
_PLOT = flags.DEFINE_string("plot", None, "Draw the schedule into this PNG (needs matplotlib).")
_ROWS = flags.DEFINE_integer("rows", 24, "Rows in the printed table.")


def examples_per_epoch(resolved) -> int:
    if _EXAMPLES.value:
        return _EXAMPLES.value
    name = resolved.data.dataset.split(":", 1)[0]
    size = KNOWN_SIZES.get(name)
    if size is None:
        raise ConfigError(
            f"the size of {resolved.data.dataset} is not known here; pass --examples_per_epoch=N"
        )
    if resolved.data.train_examples:
        size = min(size, resolved.data.train_examples)
    size -= resolved.data.validation_split
    return repeats.epoch_length(size, resolved.data.augment.repeats, resolved.train.batch_size)


def table_steps(total_steps: int, rows: int, also: tuple[int, ...] = ()) -> list[int]:
    """Evenly spread steps, first and last included, and the steps `also` names."""
    if total_steps <= rows:
        return list(range(total_steps))
    spread = {round(i * (total_steps - 1) / (rows - 1)) for i in range(rows)}
    return sorted(spread | {step for step in also if step < total_steps})


def final_image_size(resolved) -> int:
    """The run's image size as far as the config tells (progressive resizing's end)."""
    from resnet_app.nets.presets import get_config

    if resolved.data.image_size:
        return resolved.data.image_size
    if resolved.data.dataset.split(":", 1)[0] in KNOWN_SIZES and "imagenet" not in (
        resolved.data.dataset
    ):
        return 32
    return get_config(resolved.model_name, **resolved.model_overrides).default_image_size


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    resolved = command_line.config_from_flags()
    examples = examples_per_epoch(resolved)
    plan = plan_run(resolved, examples, final_image_size(resolved))
    rates = [plan.schedule(step, plan.steps_per_epoch) for step in range(plan.total_steps)]
    sizes = plan.sizes if plan.sizes.progressive else None
    lines = [
        f"{resolved.model_name} on {resolved.data.dataset}: {plan.total_steps} steps, "
        f"{plan.steps_per_epoch} per epoch ({examples} examples, global batch "
        f"{resolved.train.batch_size}); schedule {dict(resolved.schedule)}",
        f"{'step':>9} {'epoch':>8} {'learning rate':>14}" + (f" {'size':>6}" if sizes else ""),
    ]
    for step in table_steps(plan.total_steps, _ROWS.value, sizes.starts if sizes else ()):
        row = f"{step:>9} {step / plan.steps_per_epoch:>8.2f} {rates[step]:>14.6g}"
        lines.append(row + (f" {sizes.size_at(step):>6}" if sizes else ""))
    lines.append(f"peak {max(rates):.6g} at step {rates.index(max(rates))}; last {rates[-1]:.6g}")
    if sizes:
        lines.append(f"image sizes (data.progressive): {sizes.describe()}")
    sys.stdout.write("\n".join(lines) + "\n")
    if _CSV.value:
        with open(_CSV.value, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "epoch", "learning_rate", "image_size"])
            for step, rate in enumerate(rates):
                writer.writerow([step, step / plan.steps_per_epoch, rate, plan.sizes.size_at(step)])
        logging.info("Wrote %s", _CSV.value)
    if _PLOT.value:
        plot(rates, plan.steps_per_epoch, _PLOT.value, resolved.schedule.kind)


def plot(rates: list[float], steps_per_epoch: int, path: str, title: str) -> None:
    cli.use_matplotlib("schedule")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 3.5))
    axes.plot([step / steps_per_epoch for step in range(len(rates))], rates)
    axes.set_xlabel("epoch")
    axes.set_ylabel("learning rate")
    axes.set_title(f"{title} schedule, {len(rates)} steps")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    files.save_figure(figure, path)
    logging.info("Wrote %s", path)


if __name__ == "__main__":
    cli.run(main)
