"""Stochastic depth and dropout: the hash against NumPy, rates, expectation, draws on any towers."""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.distribute import mirrored_strategy
from resnet_app.common.errors import ConfigError
from resnet_app.engine import optim
from resnet_app.engine.step import Tower, TrainStep
from resnet_app.nets import drop_path
from resnet_app.nets.resnet import create_model

MASK = (1 << 64) - 1


def splitmix64(values):
    """Steele et al.'s splitmix64 finalizer, in Python integers (the reference)."""
    out = []
    for value in values:
        z = (int(value) + 0x9E3779B97F4A7C15) & MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        out.append(z ^ (z >> 31))
    return out


def test_the_hash_is_splitmix64():
    values = [0, 1, 2, 12345, 2**40 + 7, 2**63 + 5, MASK]
    ours = drop_path.mix(tf.constant(np.array(values, np.uint64))).numpy()
    assert [int(v) for v in ours] == splitmix64(values)


def test_an_examples_copies_draw_apart_and_copy_0_keeps_the_key(copies=(0, 1, 2, 0, 2)):
    """Repeated augmentation puts an example's k copies in one step: the copy mixes into
    its key (splitmix64 of key + copy, in Python integers), copy 0 keeps the key of a run
    without repeats, and the copies' drop draws are independent."""
    ids = tf.constant([5, 5, 5, 9, 9], tf.int64)
    plain = drop_path.example_keys(7, 3, ids).numpy()
    keyed = drop_path.example_keys(7, 3, ids, tf.constant(copies, tf.int64)).numpy()
    expected = [
        int(key) if copy == 0 else splitmix64([(int(key) + copy) & MASK])[0]
        for key, copy in zip(plain, copies)
    ]
    assert [int(k) for k in keyed] == expected
    assert len(set(int(k) for k in keyed)) == 5
    # 20,000 examples x 3 copies: the copies' draws of a block are uncorrelated.
    many = tf.repeat(tf.range(20_000, dtype=tf.int64), 3)
    draws = drop_path.uniform(
        drop_path.example_keys(1, 0, many, tf.tile(tf.range(3, dtype=tf.int64), [20_000])), 4
    ).numpy()
    per_copy = draws.reshape(-1, 3)
    assert abs(np.corrcoef(per_copy[:, 0], per_copy[:, 1])[0, 1]) < 0.03
    assert abs(np.corrcoef(per_copy[:, 1], per_copy[:, 2])[0, 1]) < 0.03


def test_draws_are_uniform_and_the_drop_rate_is_the_configured_one():
    keys = drop_path.example_keys(7, 3, tf.range(40_000, dtype=tf.int64))
    draws = drop_path.uniform(keys, block=5).numpy()
    assert draws.min() >= 0 and draws.max() < 1
    # Uniform: every tenth of [0, 1) holds 10% of the draws (4 sigma of a binomial).
    counts = np.histogram(draws, bins=10, range=(0, 1))[0] / len(draws)
    assert np.abs(counts - 0.1).max() < 4 * np.sqrt(0.1 * 0.9 / len(draws))
    branch = tf.ones([len(draws), 1, 1, 1])
    kept = drop_path.drop(branch, keys, block=5, rate=0.3).numpy().ravel()
    dropped = np.mean(kept == 0)
    assert abs(dropped - 0.3) < 4 * np.sqrt(0.3 * 0.7 / len(draws))
    # Kept branches are scaled so that the expected branch is the branch.
    np.testing.assert_allclose(kept[kept > 0], 1 / 0.7, rtol=1e-6)
    assert abs(kept.mean() - 1) < 4 * np.sqrt(0.3 / 0.7 / len(draws))
    # Another block draws independently of this one.
    other = drop_path.uniform(keys, block=6).numpy()
    assert abs(np.corrcoef(draws, other)[0, 1]) < 0.02


def test_rates_rise_linearly_and_bad_rates_are_refused():
    assert drop_path.block_rates(0.2, 4) == pytest.approx([0.05, 0.1, 0.15, 0.2])
    model = create_model("resnet20", drop_path_rate=0.1)
    rates = [unit.drop_rate for stage in model.stages for unit in stage]
    assert rates == pytest.approx([0.1 * (i + 1) / 9 for i in range(9)])
    for bad in (1.0, -0.1, True):
        with pytest.raises(ConfigError, match="drop_path_rate"):
            create_model("resnet20", drop_path_rate=bad)


def test_evaluation_uses_every_branch():
    images = np.random.default_rng(0).normal(size=(4, 16, 16, 3)).astype(np.float32)
    plain = create_model("resnet20")
    plain.build((None, 16, 16, 3))
    dropping = create_model("resnet20", drop_path_rate=0.5)
    dropping.build((None, 16, 16, 3))
    dropping.set_weights(plain.get_weights())
    keys = drop_path.example_keys(0, 0, tf.range(4, dtype=tf.int64))
    evaluated = dropping(images, training=False, drop_keys=keys).numpy()
    np.testing.assert_array_equal(evaluated, plain(images, training=False).numpy())
    # In training the draws change the output (the keys reach the blocks).
    trained = dropping(images, training=True, drop_keys=keys).numpy()
    assert not np.allclose(trained, plain(images, training=True).numpy(), atol=1e-3)


