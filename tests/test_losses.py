"""The loss terms against NumPy, a toy term registered here, and an out-of-memory step."""

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.config.sections import LOSSES
from resnet_app.engine import controller, loop
from resnet_app.engine.losses import LabelTerm, Loss, label_term
from resnet_app.engine.losses.consistency import LOGITS_KEY, Consistency
from resnet_app.nets.resnet import create_model
from tests import runs


def numpy_bce(logits, targets):
    """Sigmoid binary cross-entropy per class, averaged over the classes (float64)."""
    x, z = logits.astype(np.float64), targets.astype(np.float64)
    return np.mean(np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x))), axis=-1)


def numpy_cross_entropy(logits, targets):
    x = logits.astype(np.float64)
    log_softmax = x - x.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    return -(targets * log_softmax).sum(-1)


@pytest.mark.parametrize(
    ("loss", "smoothing"), [("bce", 0.0), ("bce", 0.1), ("cross_entropy", 0.1)]
)
def test_the_loss_of_a_batch_against_numpy(loss, smoothing):
    model = create_model("tiny", num_classes=5)
    model.build((None, 8, 8, 3))
    rng = np.random.default_rng(0)
    images = rng.normal(size=(6, 8, 8, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 4, 1], np.int32)
    mask = np.array([1, 1, 1, 1, 1, 0], np.float32)  # The last example is padding.
    batch = {"label": tf.constant(labels), "mask": tf.constant(mask)}
    logits = model(images, training=True)
    loss_sum = Loss((label_term(loss)(smoothing),))(logits, batch)["loss"]
    logits = logits.numpy()
    targets = np.eye(5)[labels] * (1 - smoothing) + smoothing / 5
    reference = numpy_bce if loss == "bce" else numpy_cross_entropy
    expected = float(np.sum(mask * reference(logits, targets)))
    assert float(loss_sum) == pytest.approx(expected, rel=1e-5)


