"""Towers against one device: a distributed step's update is the single-device one, written
by hand (one GradientTape over the whole batch, mean cross-entropy plus the regularization
losses, TF1's momentum rule)."""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.distribute import distribute_datasets, mirrored_strategy
from resnet_app.engine import optim
from resnet_app.engine.step import Tower, TrainStep
from tests.reference import momentum_steps
from tests.small_models import SIZE, initial_weights, no_bn, tiny_bn

LEARNING_RATES = (0.1, 0.05)  # Two steps, with an LR change between them.
MOMENTUM = 0.9


def _batch(count: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.normal(size=(count, SIZE, SIZE, 3)).astype(np.float32),
        "label": rng.integers(0, 5, size=count).astype(np.int32),
        "id": np.arange(count, dtype=np.int64),
        "mask": np.ones(count, np.float32),
    }


def _reference(make_model, initial_weights, batch) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Two steps on one device, written from the definitions."""
    model = make_model()
    model.build((None, SIZE, SIZE, 3))
    model.set_weights(initial_weights)
    pairs = [(batch["image"], batch["label"])] * len(LEARNING_RATES)
    momentum_steps(model, pairs, LEARNING_RATES, MOMENTUM)
    trainable = [v.numpy() for v in model.trainable_variables]
    return trainable, [v.numpy() for v in model.non_trainable_variables]


def _model_and_optimizer(strategy, make_model, initial_weights):
    """The model at `initial_weights` and a built momentum optimizer, in `strategy.scope()`."""
    with strategy.scope():
        model = make_model()
        model.build((None, SIZE, SIZE, 3))
        model.set_weights(initial_weights)
        optimizer = optim.create_optimizer(
            {"class": "momentum", "learning_rate": 0.1, "momentum": MOMENTUM}
        )
        optimizer.build(model.trainable_variables)
    return model, optimizer


def _distributed(
    make_model, initial_weights, batch, towers, learning_rates=LEARNING_RATES, stop=None, jit=False
):
    strategy = mirrored_strategy([f"/cpu:{i}" for i in range(towers)])
    model, optimizer = _model_and_optimizer(strategy, make_model, initial_weights)
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    step = TrainStep(Tower(model, optimizer, jit=jit), strategy)
    result = step.loop(iterator, list(learning_rates), stop)
    assert result.steps == len(learning_rates) or stop is not None or not result.finite
    return model, strategy, result.sums


def _local_values(strategy, variable) -> list[np.ndarray]:
    return [v.numpy() for v in strategy.experimental_local_results(variable.value)]


CASES = {
    "synchronized_bn": lambda: tiny_bn(synchronized=True),
    "no_bn": no_bn,
}


@pytest.mark.parametrize(
    "case,towers,count",
    [
        (case, towers, count)
        for case in sorted(CASES)
        for towers, count in [(2, 6), (3, 6), (2, 7), (3, 7)]
    ],
)
def test_towers_match_one_device(case, towers, count):
    make_model = CASES[case]
    weights = initial_weights(make_model)
    batch = _batch(count)
    expected_trainable, expected_stats = _reference(make_model, weights, batch)
    model, strategy, totals = _distributed(make_model, weights, batch, towers)
    assert totals["examples"] == 2 * count
    for variable, expected in zip(model.trainable_variables, expected_trainable):
        for value in _local_values(strategy, variable):
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-7)
    # Synchronized statistics are global: every tower already holds the
    # single-device moving averages.
    for variable, expected in zip(model.non_trainable_variables, expected_stats):
        for value in _local_values(strategy, variable):
            np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-7)


def test_one_cpu_device_is_fed_by_the_dataset_itself():
    """`distribute_datasets` gives one CPU device the plain dataset (towers keep a
    distributed one); the steps are those of the reference, and bitwise those
    of the same strategy fed through a distributed dataset."""
    make_model = CASES["no_bn"]
    weights = initial_weights(make_model)
    batch = _batch(6)
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    towers = mirrored_strategy(["/cpu:0", "/cpu:1"])
    assert isinstance(
        distribute_datasets(towers, lambda _: dataset), tf.distribute.DistributedDataset
    )
    trained = []
    for distributed in (False, True):
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
        model, optimizer = _model_and_optimizer(strategy, make_model, weights)
        if distributed:
            feed = strategy.distribute_datasets_from_function(lambda _: dataset)
        else:
            feed = distribute_datasets(strategy, lambda _: dataset)
            assert isinstance(feed, tf.data.Dataset)
        TrainStep(Tower(model, optimizer), strategy).loop(iter(feed), list(LEARNING_RATES))
        trained.append([v.numpy() for v in model.trainable_variables])
    expected, _ = _reference(make_model, weights, batch)
    for value, reference in zip(trained[0], expected, strict=True):
        np.testing.assert_allclose(value, reference, rtol=1e-5, atol=1e-7)
    for plain, distributed in zip(*trained, strict=True):
        np.testing.assert_array_equal(plain, distributed)


def test_reference_is_sensitive_to_the_split():
    """Per-tower BatchNorm really differs from one device, so the test above can fail."""
    make_model = lambda: tiny_bn(synchronized=False)  # noqa: E731
    weights = initial_weights(make_model)
    batch = _batch(6)
    expected_trainable, _ = _reference(make_model, weights, batch)
    model, strategy, _ = _distributed(make_model, weights, batch, towers=3)
    differences = [
        np.max(np.abs(_local_values(strategy, v)[0] - e))
        for v, e in zip(model.trainable_variables, expected_trainable)
    ]
    assert max(differences) > 1e-4


def test_loop_ends_after_the_first_step_with_a_nonfinite_loss():
    """A NaN learning rate at step 2 makes the weights NaN; step 3's loss is the
    first non-finite one, and the call ends there instead of running step 4."""
    make_model = lambda: tiny_bn(synchronized=True)  # noqa: E731
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = make_model()
        model.build((None, SIZE, SIZE, 3))
        optimizer = optim.create_optimizer({"class": "momentum", "learning_rate": 0.1})
        optimizer.build(model.trainable_variables)
    dataset = tf.data.Dataset.from_tensors(_batch(4)).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    step = TrainStep(Tower(model, optimizer), strategy)
    result = step.loop(iterator, [0.1, np.nan, 0.1, 0.1])
    assert result.steps == 3
    assert not result.finite
    assert int(optimizer.iterations.numpy()) == 3


@pytest.mark.parametrize("stop_first", [True, False])
def test_loop_reads_the_stop_flag_before_every_step(stop_first):
    make_model = lambda: tiny_bn(synchronized=False)  # noqa: E731
    weights = initial_weights(make_model)
    stop = tf.Variable(stop_first)
    model, strategy, totals = _distributed(make_model, weights, _batch(4), 2, stop=stop)
    assert totals["examples"] == (0 if stop_first else 4 * len(LEARNING_RATES))
    unchanged = all(
        np.array_equal(_local_values(strategy, v)[0], w) for v, w in zip(model.weights, weights)
    )
    assert unchanged == stop_first


@pytest.mark.parametrize(
    "make_model,towers", [(lambda: tiny_bn(synchronized=False), 1), (no_bn, 2)]
)
def test_xla_step_matches_one_device(make_model, towers):
    """Each tower's forward and backward pass compiled by XLA: the same update.
    (Synchronized BatchNorm's all-reduce cannot sit inside XLA; the trainer refuses it.)"""
    weights = initial_weights(make_model)
    batch = _batch(6)
    expected_trainable, _ = _reference(make_model, weights, batch)
    model, strategy, _ = _distributed(make_model, weights, batch, towers, jit=True)
    for variable, expected in zip(model.trainable_variables, expected_trainable):
        for value in _local_values(strategy, variable):
            np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-6)


