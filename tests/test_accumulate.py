"""Gradient accumulation: micro-batches summed into one update, against one device on the
whole batch (`tests/reference.py`'s `momentum_steps`)."""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.distribute import mirrored_strategy
from resnet_app.engine import optim
from resnet_app.engine.step import Tower, TrainStep
from tests.reference import momentum_steps
from tests.small_models import SIZE, initial_weights, no_bn, tiny_bn

LEARNING_RATES = (0.1, 0.05)


def batch_of(count):
    rng = np.random.default_rng(0)
    return {
        "image": rng.normal(size=(count, SIZE, SIZE, 3)).astype(np.float32),
        "label": rng.integers(0, 5, size=count).astype(np.int32),
        "id": np.arange(count, dtype=np.int64),
        "mask": np.ones(count, np.float32),
    }


def trained(make_model, weights, batch, towers, accumulate_steps):
    strategy = mirrored_strategy([f"/cpu:{i}" for i in range(towers)])
    with strategy.scope():
        model = make_model()
        model.build((None, SIZE, SIZE, 3))
        model.set_weights(weights)
        optimizer = optim.create_optimizer({"class": "momentum", "learning_rate": 0.1})
        optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    step = TrainStep(Tower(model, optimizer, accumulate_steps=accumulate_steps), strategy)
    result = step.loop(iterator, list(LEARNING_RATES))
    assert result.steps == len(LEARNING_RATES)
    return model, result.sums


@pytest.mark.parametrize(("towers", "steps"), [(1, 4), (1, 2), (2, 2), (2, 4)])
def test_accumulated_micro_batches_make_the_whole_batchs_update(towers, steps):
    weights = initial_weights(no_bn)
    batch = batch_of(16)
    reference = no_bn()
    reference.build((None, SIZE, SIZE, 3))
    reference.set_weights(weights)
    momentum_steps(reference, [(batch["image"], batch["label"])] * 2, LEARNING_RATES, 0.9)
    model, sums = trained(no_bn, weights, batch, towers, steps)
    assert sums["examples"] == 2 * 16
    for ours, expected in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(ours.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_with_batch_norm_each_micro_batch_has_its_own_statistics():
    """The control: with BatchNorm, accumulation is not the whole batch's update."""

    def make_model():
        return tiny_bn(synchronized=False)

    weights = initial_weights(make_model)
    batch = batch_of(16)
    whole, _ = trained(make_model, weights, batch, 1, 1)
    sliced, _ = trained(make_model, weights, batch, 1, 4)
    differences = [
        np.abs(a.numpy() - b.numpy()).max()
        for a, b in zip(whole.trainable_variables, sliced.trainable_variables)
    ]
    assert max(differences) > 1e-4


def test_a_batch_that_does_not_split_into_micro_batches_is_one_line(tmp_path):
    from resnet_app.common.errors import ConfigError
    from resnet_app.engine import setup
    from tests import runs

    config = runs.small_config(tmp_path, "train.accumulate_steps=3", train_steps=1)
    with pytest.raises(
        ConfigError, match=r"does not split into train.accumulate_steps=3 .*use a multiple of 3$"
    ):
        setup.build_run(config, str(tmp_path / "run"))