def test_out_of_memory_in_training_is_one_line(tmp_path, monkeypatch):
    def exhausted(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(
            None, None, "OOM when allocating tensor with shape[16,4,32,32]\nmore detail"
        )

    monkeypatch.setattr(controller.Controller, "train", exhausted)
    config = runs.small_config(tmp_path, train_steps=2)
    with pytest.raises(ConfigError) as raised:
        loop.train_and_evaluate(config, str(tmp_path / "run"))
    message = str(raised.value)
    assert message.startswith("out of memory training tiny on 32 px images, 16 per tower")
    assert "OOM when allocating tensor with shape[16,4,32,32]" in message
    assert "smaller --batch_size" in message and "\n" not in message


LABELS, PARTNERS = np.array([0, 1, 2], np.int32), np.array([3, 3, 0], np.int32)


def mixed_loss(weights, seed, loss, **options):
    """A mixed batch of 3 through the tiny 4-class network with smoothing 0.1:
    (the loss sum, the logits, the NumPy soft targets before smoothing)."""
    model = create_model("tiny", num_classes=4)
    model.build((None, 8, 8, 3))
    images = np.random.default_rng(seed).normal(size=(3, 8, 8, 3)).astype(np.float32)
    batch = {
        "label": tf.constant(LABELS),
        "mix_label": tf.constant(PARTNERS),
        "mix_weight": tf.constant(weights),
        "mask": tf.ones(3),
    }
    logits = model(images, training=True)
    loss_sum = Loss((label_term(loss)(0.1, **options),))(logits, batch)["loss"]
    logits = logits.numpy()
    eye = np.eye(4)
    soft = weights[:, None] * eye[LABELS] + (1 - weights[:, None]) * eye[PARTNERS]
    return float(loss_sum), logits, soft


@pytest.mark.parametrize("loss", ["cross_entropy", "bce"])
def test_mixed_labels_are_soft_targets_and_smoothing_composes(loss):
    weights = np.array([0.9, 0.6, 0.5], np.float32)
    loss_sum, logits, soft = mixed_loss(weights, 1, loss)
    targets = soft * 0.9 + 0.1 / 4
    reference = numpy_bce if loss == "bce" else numpy_cross_entropy
    assert loss_sum == pytest.approx(float(reference(logits, targets).sum()), rel=1e-5)


def test_bce_target_threshold_binarizes_mixed_smoothed_targets_as_numpy():
    """timm's target_threshold: targets above 0.2 count as 1, the rest 0 (after
    Mixup's shares and smoothing), against NumPy; a partner's share of 0.15 drops out."""
    weights = np.array([0.85, 0.6, 0.5], np.float32)
    loss_sum, logits, soft = mixed_loss(weights, 2, "bce", target_threshold=0.2)
    targets = (soft * 0.9 + 0.1 / 4 > 0.2).astype(np.float64)
    assert targets.sum(axis=1).tolist() == [1, 2, 2]  # 0.15 * 0.9 + 0.025 is below 0.2.
    assert loss_sum == pytest.approx(float(np.sum(numpy_bce(logits, targets))), rel=1e-5)


def test_bce_target_threshold_needs_bce(tmp_path):
    with pytest.raises(ConfigError, match="train.bce_target_threshold=0.2 needs train.loss=bce"):
        runs.small_config(tmp_path, "train.bce_target_threshold=0.2")


def test_each_registered_name_builds_its_term():
    for name in LOSSES:
        assert label_term(name).name == name


@dataclasses.dataclass(frozen=True)
class SquaredError(LabelTerm):  # A toy: the softmax's squared error against the targets.
    name: ClassVar[str] = "squared_error"

    def term(self, logits, batch, model=None):
        return tf.reduce_sum((tf.nn.softmax(logits) - self.targets(batch, logits)) ** 2, -1)


def test_a_toy_term_registered_here_is_validated_trained_checked_and_logged(tmp_path, monkeypatch):
    """The config takes its name; its share beside AugMix's is NumPy's; a run logs it."""
    from tests.test_augmix import numpy_js

    monkeypatch.setitem(LOSSES, "squared_error", SquaredError)
    with pytest.raises(ConfigError, match="train.loss must be one of: .*_error, got 'hinge'"):
        runs.small_config(tmp_path, "train.loss=hinge")
    rng = np.random.default_rng(4)
    logits, first, second = (rng.normal(size=(4, 3)).astype(np.float32) for _ in range(3))
    labels, mask = np.array([0, 2, 1, 2], np.int32), np.array([1, 1, 0, 1], np.float32)
    batch = {"label": labels, "mask": mask, LOGITS_KEY: np.stack([first, second])}
    batch = {key: tf.constant(value) for key, value in batch.items()}
    sums = Loss((SquaredError(0.3), Consistency(2.0)))(tf.constant(logits), batch)
    x = logits.astype(np.float64)
    softmax = np.exp(x - x.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    targets = np.eye(3)[labels] * 0.7 + 0.1
    squared = np.sum(mask * ((softmax - targets) ** 2).sum(-1))
    consistency = np.sum(mask * 2.0 * numpy_js(logits, first, second))
    assert float(sums["loss_squared_error"]) == pytest.approx(squared, rel=1e-5)
    assert float(sums["loss_consistency"]) == pytest.approx(consistency, rel=1e-5)
    assert float(sums["loss"]) == pytest.approx(squared + consistency, rel=1e-5)
    assert float(sums["correct"]) == np.sum(mask * (x.argmax(-1) == labels))
    jsd = ["data.augment.auto_augment=augmix", "data.augment.augmix_jsd=2"]
    resolved = runs.small_config(
        tmp_path, "train.loss=squared_error", *jsd, train_steps=2, log_every=1
    )
    loop.train_and_evaluate(resolved, str(tmp_path / "run"))
    records = [r for r in runs.read_records(str(tmp_path / "run")) if "accuracy" in r]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        shares = record["loss_squared_error"] + record["loss_consistency"]
        assert record["loss_squared_error"] > 0 and 0 <= shares <= record["loss"]
