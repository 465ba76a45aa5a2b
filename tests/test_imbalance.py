"""Class weights against a NumPy loss, class-balanced sampling, and their one-line errors."""

import os

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.config.sections import TrainSettings
from resnet_app.data import class_balance, input_pipeline
from resnet_app.data.settings import data_config
from resnet_app.engine.losses import Loss
from resnet_app.engine.losses.cross_entropy import CrossEntropy
from resnet_app.nets.resnet import create_model
from tests.test_losses import numpy_cross_entropy


def test_balanced_weights_are_n_over_classes_times_count_and_average_1():
    counts = np.array([80, 15, 5, 0])
    weights = class_balance.class_weights("balanced", list("abcd"), counts)
    # 3 classes have examples: n / (3 * count).
    np.testing.assert_allclose(weights[:3], 100 / (3 * counts[:3]), rtol=1e-6)
    assert weights[3] == 1  # No examples: its weight changes nothing.
    assert np.sum(weights * counts) / 100 == pytest.approx(1.0)  # The mean weight.
    np.testing.assert_allclose(weights[:3] * counts[:3], 100 / 3, rtol=1e-6)  # Equal totals.
    named = class_balance.class_weights({"b": 3.0}, list("abcd"), counts)
    np.testing.assert_array_equal(named, [1, 3, 1, 1])


def test_unknown_class_names_are_one_line():
    with pytest.raises(ConfigError, match=r"names dog, zebra, which the data does not have"):
        class_balance.class_weights({"zebra": 2.0, "dog": 1.0}, ["cat", "bird"], None)
    # The config refuses what no data could make right, before any data is read.
    with pytest.raises(ConfigError, match=r"^train.class_weights.cat must be balanced, or"):
        TrainSettings(class_weights={"cat": -1.0})
    with pytest.raises(ConfigError, match=r"^train.class_weights must be balanced, or .*'even'"):
        TrainSettings(class_weights="even")


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_weighted_loss_against_numpy(smoothing):
    # Seeded: the guard below needs per-example losses that the weights move,
    # which an unlucky initialization (the process's random state) did not give.
    tf.keras.utils.set_random_seed(3)
    model = create_model("tiny", num_classes=5)
    model.build((None, 8, 8, 3))
    rng = np.random.default_rng(3)
    images = rng.normal(size=(6, 8, 8, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 4, 1], np.int32)
    mask = np.array([1, 1, 1, 1, 1, 0], np.float32)
    weights = np.array([0.5, 2.0, 1.0, 4.0, 0.25], np.float32)
    batch = {"label": tf.constant(labels), "mask": tf.constant(mask)}
    logits = model(images, training=True)
    loss_sum = Loss((CrossEntropy(smoothing),), weights)(logits, batch)["loss"]
    logits = logits.numpy()
    targets = np.eye(5)[labels] * (1 - smoothing) + smoothing / 5
    expected = np.sum(mask * weights[labels] * numpy_cross_entropy(logits, targets))
    assert float(loss_sum) == pytest.approx(expected, rel=1e-5)
    unweighted = np.sum(mask * numpy_cross_entropy(logits, targets))
    assert abs(expected - unweighted) > 0.1 * unweighted  # The weights matter here.


def imbalanced(tmp_path, **fields):
    return input_pipeline.create_pipeline(
        data_config(
            dataset="shapes", data_dir=str(tmp_path), train_examples=500, eval_examples=20, **fields
        )
    )


def test_balanced_sampling_draws_classes_evenly_and_statelessly(tmp_path):
    pipeline = imbalanced(tmp_path, sampling="balanced")
    labels = pipeline.train_split.labels
    # Cut classes 0-4 to their first 3 examples, through the split itself.
    rank = np.array([np.sum(labels[:i] == label) for i, label in enumerate(labels)])
    keep = np.flatnonzero((labels >= 5) | (rank < 3))
    pipeline.train_split = pipeline.train_split.subset(keep)
    labels = pipeline.train_split.labels
    natural = np.bincount(labels, minlength=10) / len(labels)
    assert natural[:5].max() < 0.05
    draws = np.concatenate([pipeline.epoch_order(epoch) for epoch in range(20)])
    shares = np.bincount(labels[draws], minlength=10) / len(draws)
    np.testing.assert_allclose(shares, 0.1, atol=0.02)
    # A function of (seed, epoch) only: again, the same; another epoch, other draws.
    np.testing.assert_array_equal(pipeline.epoch_order(3), pipeline.epoch_order(3))
    assert not np.array_equal(pipeline.epoch_order(3), pipeline.epoch_order(4))
    # Entered mid-epoch, the stream reads what it would have read.
    whole = np.concatenate(
        [b["id"] for b in pipeline.train_dataset(10).take(6).as_numpy_iterator()]
    )
    entered = np.concatenate(
        [b["id"] for b in pipeline.train_dataset(10, start_example=30).take(3).as_numpy_iterator()]
    )
    np.testing.assert_array_equal(entered, whole[30:60])
    np.testing.assert_array_equal(whole, pipeline.epoch_order(0)[:60])


def test_balanced_sampling_of_a_streamed_source_is_one_line(tmp_path):
    from resnet_app.data import shapes
    from tests import own_data

    images, labels = shapes.generate("train", 10, seed=1)
    own_data.write_shards(str(tmp_path / "r"), "train", images, labels, [10])
    with pytest.raises(ConfigError, match="needs data read by index.*class_weights=balanced"):
        input_pipeline.create_pipeline(
            data_config(
                dataset=f"tfrecord:{tmp_path / 'r'}",
                data_dir=str(tmp_path),
                records={"label_offset": 1},
                sampling="balanced",
            )
        )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--set=train.class_weights={zebra: 2.0}"], "names zebra, which the data does not have"),
        (["--dataset=tfrecord:EMPTY"], "no train-\\* shards in"),
        (["--dataset=csv:TABLE"], "has no 'label' column; its columns are file, path"),
    ],
)
def test_bad_own_data_is_one_line_before_anything_is_written(tmp_path, flags, message):
    import re

    from tests.commands import error_line, run_command

    (tmp_path / "empty").mkdir()
    (tmp_path / "table.csv").write_text("path,file\na.png,x\n")
    flags = [
        f.replace("EMPTY", str(tmp_path / "empty")).replace("TABLE", str(tmp_path / "table.csv"))
        for f in flags
    ]
    model_dir = tmp_path / "run"
    result = run_command(
        "resnet_app.train",
        "--model=tiny",
        "--train_steps=1",
        f"--data_dir={tmp_path / 'cache'}",
        "--set=data.train_examples=32",
        *flags,
        f"--model_dir={model_dir}",
    )
    assert re.search(message, error_line(result))
    assert not model_dir.exists() or set(os.listdir(model_dir)) <= {"trainer.lock"}
