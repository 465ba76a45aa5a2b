"""Imbalanced classes: plain training against class weights and class-balanced sampling.

  python scripts/imbalance_comparison.py [--work_dir=DIR] [--seeds=0,1,2] [--epochs=12]
      [--train_examples=6000] [--minority_share=0.02] [--image_size=24]

Builds an imbalanced subset of the built-in offline `shapes` dataset: of the
first `--train_examples` training images, classes 0-4 keep only their first
`--minority_share` (2%), classes 5-9 keep all. The images are written as PNG
files with a `labels.csv` (`--dataset=csv:`), beside the balanced test split
(1,000 `shapes` test images, about 100 per class). Then ResNet-14 trains on it
three ways at the same budget (the quickstart recipe of
`configs/shapes_quickstart.yaml`: batch 32, no augmentation, cosine from LR
0.1; at `--image_size`, for `--epochs` epochs of the training split's size),
once per seed:

- plain: the data as it is;
- weights: `train.class_weights=balanced` (n / (classes * count));
- sampling: `data.sampling=balanced` (a class drawn uniformly, then one of
  its images).

Each run is evaluated at its end on the whole test split. The table gives,
per run kind, the mean and standard deviation over the seeds of the
balanced accuracy (the classes' mean recall), the minority classes' mean
recall and top-1. Slow (a minute or two per run on 2 cores): not part of the
test suite. Prints one JSON line per run, then the markdown table.
"""

import json
import math
import os
import sys
import tempfile
import time

from absl import flags, logging

from resnet_app.common import cli, metrics
from resnet_app.common.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "configs", "shapes_quickstart.yaml")
MINORITY = range(5)  # The classes cut down.
VARIANTS = {
    "plain": [],
    "weights": ["train.class_weights=balanced"],
    "sampling": ["data.sampling=balanced"],
}

_WORK_DIR = flags.DEFINE_string("work_dir", None, "Where the data and runs go (default: temp).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds (train.seed) of each kind of run.")
_EPOCHS = flags.DEFINE_float("epochs", 12, "Epochs of every run (of the imbalanced split).")
_TRAIN_EXAMPLES = flags.DEFINE_integer(
    "train_examples", 6000, "Training images to cut from: the first N of shapes's 50,000."
)
_SHARE = flags.DEFINE_float(
    "minority_share", 0.02, "The share of their images classes 0-4 keep (at least 1 each)."
)
_VARIANTS = flags.DEFINE_list("variants", list(VARIANTS), "Kinds of run, in order.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", 24, "Training size (shapes are drawn at 32).")


def write_data(root: str, train_examples: int, share: float) -> tuple[str, dict]:
    """The imbalanced training split and the test split as PNGs and labels.csv under `root`."""
    import numpy as np
    import tensorflow as tf

    from resnet_app.data import shapes

    table = os.path.join(root, "labels.csv")
    images, labels = shapes.generate("train", train_examples)
    keep = []
    for label in range(len(shapes.CLASS_NAMES)):
        members = np.flatnonzero(labels == label)
        count = max(1, math.floor(share * len(members))) if label in MINORITY else len(members)
        keep.extend(members[:count].tolist())
    keep = np.sort(keep)
    test_images, test_labels = shapes.generate("test", 1000)
    counts = np.bincount(labels[keep], minlength=10).tolist()
    if os.path.isfile(table):
        return table, {"train_counts": counts}
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    rows = []
    for split, chosen, pixels, names in (
        ("train", keep, images, labels),
        ("test", np.arange(len(test_labels)), test_images, test_labels),
    ):
        for i in chosen:
            name = os.path.join("images", f"{split}{i:05d}.png")
            tf.io.write_file(os.path.join(root, name), tf.io.encode_png(pixels[i]))
            rows.append(f"{name},{shapes.CLASS_NAMES[names[i]]},{split}")
    temporary = table + ".tmp"
    with open(temporary, "w") as file:
        file.write("path,label,split\n" + "\n".join(rows) + "\n")
    os.replace(temporary, table)
    return table, {"train_counts": counts}


def run(table: str, sets: list[str], model_dir: str) -> dict:
    """Trains into `model_dir` (resuming a finished run only evaluates); its last evaluation."""
    from resnet_app import config
    from resnet_app.data import shapes
    from resnet_app.engine import loop

    common = [
        f"data.dataset=csv:{table}",
        f"data.image_size={_IMAGE_SIZE.value}",
        f"train.epochs={_EPOCHS.value}",
        "train.eval_every=1000000000",  # Only at the end, which always evaluates.
    ]
    resolved = config.resolve(RECIPE, sets=[*common, *sets])
    started = time.monotonic()
    loop.train_and_evaluate(resolved, model_dir)
    records = metrics.read_records(os.path.join(model_dir, metrics.METRICS_FILE))
    last = [r for r in records if "balanced_accuracy" in r and "event" not in r][-1]
    # The csv source names classes in sorted order: find the cut ones by name.
    names = sorted(shapes.CLASS_NAMES)
    minority = [names.index(shapes.CLASS_NAMES[c]) for c in MINORITY]
    recall = last["per_class_recall"]
    return {
        "top1": last["top1"],
        "balanced_accuracy": last["balanced_accuracy"],
        "minority_recall": sum(recall[c] for c in minority) / len(minority),
        "majority_recall": sum(r for c, r in enumerate(recall) if c not in minority)
        / (len(recall) - len(minority)),
        "step": last["step"],
        "seconds": round(time.monotonic() - started, 1),
    }


def markdown_table(results: list[dict], variants: list[str]) -> str:
    """Per kind of run: mean +- standard deviation over the seeds."""
    import numpy as np

    keys = ("balanced_accuracy", "minority_recall", "majority_recall", "top1")
    lines = [
        "| run | seeds | balanced accuracy | minority recall | majority recall | top-1 |",
        "|:----|------:|------------------:|----------------:|----------------:|------:|",
    ]
    for variant in variants:
        rows = [r for r in results if r["variant"] == variant]
        cells = []
        for key in keys:
            values = 100 * np.array([r[key] for r in rows])
            cells.append(
                f"{values.mean():.1f} ± {values.std(ddof=1) if len(values) > 1 else 0:.1f}"
            )
        lines.append(f"| {variant} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    unknown = [name for name in _VARIANTS.value if name not in VARIANTS]
    if unknown:
        raise ConfigError(f"--variants: unknown {unknown[0]!r}; use {', '.join(VARIANTS)}")
    if _EPOCHS.value <= 0 or not 0 < _SHARE.value <= 1 or _TRAIN_EXAMPLES.value < 100:
        raise ConfigError(
            "--epochs must be more than 0, --minority_share in (0, 1], --train_examples >= 100"
        )
    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="imbalance_")
    table, counts = write_data(os.path.join(work, "data"), _TRAIN_EXAMPLES.value, _SHARE.value)
    logging.info("Training images per class (0-9): %s", counts["train_counts"])
    results = []
    for seed in (int(seed) for seed in _SEEDS.value):
        for variant in _VARIANTS.value:
            model_dir = os.path.join(work, f"{variant}_{seed}")
            sets = [f"train.seed={seed}", *VARIANTS[variant]]
            record = {"variant": variant, "seed": seed, **run(table, sets, model_dir)}
            record.update(model_dir=model_dir, epochs=_EPOCHS.value, **counts)
            results.append(record)
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()
    sys.stdout.write(markdown_table(results, _VARIANTS.value))


if __name__ == "__main__":
    cli.run(main)