def test_bfloat16_step_updates_like_float32():
    """Mixed bfloat16: float32 weights, bfloat16 compute; the update of two steps is
    the float32 reference's to within 25% (bfloat16 keeps 8 bits of mantissa: each
    product is off by up to 0.4%, the errors add up over the layers, and
    BatchNorm's gamma and beta gradients are sums over the batch of terms of both
    signs, whose cancellation magnifies the relative error: over seeds 0-5 the
    worst variable's error was 0.02-0.15). A wrong update rule is off by ~100%."""
    from resnet_app.nets.factory import dtype_policy

    def make_bf16_model():
        with dtype_policy("mixed_bfloat16"):
            return tiny_bn(synchronized=True)

    weights = initial_weights(lambda: tiny_bn(synchronized=True))
    batch = _batch(6)
    expected_trainable, _ = _reference(lambda: tiny_bn(synchronized=True), weights, batch)
    model, strategy, _ = _distributed(make_bf16_model, weights, batch, towers=2)
    assert model.stem_conv.compute_dtype == "bfloat16"
    assert model.logits.compute_dtype == "float32"
    assert all(v.dtype == "float32" for v in model.trainable_variables)
    paths = [v.path for v in model.weights]
    for variable, expected in zip(model.trainable_variables, expected_trainable):
        initial = weights[paths.index(variable.path)]
        update = _local_values(strategy, variable)[0] - initial
        expected_update = expected - initial
        error = np.linalg.norm(update - expected_update) / np.linalg.norm(expected_update)
        assert error < 0.25, (variable.path, error)
