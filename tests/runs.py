"""Small training runs for tests: the tiny network on 64 `shapes` images, and their records."""

import os

import numpy as np
import tensorflow as tf

from resnet_app import config
from resnet_app.common import metrics


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


def evaluated_ids(pipeline, batch_size, num_shards=1):
    """The sorted ids of every real (unmasked) example the evaluation pipelines yield."""
    return sorted(
        int(i)
        for index in range(num_shards)
        for batch in pipeline.eval_dataset(batch_size, num_shards=num_shards, shard_index=index)
        for i in batch["id"].numpy()[batch["mask"].numpy() > 0]
    )


def read_records(model_dir):
    """The run's metrics.jsonl records, read by the app's reader, after checking that a line
    is damaged only where a killed process left it: the file's last line, or one followed by
    the restarted run's "start" event (on that line or the next)."""
    path = os.path.join(model_dir, metrics.METRICS_FILE)
    with open(path) as f:
        lines = [line.strip() for line in f if line.strip()]
    for i, line in enumerate(lines):
        record, whole = metrics._parse_line(line)
        if whole:
            continue
        if record is None and i + 1 < len(lines):
            record = metrics._parse_line(lines[i + 1])[0]
        last = record is None and i + 1 == len(lines)
        assert last or (record or {}).get("event") == "start", f"{path}: line {i + 1}: {line}"
    return metrics.read_records(path)


def fault_rng():
    """The random source of a test's fault points (where a process is killed), seeded by the
    test's id and printed, so that a failure replays."""
    import random
    import zlib

    test_id = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    seed = zlib.crc32(test_id.encode())
    print(f"fault points of {test_id}: random.Random({seed})")
    return random.Random(seed)


def saved_tensors(prefix):
    """Every value in a checkpoint, by key, read without any model code."""
    reader = tf.train.load_checkpoint(str(prefix))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def assert_same_checkpoints(expected_prefix, actual_prefix, context=""):
    """Two checkpoints hold the same keys and bitwise the same values.

    Returns:
      The expected checkpoint's tensors, by key.
    """
    expected, actual = saved_tensors(expected_prefix), saved_tensors(actual_prefix)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=f"{name} {context}")
    return expected


def copy_with_temperature(model_dir, destination, temperature, step):
    """A copy of a run directory holding a temperature "fitted" on checkpoint ckpt-`step`
    (the record's other numbers are placeholders)."""
    import shutil

    from resnet_app.evaluation import calibration

    shutil.copytree(model_dir, destination)
    record = {"temperature": temperature, "checkpoint": f"ckpt-{step}", "step": step}
    record["weights"] = "raw"
    record.update(split="holdout", num_examples=1, nll_before=1, nll_after=1)
    record.update(ece_before=0, ece_after=0)
    calibration.save_temperature(str(destination), record)
    return destination