def test_the_tower_keys_an_examples_copies_apart():
    """The same image with one id: as copies 0 and 1 (repeated augmentation) the tower's
    training logits differ, as two entries of copy 0 they are equal."""
    model = create_model("resnet20", drop_path_rate=0.5)
    model.build((None, 16, 16, 3))
    optimizer = optim.create_optimizer({"class": "momentum", "learning_rate": 0.1})
    optimizer.build(model.trainable_variables)
    tower = Tower(model, optimizer, seed=3)
    image = np.random.default_rng(2).normal(size=(1, 16, 16, 3)).astype(np.float32)
    images = tf.constant(np.repeat(image, 4, axis=0))
    batch = {"image": images, "id": tf.constant([4, 4, 4, 4], tf.int64)}
    logits = tower.logits({**batch, "copy": tf.constant([0, 1, 0, 2], tf.int64)}).numpy()
    # Batch statistics are shared by the four rows: only the drops tell them apart.
    np.testing.assert_array_equal(logits[0], logits[2])
    assert not np.allclose(logits[0], logits[1]) and not np.allclose(logits[1], logits[3])
    without = tower.logits(batch).numpy()
    np.testing.assert_array_equal(without[0], without[1])


def train(towers, seed=0, steps=(0.1, 0.1), calls=1, **fields):
    fields = fields or {"drop_path_rate": 0.5}
    strategy = mirrored_strategy([f"/cpu:{i}" for i in range(towers)])
    with strategy.scope():
        tf.keras.utils.set_random_seed(0)
        model = create_model("tiny", bn_synchronized=True, **fields)
        model.build((None, 8, 8, 3))
        optimizer = optim.create_optimizer({"class": "momentum", "learning_rate": 0.1})
        optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(1)
    batch = {
        "image": rng.normal(size=(8, 8, 8, 3)).astype(np.float32),
        "label": rng.integers(0, 10, size=8).astype(np.int32),
        "id": np.arange(8, dtype=np.int64),
        "mask": np.ones(8, np.float32),
    }
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    step = TrainStep(Tower(model, optimizer, seed=seed), strategy)
    per_call = len(steps) // calls
    for call in range(calls):
        step.loop(iterator, list(steps[call * per_call : (call + 1) * per_call]))
    return [v.numpy() for v in model.trainable_variables]


# Stochastic depth; dropout (wide ResNets) in a wide pre-activation unit.
KINDS = [{"drop_path_rate": 0.5}, {"dropout": 0.3, "version": "v2", "widths": (16,)}]


@pytest.mark.parametrize("fields", KINDS)
def test_the_same_draws_on_one_and_two_towers_and_across_calls(fields):
    one = train(1, **fields)
    for other in (train(2, **fields), train(1, calls=2, **fields)):
        for a, b in zip(one, other, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The control: another seed draws other drops, so other weights.
    reseeded = train(1, seed=1, **fields)
    assert max(np.abs(a - b).max() for a, b in zip(one, reseeded, strict=True)) > 1e-4


def test_dropout_drops_each_element_at_its_rate_keyed_by_example_and_block():
    keys = drop_path.example_keys(3, 5, tf.range(64, dtype=tf.int64))
    ones = tf.ones([64, 8, 8, 16])
    kept = drop_path.dropout(ones, keys, block=2, rate=0.3).numpy()
    dropped = np.mean(kept == 0)
    assert abs(dropped - 0.3) < 4 * np.sqrt(0.3 * 0.7 / kept.size)
    np.testing.assert_allclose(kept[kept > 0], 1 / 0.7, rtol=1e-6)  # Expectation kept.
    # An example's draws are its own: the same in another batch, at another position.
    alone = drop_path.dropout(ones[:1], keys[5:6], block=2, rate=0.3).numpy()
    np.testing.assert_array_equal(alone[0], kept[5])
    # Elements and blocks draw apart: no repeated pattern across channels or blocks.
    assert not np.array_equal(kept[:, :, :, 0], kept[:, :, :, 1])
    other = drop_path.dropout(ones, keys, block=3, rate=0.3).numpy()
    assert abs(np.corrcoef((kept > 0).ravel(), (other > 0).ravel())[0, 1]) < 0.02
    # Independent of stochastic depth's draws of the same block.
    depth = drop_path.drop(tf.ones([64, 1, 1, 1]), keys, block=2, rate=0.3).numpy().ravel() > 0
    assert abs(np.corrcoef(depth, (kept[:, 0, 0, 0] > 0))[0, 1]) < 0.5


def test_dropout_sits_before_the_last_conv_in_training_only():
    model = create_model("tiny", version="v2", widths=(8,), dropout=0.5)
    assert model.uses_example_keys
    images = np.random.default_rng(4).normal(size=(4, 8, 8, 3)).astype(np.float32)
    keys = drop_path.example_keys(0, 0, tf.range(4, dtype=tf.int64))
    plain = create_model("tiny", version="v2", widths=(8,))
    plain.build(images.shape)
    model.build(images.shape)
    model.set_weights(plain.get_weights())
    np.testing.assert_array_equal(
        model(images, training=False, drop_keys=keys).numpy(),
        plain(images, training=False).numpy(),
    )
    # By hand: the unit's conv2 reads its dropped input (BN-ReLU, then dropout).
    unit = model.stages[0][0]
    stem = model.stem_pool or (lambda x: x)
    x = stem(tf.nn.relu(model.stem_bn(model.stem_conv(images), training=True)))
    inner = tf.nn.relu(unit.bn1(unit.conv1(x), training=True))
    dropped = drop_path.dropout(inner, keys, unit.block_index, 0.5)
    expected = unit.conv2(dropped) + unit.shortcut(x, training=True)
    np.testing.assert_allclose(
        unit(x, training=True, keys=keys).numpy(), expected.numpy(), rtol=1e-5, atol=1e-5
    )
    assert not np.allclose(
        unit(x, training=True, keys=keys).numpy(), unit(x, training=True).numpy(), atol=1e-3
    )
