"""RandAugment's per-op probability and magnitude noise (timm's "p" and "mstd"): at the
defaults the old draws (written here with raw TF ops) and Python's arguments; skip
rates and noisy magnitudes against closed forms (4 sigma); images at drawn magnitudes
against PIL's ops (tests/test_randaugment.py); batch against per image; the wiring.
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.data import augment_ops, augmentations, preprocessing, run_pipeline, seeds
from resnet_app.data import randaugment as ra
from resnet_app.data.settings import data_config
from tests.test_randaugment import (
    CIFAR,
    FILL,
    GEOMETRIC,
    MEAN,
    STD,
    assert_geometric_equals_pil,
    assert_per_example_cifar_recipe,
    old_cifar_train,
    one_by_one,
    over_seeds,
    reference_op,
    sample_images,
    shapes_pipeline,
    take,
    with_augment,
)

pytestmark = pytest.mark.usefixtures("private_shapes_cache")

# Not M = 6 (A3's), 2 or 8: there the blend ops' float32 factor 1 +- 0.9 level
# is an ulp away from PIL's (rounded from double) and a few pixels truncate 1
# lower than PIL's. Kept: the default images must stay bitwise what they were.
RA = with_augment(CIFAR, randaugment_ops=2, randaugment_magnitude=9.0)
IDENTITY = ra.OPS.index("Identity")


def choices(config, count, run=0):
    """RandAugment's draws of `count` examples' seeds, as NumPy arrays [count, ...] (and
    under "all", every augmentation's)."""
    dataset = tf.data.Dataset.range(count).map(
        lambda i: augmentations.draws(seeds.example_seed(run, 0, i), config)
    )
    batch = tf.nest.map_structure(lambda value: value.numpy(), next(iter(dataset.batch(count))))
    return {**batch["randaugment"], "all": batch}


def normal_cdf(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def within_4_sigma(observed, expected, sigma):
    assert abs(observed - expected) < 4 * sigma, (observed, expected, sigma)


# -- off by default: the old draws, the old arguments ----------------------------------


def old_draws(seed, num_ops, numpy=True):
    """The RandAugment draws as they were: stream 2^40 + 1, [2, N] uniforms (indices and
    signs; tensors unless `numpy`)."""
    stream = tf.random.experimental.stateless_fold_in(seed, tf.constant((1 << 40) + 1, tf.int64))
    uniform = tf.random.stateless_uniform([2, num_ops], stream)
    indices = tf.cast(tf.floor(uniform[0] * 14), tf.int32)
    signs = tf.where(uniform[1] < 0.5, -1.0, 1.0)
    # As float64 NumPy signs: the references' factor arithmetic is in doubles.
    return (indices.numpy(), signs.numpy().astype(np.float64)) if numpy else (indices, signs)


def test_with_the_defaults_the_draws_are_the_old_draws():
    assert (RA.augment.randaugment_prob, RA.augment.randaugment_magnitude_std) == (1.0, 0.0)
    config = with_augment(RA, randaugment_ops=3, erase_probability=0.25)
    got = choices(config, 200)
    assert set(got["all"]) == {"randaugment", "erase"}
    assert set(got["all"]["randaugment"]) == {"op_indices", "op_signs"}
    for i in range(200):
        indices, signs = old_draws(seeds.example_seed(0, 0, i), 3)
        np.testing.assert_array_equal(got["op_indices"][i], indices)
        np.testing.assert_array_equal(got["op_signs"][i], signs)


def test_the_options_leave_the_op_and_sign_draws_alone():
    # New streams: the ops drawn are the old ones (those kept), the signs all.
    config = with_augment(RA, randaugment_prob=0.5, randaugment_magnitude_std=0.5)
    got = choices(config, 200)
    for i in range(200):
        indices, signs = old_draws(seeds.example_seed(0, 0, i), 2)
        np.testing.assert_array_equal(got["op_signs"][i], signs)
        kept = got["op_indices"][i] != IDENTITY
        np.testing.assert_array_equal(got["op_indices"][i][kept], indices[kept])


@pytest.mark.parametrize("magnitude", [0, 0.1, 3, 6, 6.3, 7.7, 9, 10, 12.5, 29.9])
def test_op_arguments_at_a_number_are_pythons_and_so_are_a_float32_tensors(magnitude):
    # Python's arithmetic on the number, rounded to float32 as PIL's C code
    # takes it; the blend factor 1 +- 0.9 * level is rounded once, after the sum.
    level = magnitude / 10
    expected = {
        "degrees": np.float32(30 * level),
        "threshold": max(0, 256 - int(256 * level)),
        "factor": 0.9 * level,  # In double: augment_ops.Enhance rounds 1 +- it once.
        "bits": max(1, 8 - int(4 * level)),
        "shear": np.float32(0.3 * level),
        "translate": np.float32(0.45 * level),
    }
    for name, value in ra.op_arguments(magnitude).items():
        size = 8 if name == "factor" else 4
        assert value.numpy() == expected[name] and value.dtype.size == size, name
    # A per-image float32 magnitude: the Python arithmetic of its value.
    per_image = np.float32([magnitude, magnitude])
    level = float(per_image[0]) / 10
    expected.update(
        degrees=np.float32(30 * level),
        threshold=max(0, 256 - int(256 * level)),
        bits=max(1, 8 - int(4 * level)),
    )
    arguments = ra.op_arguments(tf.constant(per_image))
    for name in ("degrees", "threshold", "bits"):
        np.testing.assert_array_equal(arguments[name], [expected[name]] * 2, err_msg=name)


def test_with_the_defaults_training_images_are_the_old_recipe_on_pils_ops():
    # The whole default CIFAR path, for seeds whose two ops are not geometric:
    # PIL's ops at M, then the old pad-crop-flip recipe (NumPy).
    image = sample_images()[0][:, :32]
    compared = 0
    for i in range(40):
        seed = seeds.example_seed(0, 0, i)
        indices, signs = old_draws(seed, 2)
        names = [ra.OPS[index] for index in indices]
        if set(names) & set(GEOMETRIC):
            continue
        expected = image
        for name, sign in zip(names, signs):
            expected = reference_op(name, expected, 9.0, sign)
        got = preprocessing.cifar_train(tf.constant(image), seed, RA).numpy()
        np.testing.assert_array_equal(got, old_cifar_train(expected, seed, RA), err_msg=names)
        compared += 1
    assert compared >= 10


# -- the per-op probability ---------------------------------------------------------


@pytest.mark.parametrize("probability", [0.5, 0.2])
def test_each_op_is_skipped_at_the_configured_rate_independently_of_the_op(probability):
    count = 3000
    config = with_augment(RA, randaugment_prob=probability)
    indices = choices(config, count)["op_indices"].ravel()
    example_seeds = [seeds.example_seed(0, 0, i).numpy() for i in range(count)]
    drawn = over_seeds(lambda seed: old_draws(seed, 2, numpy=False)[0], example_seeds).ravel()
    same = indices == drawn
    assert (indices[~same] == IDENTITY).all()  # A skipped op is the Identity.
    # An op is kept with the probability; a drawn Identity is the same either way.
    n = len(indices)
    for observed, chance in (
        (same.mean(), probability + (1 - probability) / 14),
        ((indices == IDENTITY).mean(), (1 - probability) + probability / 14),
    ):
        within_4_sigma(observed, chance, math.sqrt(chance * (1 - chance) / n))
    # Skips independent of the op drawn: the other 13 ops, kept, are still uniform.
    counts = np.bincount(drawn[same], minlength=14)[1:]
    expected = counts.sum() / 13
    assert ((counts - expected) ** 2 / expected).sum() < 40  # 12 dof: P(chi2 > 40) < 1e-4


def test_a_skipped_op_leaves_the_image_unchanged():
    image = tf.constant(sample_images()[0][:, :32])
    never = with_augment(RA, randaugment_prob=0.0)
    for i in range(8):
        seed = seeds.example_seed(0, 0, i)
        np.testing.assert_array_equal(
            preprocessing.cifar_train(image, seed, never),
            preprocessing.cifar_train(image, seed, CIFAR),
        )


def test_the_ops_kept_are_pils_ops_and_the_skipped_ones_nothing():
    image = sample_images()[1]
    config = with_augment(RA, randaugment_ops=3, randaugment_prob=0.5)
    got_choices = choices(config, 60)
    exact = skipped = 0
    for i in range(60):
        indices = got_choices["op_indices"][i]
        drawn, signs = old_draws(seeds.example_seed(0, 0, i), 3)
        names = [ra.OPS[index] for index, kept in zip(drawn, indices == drawn) if kept]
        if set(names) & set(GEOMETRIC):
            continue
        expected = image
        for name, sign in zip(names, signs[indices == drawn]):
            expected = reference_op(name, expected, 9.0, sign)
        got = one_by_one(image, indices, signs, 9.0)
        np.testing.assert_array_equal(got, expected, err_msg=str(names))
        exact += 1
        skipped += (indices != drawn).sum()
    assert exact >= 15 and skipped >= 15


# -- the magnitude noise -------------------------------------------------------------


def test_noisy_magnitudes_have_the_configured_mean_and_std():
    count, magnitude, std = 4000, 6.0, 0.5
    config = with_augment(RA, randaugment_magnitude=magnitude, randaugment_magnitude_std=std)
    drawn = choices(config, count)["op_magnitudes"]
    assert drawn.shape == (count, 2) and drawn.dtype == np.float32
    values = drawn.ravel()  # 12 sigma from the clip bounds: a plain normal.
    n = len(values)
    within_4_sigma(values.mean(), magnitude, std / math.sqrt(n))
    within_4_sigma(values.std(), std, std / math.sqrt(2 * n))
    # Independent draws: the two ops of an example are uncorrelated.
    within_4_sigma(np.corrcoef(drawn[:, 0], drawn[:, 1])[0, 1], 0.0, 1 / math.sqrt(count))


@pytest.mark.parametrize("magnitude,bound", [(9.0, 10.0), (1.0, 0.0)])
def test_noisy_magnitudes_are_clipped_to_the_scale(magnitude, bound):
    count, std = 3000, 2.0
    config = with_augment(RA, randaugment_magnitude=magnitude, randaugment_magnitude_std=std)
    values = choices(config, count)["op_magnitudes"].ravel()
    assert values.min() >= 0 and values.max() <= 10
    # The draws beyond the bound land on it: P = P(N(M, std) beyond it), 0.31.
    chance = normal_cdf(-abs(bound - magnitude) / std)
    n = len(values)
    within_4_sigma((values == bound).mean(), chance, math.sqrt(chance * (1 - chance) / n))
    inside = values[(values > 0) & (values < 10)]
    assert len(np.unique(inside)) > 0.99 * len(inside)  # Continuous inside.


def test_magnitudes_above_the_scale_are_clipped_to_m():
    values = ra.noisy_magnitudes(tf.constant([1, 2], tf.int64), 4000, 15.0, 2.0)
    values = values.numpy()
    assert values.max() == 15.0 and values.min() > 5
    within_4_sigma((values == 15.0).mean(), 0.5, math.sqrt(0.25 / 4000))


@pytest.mark.parametrize("name", ra.OPS)
def test_each_op_at_drawn_per_image_magnitudes_equals_pil_at_them(name):
    count = 24
    config = with_augment(RA, randaugment_magnitude=5.0, randaugment_magnitude_std=1.5)
    drawn = choices(config, count)
    magnitudes, signs = drawn["op_magnitudes"][:, 0], drawn["op_signs"][:, 0]
    assert len(set(magnitudes)) == count and (magnitudes % 1 != 0).all()  # Off the grid.
    image = sample_images()[0]
    images = tf.constant(np.repeat(image[None], count, axis=0))
    arguments = tf.constant(signs), tf.constant(magnitudes), FILL, ra.RANGES
    batch = augment_ops.apply_op(name, images, *arguments).numpy()
    compared = 0
    for got, magnitude, sign in zip(batch, magnitudes.astype(float), signs):
        if name in GEOMETRIC:
            compared += assert_geometric_equals_pil(name, image, magnitude, sign, got)
        else:
            want = reference_op(name, image, magnitude, sign)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} M={magnitude}")
            compared += got.size
    assert compared > 0.4 * batch.size


def pil_policy(image, seed, config):
    """PIL's kept ops of an example (the old draws) at its drawn magnitudes; None when one
    is geometric (not exact) or AutoContrast (PIL's doubles can truncate 1 below our
    exact integer: an old difference, kept so that default images stay)."""
    draws = {k: v.numpy() for k, v in augmentations.draws(seed, config)["randaugment"].items()}
    drawn, signs = old_draws(seed, config.augment.randaugment_ops)
    kept = draws["op_indices"] == drawn
    names = [ra.OPS[index] for index in drawn[kept]]
    if set(names) & {*GEOMETRIC, "AutoContrast"}:
        return None
    for name, sign, magnitude in zip(names, signs[kept], draws["op_magnitudes"][kept]):
        image = reference_op(name, image, float(magnitude), sign)
    return image


def test_cifar_training_images_use_the_drawn_skips_and_magnitudes():
    image = sample_images()[0][:, :32]
    config = with_augment(RA, randaugment_prob=0.7, randaugment_magnitude_std=2.0)
    compared = 0
    for i in range(40):
        seed = seeds.example_seed(0, 0, i)
        augmented = pil_policy(image, seed, config)
        if augmented is not None:
            got = preprocessing.cifar_train(tf.constant(image), seed, config).numpy()
            np.testing.assert_array_equal(got, old_cifar_train(augmented, seed, config))
            compared += 1
    assert compared >= 10


def test_imagenet_training_images_use_the_drawn_skips_and_magnitudes():
    # The ImageNet recipe runs the per-example path (a batch of one).
    image = sample_images()[0]
    config = with_augment(
        preprocessing.Preprocessing("imagenet", 24, CIFAR.mean, CIFAR.std),
        randaugment_ops=2,
        randaugment_magnitude=9.0,
    )
    config = with_augment(config, randaugment_prob=0.7, randaugment_magnitude_std=2.0)
    compared = 0
    for i in range(40):
        seed = seeds.example_seed(0, 0, i)
        # The crop and flip with the options off, rounded to the 0-255 grid.
        plain = with_augment(config, randaugment_ops=0, mean=(0.0,) * 3, std=(1.0,) * 3)
        crop = preprocessing.imagenet_train(tf.constant(image), seed, plain).numpy()
        pixels = np.clip(np.round(crop), 0, 255).astype(np.uint8)
        augmented = pil_policy(pixels, seed, config)
        if augmented is not None:
            got = preprocessing.imagenet_train(tf.constant(image), seed, config).numpy()
            normalized = (augmented.astype(np.float32) - np.float32(MEAN)) / np.float32(STD)
            np.testing.assert_array_equal(got, normalized)
            compared += 1
    assert compared >= 10


def test_a_batch_at_per_image_magnitudes_is_augmented_as_each_of_its_images():
    images = np.stack([image[:, :32] for image in sample_images()] * 10)
    rng = np.random.default_rng(5)
    indices = np.stack([rng.permutation(30) % 14 for _ in range(2)], axis=1).astype(np.int32)
    signs = rng.choice([-1.0, 1.0], indices.shape).astype(np.float32)
    magnitudes = rng.uniform(0, 10, indices.shape).astype(np.float32)
    batch, constant = (
        augment_ops.apply_ops(tf.constant(images), indices, signs, m, FILL, ra.RANGES).numpy()
        for m in (magnitudes, 6.0)
    )
    assert np.mean([not np.array_equal(a, b) for a, b in zip(batch, constant)]) > 0.5
    for image, index, sign, magnitude, got in zip(images, indices, signs, magnitudes, batch):
        np.testing.assert_array_equal(got, one_by_one(image, index, sign, magnitude))


# -- the pipeline and the config -----------------------------------------------------

OPTIONS = dict(randaugment_ops=2, randaugment_prob=0.5, randaugment_magnitude_std=0.5)


def test_cifar_pipeline_with_the_options_is_the_per_example_recipe_and_reenters():
    pipeline = shapes_pipeline(**OPTIONS, erase_probability=0.25)
    images, ids = take(pipeline.train_dataset(16), 80)
    assert_per_example_cifar_recipe(pipeline, images, ids)
    entered, entered_ids = take(pipeline.train_dataset(16, start_example=48), 32)
    np.testing.assert_array_equal(entered_ids, ids[48:])
    np.testing.assert_array_equal(entered, images[48:])
    plain, _ = take(shapes_pipeline(randaugment_ops=2).train_dataset(16), 80)
    assert np.mean([not np.array_equal(a, b) for a, b in zip(images, plain)]) > 0.5


@pytest.mark.parametrize(
    "field,value",
    [
        ("randaugment_prob", -0.1),
        ("randaugment_prob", 1.5),
        ("randaugment_prob", math.nan),
        ("randaugment_magnitude_std", -0.5),
        ("randaugment_magnitude_std", math.inf),
        ("randaugment_magnitude_std", math.nan),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(field, value):
    with pytest.raises(ConfigError, match=field) as error:
        data_config(**{field: value})
    assert "\n" not in str(error.value)


def test_the_options_are_config_keys_and_reach_the_preprocessing():
    from resnet_app import config

    sets = ["data.augment.randaugment_ops=2", "data.train_examples=16"]
    sets += ["data.augment.randaugment_prob=0.5", "data.randaugment_magnitude_std=0.5"]
    got = run_pipeline.create_run_pipeline(config.resolve(sets=sets)).preprocessing.augment
    assert (got.randaugment_prob, got.randaugment_magnitude_std) == (0.5, 0.5)
    with pytest.raises(ConfigError, match="randaugment_magnitude_std"):
        config.resolve(sets=["data.randaugment_magnitude_std=-1"])
    default = run_pipeline.create_run_pipeline(config.resolve(sets=sets[:2])).preprocessing.augment
    assert (default.randaugment_prob, default.randaugment_magnitude_std) == (1.0, 0.0)
