"""`data.eval_image_size`: train at one size, evaluate (and serve) at another (ImageNet recipe).

The reference for evaluation at size S is the pipeline of a run whose
training size is S, whose evaluation path is tested on its own
(tests/test_preprocessing.py); a run trained at 32 px and evaluated at 48 px
must see exactly those images.
"""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.data import families, input_pipeline, preprocessing
from resnet_app.data.settings import data_config
from tests import runs


def _pipeline(**fields):
    config = dict(
        dataset="shapes", train_examples=64, eval_examples=16, preprocessing="imagenet", **fields
    )
    return input_pipeline.create_pipeline(data_config(**config))


def _first(dataset, key="image"):
    return next(iter(dataset))[key].numpy()


def test_evaluation_at_another_size_is_that_sizes_evaluation():
    mixed = _pipeline(image_size=32, eval_image_size=48)
    reference = _pipeline(image_size=48)
    assert mixed.preprocessing.eval_resize == reference.preprocessing.eval_resize == 55
    assert mixed.preprocessing.eval_size == 48 and reference.preprocessing.eval_size == 48
    assert _first(mixed.train_dataset(8)).shape == (8, 32, 32, 3)
    np.testing.assert_array_equal(_first(mixed.eval_dataset(8)), _first(reference.eval_dataset(8)))
    # The 5 crops of --tta=crops, and a served image, are at the evaluation size too.
    image = tf.constant(np.random.default_rng(0).integers(0, 256, (40, 60, 3), np.uint8))
    crops = preprocessing.imagenet_eval_crops(image, mixed.preprocessing)
    expected = preprocessing.imagenet_eval_crops(image, reference.preprocessing)
    np.testing.assert_array_equal(crops.numpy(), expected.numpy())
    served = families.of(mixed.preprocessing).evaluate(image, mixed.preprocessing, encoded=False)
    assert served.shape == (48, 48, 3)


def test_eval_image_size_is_refused_for_the_cifar_recipe_and_below_eval_resize():
    with pytest.raises(ConfigError, match="eval_image_size=48: the CIFAR recipe"):
        input_pipeline.create_pipeline(
            data_config(dataset="shapes", train_examples=64, eval_image_size=48)
        )
    with pytest.raises(ConfigError, match="eval_resize=40 is smaller than the evaluation size 48"):
        _pipeline(image_size=32, eval_image_size=48, eval_resize=40)
    with pytest.raises(ConfigError, match="eval_image_size must be a whole number >= 8, got 4"):
        data_config(eval_image_size=4)


def test_a_run_trained_at_32_is_evaluated_and_served_at_48(tmp_path):
    """The trainer's evaluation and the export both see 48 px images: they agree
    with the model applied to the images of a 48 px run's pipeline."""
    import dataclasses

    from resnet_app.engine import loop
    from resnet_app.export import portable, savedmodel

    sets = ("data.preprocessing=imagenet", "data.image_size=32", "data.eval_image_size=48")
    resolved = runs.small_config(tmp_path, *sets, train_steps=4)
    result = loop.train_and_evaluate(resolved, str(tmp_path / "run"))
    data = dataclasses.replace(resolved.data, image_size=48, eval_image_size=None)
    reference = input_pipeline.create_pipeline(data)
    correct = total = 0
    losses = []
    for batch in reference.eval_dataset(37):
        logits = result.model(batch["image"], training=False).numpy().astype(np.float64)
        mask = batch["mask"].numpy() > 0
        labels = batch["label"].numpy()[mask]
        correct += int(np.sum(logits.argmax(-1)[mask] == labels))
        total += int(mask.sum())
        shifted = logits[mask] - logits[mask].max(-1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        losses.extend(-log_softmax[np.arange(len(labels)), labels])
    assert total == 37
    assert result.summary["top1"] == correct / total
    assert result.summary["loss"] == pytest.approx(np.mean(losses), rel=1e-5)

    served, _ = savedmodel.load(str(tmp_path / "run"))
    assert served.preprocessing.eval_size == 48
    images = np.random.default_rng(1).integers(0, 256, (3, 40, 60, 3), np.uint8)
    pixels = tf.stack(
        [
            families.of(reference.preprocessing).evaluate(x, reference.preprocessing, encoded=False)
            for x in images
        ]
    )
    expected = result.model(pixels, training=False).numpy()
    actual = served.serve_images(tf.constant(images))["logits"].numpy()
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    # The TFLite/ONNX classifier crops 48 px out of its 55 px input inside.
    classifier = portable.PortableClassifier(result.model, served.preprocessing)
    fixed = np.stack([portable.fixed_size_image(x, served.preprocessing) for x in images])
    assert fixed.shape == (3, 55, 55, 3)
    probabilities = classifier.classify(tf.constant(fixed))["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, tf.nn.softmax(expected).numpy(), atol=1e-3)
