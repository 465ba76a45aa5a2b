"""Exact evaluation on 1 and 3 towers, against NumPy and a single device."""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.distribute import mirrored_strategy
from resnet_app.data import input_pipeline
from resnet_app.data.settings import data_config
from resnet_app.engine import exact_eval
from resnet_app.nets.resnet import create_model

TOWERS = ["/cpu:0", "/cpu:1", "/cpu:2"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("cache"))
    return input_pipeline.create_pipeline(
        data_config(dataset="shapes", data_dir=cache, train_examples=64, eval_examples=1001)
    )


def tiny_model():
    model = create_model("tiny", num_classes=10)
    model.build((None, 32, 32, 3))
    return model


@pytest.fixture(scope="module")
def weights(pipeline):
    model = tiny_model()
    # A random tiny network predicts nearly one class for everything. Centre
    # and stretch its logits so that predictions vary across examples: the
    # comparison below then discriminates.
    kernel, bias = model.logits.kernel, model.logits.bias
    kernel.assign(tf.random.stateless_normal(kernel.shape, seed=[1, 2]) * 30)
    images, _ = normalized_eval_images(pipeline)
    bias.assign(-tf.reduce_mean(model(images, training=False), axis=0))
    return model.get_weights()


def normalized_eval_images(pipeline):
    split = pipeline.eval_split()
    config = pipeline.preprocessing
    mean, std = np.array(config.mean, np.float32), np.array(config.std, np.float32)
    return (split.images.astype(np.float32) - mean) / std, split.labels


def reference(pipeline, weights):
    """Per-example predictions from one plain model call on NumPy-normalized images."""
    model = tiny_model()
    model.set_weights(weights)
    images, labels = normalized_eval_images(pipeline)
    logits = model(images, training=False).numpy().astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(len(logits)), labels].mean()
    return logits.argmax(axis=1), labels, loss


def strategy_for(towers):
    if towers == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    return mirrored_strategy(TOWERS[:towers])


@pytest.mark.parametrize("towers", [1, 3])
def test_every_example_counted_once_and_accuracy_matches_numpy(pipeline, weights, towers):
    strategy = strategy_for(towers)
    with strategy.scope():
        model = tiny_model()
    model.set_weights(weights)
    result = exact_eval.evaluate(model, pipeline, 64, strategy=strategy, collect=True)

    predictions, labels, loss = reference(pipeline, weights)
    assert len(set(predictions.tolist())) > 3  # A discriminating check.
    assert result.examples == 1001
    assert sorted(result.ids.tolist()) == list(range(1001))
    order = np.argsort(result.ids)
    np.testing.assert_array_equal(result.labels[order], labels)
    np.testing.assert_array_equal(result.predictions[order], predictions)
    assert result.accuracy == np.sum(predictions == labels) / 1001
    np.testing.assert_allclose(result.loss, loss, rtol=1e-5)
    assert result.confusion is None  # Opt-in: the trainer's evaluations skip it.

    # Same model and strategy, now with the confusion matrix: a step compiled
    # without it must not be reused.
    counted = exact_eval.evaluate(model, pipeline, 64, strategy=strategy, confusion=True)
    expected = np.zeros((10, 10), np.int64)
    np.add.at(expected, (labels, predictions), 1)
    assert counted.confusion.dtype == np.int64
    np.testing.assert_array_equal(counted.confusion, expected)
    np.testing.assert_equal(
        *(exact_eval.eval_record(0, "test", r, "fp32") for r in (counted, result))
    )
    correct = np.bincount(labels[predictions == labels], minlength=10)
    np.testing.assert_array_equal(
        counted.per_class_accuracy(), correct / np.bincount(labels, minlength=10)
    )


def test_fewer_examples_than_towers(tmp_path, weights):
    # 2 examples on 3 towers: one tower sees only padding, and nobody crashes.
    pipeline = input_pipeline.create_pipeline(
        data_config(dataset="shapes", data_dir=str(tmp_path), train_examples=8, eval_examples=2)
    )
    strategy = strategy_for(3)
    with strategy.scope():
        model = tiny_model()
    model.set_weights(weights)
    result = exact_eval.evaluate(
        model, pipeline, 64, strategy=strategy, collect=True, confusion=True
    )
    predictions, labels, _ = reference(pipeline, weights)
    assert result.examples == 2
    expected = np.zeros((10, 10), np.int64)
    np.add.at(expected, (labels, predictions), 1)
    np.testing.assert_array_equal(result.confusion, expected)  # 64 padding slots not counted.
    assert sorted(result.ids.tolist()) == [0, 1]
    assert result.accuracy == np.mean(predictions == labels)


def test_per_class_accuracy_of_a_class_without_examples_is_nan():
    confusion = np.array([[3, 1, 0], [0, 0, 0], [2, 0, 2]])
    accuracy = exact_eval.per_class_accuracy(confusion)
    np.testing.assert_array_equal(accuracy, [0.75, np.nan, 0.5])
    with pytest.raises(ValueError, match="confusion=True"):
        exact_eval.EvalResult(1, 1.0, 1.0, 0.0).per_class_accuracy()


def test_the_eval_record_names_its_numbers_and_precision():
    result = exact_eval.EvalResult(examples=37, accuracy=0.25, top5_accuracy=0.75, loss=1.5)
    assert exact_eval.eval_record(4, "test", result, "bf16") == {
        "step": 4,
        "split": "test",
        "top1": 0.25,
        "top5": 0.75,
        "loss": 1.5,
        "num_examples": 37,
        "precision": "bf16",
    }


def test_per_replica_batch_rounds_up():
    assert exact_eval.per_replica_batch_size(64, 3) == 22
    assert exact_eval.per_replica_batch_size(64, 1) == 64
    assert exact_eval.per_replica_batch_size(2, 3) == 1


def test_a_file_that_fails_to_decode_is_skipped_and_reported(tmp_path, weights, caplog):
    # It passes the header check (JPEG markers at both ends) but is not a JPEG.
    png = tf.io.encode_png(tf.zeros([32, 32, 3], tf.uint8) + 90).numpy()
    for split in ("train", "test"):
        for i in range(3):
            (tmp_path / split / "a").mkdir(parents=True, exist_ok=True)
            (tmp_path / split / "a" / f"{i}.png").write_bytes(png)
        (tmp_path / split / "a" / "fake.jpg").write_bytes(
            b"\xff\xd8\xff" + b"\x17" * 300 + b"\xff\xd9"
        )
    pipeline = input_pipeline.create_pipeline(
        data_config(dataset=f"folder:{tmp_path}", image_size=32, num_classes=1)
    )
    assert pipeline.num_eval_examples() == 4
    batches = list(pipeline.train_dataset(2).take(4))  # Training goes on past it.
    assert all(-1 not in batch["id"].numpy() for batch in batches)
    model = tiny_model()
    model.set_weights(weights)
    result = exact_eval.evaluate(model, pipeline, 4)
    assert result.examples == 3
    assert any("Evaluated 3 of the 4 examples" in r.getMessage() for r in caplog.records)
