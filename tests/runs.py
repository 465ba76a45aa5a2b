"""Small training runs for tests: the tiny network on 64 `shapes` images, and their records."""

import json
import os

from resnet_app import config


def small_config(tmp_path, *sets, **train):
    """Tiny network, 64 training and 37 evaluation images, batch 16 (4 steps an epoch).

    Args:
      tmp_path: the test's directory (the data is cached under it).
      *sets: more `section.key=value` settings.
      **train: `train.` settings applied last, e.g. train_steps=4.
    """
    return config.resolve(
        sets=[
            "model.name=tiny",
            f"data.data_dir={tmp_path / 'data'}",
            "data.train_examples=64",
            "data.eval_examples=37",
            "train.batch_size=16",
            *sets,
        ],
        overrides={"train": train},
    )


def read_records(model_dir):
    """The run's metrics.jsonl records."""
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
