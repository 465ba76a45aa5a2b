"""Does starting from pretrained weights help? Fine-tuning against training from scratch.

  python scripts/transfer_demo.py [--work_dir=DIR] [--shots=20] [--seeds=0,1,2]

Pretrains ResNet-20 on `shapes` classes 0-4 (circle ... five classes), then
trains on classes 5-9 with only `--shots` training images per class, twice
with the same budget (epochs, schedule, batch): once from the pretrained run
(`train.init_from`, a new 5-class head) and once from random weights. Both
are evaluated exactly on the same held-out images of classes 5-9 (all of
`shapes`'s test images of those classes). The datasets are image folders
written under --work_dir, read as `folder:` datasets, as a user's would be.

Slow (a few minutes on 2 cores): not part of the test suite. Prints one JSON
line per seed and a summary table.
"""

import json
import os
import sys
import tempfile

from absl import flags, logging

from resnet_app.common import cli
from resnet_app.common.errors import ConfigError

_WORK_DIR = flags.DEFINE_string(
    "work_dir", None, "Where datasets and runs go (default: a temp dir)."
)
_SHOTS = flags.DEFINE_integer("shots", 20, "Training images per target class.")
_PRETRAIN_EXAMPLES = flags.DEFINE_integer(
    "pretrain_examples", 25_000, "Source-class training images (all: about 25,000)."
)
_PRETRAIN_EPOCHS = flags.DEFINE_float("pretrain_epochs", 4, "Pretraining epochs.")
_FINETUNE_STEPS = flags.DEFINE_integer("finetune_steps", 300, "Steps of each target run.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds of the target runs (the pretraining uses 0).")
SOURCE_CLASSES, TARGET_CLASSES = range(0, 5), range(5, 10)


def write_folder(root: str, images_by_split: dict, classes) -> str:
    """Writes `root/<split>/<class name>/<i>.png`; returns the `folder:` dataset name."""
    import numpy as np
    import tensorflow as tf

    from resnet_app.data import shapes

    for split, (images, labels, per_class) in images_by_split.items():
        for label in classes:
            directory = os.path.join(root, split, shapes.CLASS_NAMES[label])
            os.makedirs(directory, exist_ok=True)
            for i, index in enumerate(np.flatnonzero(labels == label)[:per_class]):
                path = os.path.join(directory, f"{i}.png")
                tf.io.write_file(path, tf.io.encode_png(images[index]))
    return f"folder:{root}"


def run(config_sets: list[str], model_dir: str) -> dict:
    from resnet_app import config
    from resnet_app.engine import loop

    resolved = config.resolve(sets=config_sets)
    summary = loop.train_and_evaluate(resolved, model_dir).summary
    return {"top1": summary["top1"], "num_examples": summary["num_examples"]}


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if _SHOTS.value < 1 or _FINETUNE_STEPS.value < 1 or _PRETRAIN_EXAMPLES.value < 10:
        raise ConfigError("--shots and --finetune_steps must be 1 or more")
    from resnet_app.data import sources

    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="transfer_demo_")
    shapes = sources.load_shapes()
    train, test = shapes.split("train"), shapes.split("test")
    per_source_class = _PRETRAIN_EXAMPLES.value // len(SOURCE_CLASSES)
    source_data = write_folder(
        os.path.join(work, "source"),
        {
            "train": (train.images, train.labels, per_source_class),
            "test": (test.images, test.labels, 200),
        },
        SOURCE_CLASSES,
    )
    target_data = write_folder(
        os.path.join(work, "target"),
        {
            "train": (train.images, train.labels, _SHOTS.value),
            "test": (test.images, test.labels, 10**9),
        },
        TARGET_CLASSES,
    )
    common = ["model.name=resnet20", "train.log_every=50", "schedule.name=cosine"]
    pretrained_dir = os.path.join(work, "pretrained")
    source = run(
        [
            *common,
            f"data.dataset={source_data}",
            f"train.epochs={_PRETRAIN_EPOCHS.value}",
            "schedule.warmup_epochs=0.2",
        ],
        pretrained_dir,
    )
    logging.info("Pretrained on classes 0-4: top-1 %.4f", source["top1"])
    target = [
        *common,
        f"data.dataset={target_data}",
        f"train.train_steps={_FINETUNE_STEPS.value}",
        "train.batch_size=32",
        "train.eval_every=100",
    ]
    results = []
    for seed in _SEEDS.value:
        seeded = [*target, f"train.seed={int(seed)}"]
        finetuned = run(
            [
                *seeded,
                f"train.init_from={pretrained_dir}",
                "optimizer.learning_rate=0.01",
                "train.lr_multipliers={head: 10}",
            ],
            os.path.join(work, f"finetuned_{seed}"),
        )
        scratch = run(
            [*seeded, "optimizer.learning_rate=0.1"], os.path.join(work, f"scratch_{seed}")
        )
        record = {
            "seed": int(seed),
            "shots": _SHOTS.value,
            "finetuned_top1": finetuned["top1"],
            "scratch_top1": scratch["top1"],
            "test_examples": finetuned["num_examples"],
            "pretrained_top1": source["top1"],
        }
        results.append(record)
        sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.write(f"{'seed':>4}  {'fine-tuned':>10}  {'scratch':>8}\n")
    for record in results:
        seed, finetuned, scratch = (
            record[key] for key in ("seed", "finetuned_top1", "scratch_top1")
        )
        sys.stdout.write(f"{seed:>4}  {finetuned:>10.4f}  {scratch:>8.4f}\n")


if __name__ == "__main__":
    cli.run(main)
