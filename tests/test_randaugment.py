"""RandAugment and random erasing: each op against PIL, the policy, erasing's statistics,
statelessness, the pipeline with the options off (bitwise the old recipe) and on (per
example, on any number of towers), and the config checks.

Tolerances: pointwise, histogram and blend ops equal PIL's exactly. Geometric ops
sample bilinearly in float32 where PIL uses doubles: exact but within 2e-3 of an
integer (then 1 apart at most); along the edge, where PIL repeats the edge pixel and
we blend with the fill, left out.
"""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from resnet_app.common.errors import ConfigError
from resnet_app.data import (
    augment_ops,
    augmentations,
    input_pipeline,
    preprocessing,
    run_pipeline,
    seeds,
)
from resnet_app.data import randaugment as ra
from resnet_app.data.preprocessing import Preprocessing
from resnet_app.data.settings import AugmentSettings, data_config

FILL = (120, 110, 100)
MEAN, STD = (120.0, 110.0, 100.0), (60.0, 50.0, 40.0)
CIFAR = Preprocessing("cifar", 32, MEAN, STD)


def with_augment(config, **changes):
    """`config` (a `Preprocessing`) with some of its fields, or its augmentation's, changed."""
    names = {field.name for field in dataclasses.fields(AugmentSettings)}
    augment = {k: v for k, v in changes.items() if k in names}
    own = {k: v for k, v in changes.items() if k not in names}
    return dataclasses.replace(
        config, augment=dataclasses.replace(config.augment, **augment), **own
    )


GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")
MAGNITUDES = (0, 3, 6, 8, 9, 10, 25)  # 6 and 8: 1 +- 0.9 * level rounds once, as PIL.
FIXTURE = Path(__file__).parent / "fixtures" / "run_v0_tiny"


# Each module generates its own `shapes` cache (see conftest.private_shapes_cache).
pytestmark = pytest.mark.usefixtures("private_shapes_cache")


def sample_images():
    """32x40 images (not square): random full-range, random low-contrast, flat areas."""
    rng = np.random.default_rng(1)
    full = rng.integers(0, 256, (32, 40, 3), dtype=np.uint8)
    low = (rng.integers(0, 256, (32, 40, 3)) // 4 + 60).astype(np.uint8)
    flat = np.full((32, 40, 3), 77, np.uint8)
    flat[5:20, 8:30] = (10, 200, 90)  # Flat areas: equal neighbours.
    return [full, low, flat]


# -- the reference: timm's ops and arguments, on PIL ---------------------------------


def reference_matrix(name, magnitude, sign, width, height):
    """PIL's affine matrix of a geometric op (Image.rotate's, for Rotate)."""
    level = magnitude / 10
    if name == "Rotate":
        angle = -math.radians(sign * 30 * level)
        cos, sin = math.cos(angle), math.sin(angle)
        cx, cy = width / 2, height / 2
        return (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)
    shear, move = sign * 0.3 * level, sign * 0.45 * level
    return {
        "ShearX": (1, shear, 0, 0, 1, 0),
        "ShearY": (1, 0, 0, shear, 1, 0),
        "TranslateX": (1, 0, move * width, 0, 1, 0),
        "TranslateY": (1, 0, 0, 0, 1, move * height),
    }[name]


def reference_op(name, image, magnitude, sign):
    """timm's op at magnitude M (its "increasing" forms; Posterize keeps 8 - int(0.4 M) bits)."""
    level = magnitude / 10
    pil = Image.fromarray(image)
    factor = max(0.1, 1 + sign * 0.9 * level)
    if name in GEOMETRIC:
        if name == "Rotate":
            out = pil.rotate(sign * 30 * level, resample=Image.BILINEAR, fillcolor=FILL)
        else:
            matrix = reference_matrix(name, magnitude, sign, *pil.size)
            out = pil.transform(pil.size, Image.AFFINE, matrix, Image.BILINEAR, fillcolor=FILL)
    else:
        out = {
            "Identity": lambda: pil,
            "AutoContrast": lambda: ImageOps.autocontrast(pil),
            "Equalize": lambda: ImageOps.equalize(pil),
            "Solarize": lambda: ImageOps.solarize(pil, max(0, 256 - int(256 * level))),
            "Posterize": lambda: ImageOps.posterize(pil, max(1, 8 - int(4 * level))),
            "Color": lambda: ImageEnhance.Color(pil).enhance(factor),
            "Contrast": lambda: ImageEnhance.Contrast(pil).enhance(factor),
            "Brightness": lambda: ImageEnhance.Brightness(pil).enhance(factor),
            "Sharpness": lambda: ImageEnhance.Sharpness(pil).enhance(factor),
        }[name]()
    return np.asarray(out)


def apply(name, image, magnitude, sign, ranges=ra.RANGES):
    """Op `name` on one image (a batch of one)."""
    images, signs = tf.constant(image)[None], tf.constant([float(sign)])
    return augment_ops.apply_op(name, images, signs, magnitude, FILL, ranges)[0].numpy()


def one_by_one(image, indices, signs, magnitude, ranges=ra.RANGES):
    """One image's ops in turn, as a batch of one (`apply_ops`)."""
    args = (tf.constant(image)[None], *(tf.constant(np.asarray(x))[None] for x in (indices, signs)))
    if not isinstance(magnitude, float):
        magnitude = tf.constant(np.asarray(magnitude, np.float32))[None]
    return augment_ops.apply_ops(*args, magnitude, FILL, ranges)[0].numpy()


@pytest.mark.parametrize("name", [op for op in ra.OPS if op not in GEOMETRIC])
def test_pointwise_histogram_and_blend_ops_equal_pil(name):
    for image in sample_images():
        for magnitude in MAGNITUDES:
            for sign in (-1, 1):
                np.testing.assert_array_equal(
                    apply(name, image, magnitude, sign),
                    reference_op(name, image, magnitude, sign),
                    err_msg=f"{name} M={magnitude} sign={sign}",
                )


def test_auto_contrast_is_the_exact_integer_stretch():
    # A second reference, in integers: floor((x - low) * 255 / (high - low)).
    image = sample_images()[1].astype(np.int64)
    low, high = image.min(axis=(0, 1)), image.max(axis=(0, 1))
    expected = (image - low) * 255 // (high - low)
    got = augment_ops.auto_contrast(tf.constant(image, tf.uint8)[None])[0]
    np.testing.assert_array_equal(got, expected)


def bilinear_exact(image, u, v):
    """PIL's bilinear value at integer-centred (u, v) in float64 (points inside only).

    Returns:
      (values, certain): `certain` where every neighbour with a nonzero weight
      has the same value, so that any arithmetic gives that integer exactly.
    """
    x0, y0 = np.floor(u).astype(int), np.floor(v).astype(int)
    dx, dy = (u - x0)[..., None], (v - y0)[..., None]
    height, width = image.shape[:2]
    x1, y1 = np.minimum(x0 + 1, width - 1), np.minimum(y0 + 1, height - 1)
    pixels = image.astype(np.float64)
    corners = [pixels[y0, x0], pixels[y0, x1], pixels[y1, x0], pixels[y1, x1]]
    top = corners[0] + (corners[1] - corners[0]) * dx
    bottom = corners[2] + (corners[3] - corners[2]) * dx
    used = [np.ones_like(dx, bool), dx > 0, dy > 0, (dx > 0) & (dy > 0)]
    certain = np.all([(c == corners[0]) | ~w for c, w in zip(corners, used)], axis=0)
    return top + (bottom - top) * dy, certain


def assert_geometric_equals_pil(name, image, magnitude, sign, got):
    """A geometric op's image against PIL's: the fill outside; inside exact but where the
    exact value is within 2e-3 of an integer (then 1 apart at most). Returns the count
    of values compared exactly."""
    height, width = image.shape[:2]
    want = reference_op(name, image, magnitude, sign).astype(int)
    got = got.astype(int)
    a, b, c, d, e, f = reference_matrix(name, magnitude, sign, width, height)
    y, x = np.mgrid[0:height, 0:width] + 0.5
    u, v = a * x + b * y + c - 0.5, d * x + e * y + f - 0.5  # integer centres
    inside = (u >= -1e-6) & (u <= width - 1 + 1e-6) & (v >= -1e-6) & (v <= height - 1 + 1e-6)
    outside = (u < -1 - 1e-6) | (u > width + 1e-6) | (v < -1 - 1e-6) | (v > height + 1e-6)
    assert (got[outside] == FILL).all() and (want[outside] == FILL).all()
    exact, certain = bilinear_exact(image, np.clip(u, 0, width - 1), np.clip(v, 0, height - 1))
    ambiguous = (np.abs(exact - np.round(exact)) < 2e-3) & ~certain
    sure = inside[..., None] & ~ambiguous
    message = f"{name} M={magnitude} sign={sign}"
    np.testing.assert_array_equal(got[sure], want[sure], err_msg=message)
    assert np.abs(got - want)[inside].max(initial=0) <= 1, message
    return sure.sum()


@pytest.mark.parametrize("name", GEOMETRIC)
def test_geometric_ops_equal_pil_inside_and_fill_outside(name):
    compared = total = 0
    for image in sample_images():
        for magnitude in MAGNITUDES:
            for sign in (-1, 1):
                got = apply(name, image, magnitude, sign)
                compared += assert_geometric_equals_pil(name, image, magnitude, sign, got)
                total += got.size
    assert compared > 0.4 * total  # Not vacuous: most pixels of most cases are compared.


def test_geometric_ops_move_the_content_the_documented_way():
    # A single bright pixel, followed through each op at an exact magnitude.
    image = np.zeros((20, 20, 3), np.uint8)
    image[6, 4] = 255
    moved = apply("TranslateX", image, 10 / 4.5, 1)  # content 2 px left (0.1 of 20)
    assert moved[6, 2].min() >= 250 and moved[6, 4].max() <= 5
    moved = apply("TranslateY", image, 10 / 4.5, -1)  # content 2 px down
    assert moved[8, 4].min() >= 250 and moved[6, 4].max() <= 5
    sheared = apply("ShearX", image, 10, 1)  # row y reads x + 0.3 (y + 0.5): left by 1.95
    assert sheared[6, 2].min() >= 240
    image = np.zeros((20, 20, 3), np.uint8) + np.uint8(FILL)
    image[6, 4] = 255
    rotated = apply("Rotate", image, 3, 1)  # +9 degrees: counter-clockwise
    row, column = np.unravel_index(rotated[..., 0].argmax(), (20, 20))
    assert row > 6 and column < 5  # Upper left of the centre moves down and left.


@pytest.mark.parametrize("name", [op for op in ra.OPS if op not in ("AutoContrast", "Equalize")])
def test_every_op_with_a_magnitude_is_the_identity_at_zero(name):
    for image in sample_images():
        for sign in (-1, 1):
            np.testing.assert_array_equal(apply(name, image, 0.0, sign), image, err_msg=name)


# -- the policy --------------------------------------------------------------------


def test_ops_and_signs_are_drawn_uniformly():
    draws = [ra.choose_ops(tf.constant([3, i], tf.int64), 2) for i in range(1400)]
    indices = np.concatenate([index.numpy() for index, _ in draws])
    signs = np.concatenate([sign.numpy() for _, sign in draws])
    counts = np.bincount(indices, minlength=len(ra.OPS))
    assert len(counts) == 14
    expected = len(indices) / 14
    chi_square = ((counts - expected) ** 2 / expected).sum()
    assert chi_square < 40  # 13 degrees of freedom: P(chi2 > 40) < 1e-4.
    assert set(signs) == {-1.0, 1.0} and abs(signs.mean()) < 4.5 / math.sqrt(len(signs))


def test_randaugment_applies_its_drawn_ops_in_turn():
    # Each seed's ops, composed on PIL: equal for pointwise ops, and close
    # (edges and truncations apart) when a geometric op is among them.
    image = sample_images()[0]
    exact = close = 0
    for i in range(40):
        seed = tf.constant([5, i], tf.int64)
        indices, signs = ra.choose_ops(seed, 3)
        names = [ra.OPS[index] for index in indices.numpy()]
        expected = image
        for name, sign in zip(names, signs.numpy()):
            expected = reference_op(name, expected, 7.0, sign)
        got = one_by_one(image, indices, signs, 7.0)
        if not set(names) & set(GEOMETRIC):
            np.testing.assert_array_equal(got, expected, err_msg=str(names))
            exact += 1
        elif names[-1] in GEOMETRIC and not set(names[:-1]) & set(GEOMETRIC):
            # Equal before a geometric op, which differs by 1 at most inside (earlier
            # ones would carry their edge differences into the ops after them).
            difference = np.abs(got[2:-2, 2:-2].astype(int) - expected[2:-2, 2:-2])
            assert (difference <= 1).mean() > 0.9, names
            close += 1
    assert exact >= 3 and close >= 3


def test_a_batch_is_augmented_as_each_of_its_images():
    # apply_ops runs each op once on the images that drew it: as each image alone.
    images = np.stack([image[:, :32] for image in sample_images()] * 10)
    rng = np.random.default_rng(4)
    indices = np.stack([rng.permutation(30) % 14 for _ in range(2)], axis=1).astype(np.int32)
    signs = rng.choice([-1.0, 1.0], indices.shape).astype(np.float32)
    assert set(indices[:, 0]) == set(range(14))  # Every op, with both signs.
    batch = augment_ops.apply_ops(tf.constant(images), indices, signs, 9.0, FILL, ra.RANGES)
    for image, index, sign, got in zip(images, indices, signs, batch.numpy()):
        np.testing.assert_array_equal(got, one_by_one(image, index, sign, 9.0))


def test_same_seed_same_image_other_seed_other_image():
    image = tf.constant(sample_images()[0][:, :32])
    config = with_augment(CIFAR, randaugment_ops=2, erase_probability=0.5)

    def augment(i):
        return preprocessing.cifar_train(image, tf.constant([7, i], tf.int64), config).numpy()

    first = augment(3)
    np.testing.assert_array_equal(first, augment(3))
    others = [augment(i) for i in range(4, 10)]
    assert all(not np.array_equal(first, other) for other in others)


# -- random erasing ----------------------------------------------------------------


def over_seeds(function, seeds):
    """`function(seed)` of each int64 [2] seed in `seeds` ([n, 2]), in one tf.data pass
    (thousands of eager calls cost seconds): its results as NumPy arrays [n, ...]."""
    seeds = tf.constant(np.asarray(seeds), tf.int64)
    dataset = tf.data.Dataset.from_tensor_slices(seeds).map(function).batch(len(seeds))
    return tf.nest.map_structure(lambda value: value.numpy(), next(iter(dataset)))


ERASE = augmentations.AUGMENTATIONS["erase"]


def erase_boxes(count, probability, area_range, aspect_range, size):
    """The boxes of `count` examples' seeds."""
    example_seeds = [(11, i) for i in range(count)]
    config = with_augment(CIFAR, erase_probability=0.5)
    draws = over_seeds(lambda s: ERASE.draw(s, config)["draws"], example_seeds)
    augment = AugmentSettings(
        erase_probability=probability, erase_area_range=area_range, erase_aspect_range=aspect_range
    )
    return augmentations.erase_boxes(draws, size, augment).numpy()


def failure_per_attempt(size, area_range, aspect_range, count=400_000):
    """NumPy: the chance one attempt's box does not fit (timm's rule)."""
    rng = np.random.default_rng(0)
    area = size * size * rng.uniform(*area_range, count)
    aspect = np.exp(rng.uniform(*np.log(aspect_range), count))
    height, width = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))
    fits = (height >= 1) & (width >= 1) & (height < size) & (width < size)
    return 1 - fits.mean()


@pytest.mark.parametrize("probability", [0.25, 0.7])
def test_erased_fraction_matches_the_probability(probability):
    count, size = 4000, 32
    area_range, aspect_range = (0.02, 1 / 3), (0.3, 1 / 0.3)
    boxes = erase_boxes(count, probability, area_range, aspect_range, size)
    erased = (boxes[:, 2] > 0).mean()
    expected = probability * (1 - failure_per_attempt(size, area_range, aspect_range) ** 10)
    sigma = math.sqrt(expected * (1 - expected) / count)
    assert abs(erased - expected) < 4.5 * sigma


@pytest.mark.parametrize(
    "size,area_range,aspect_range", [(32, (0.02, 1 / 3), (0.3, 1 / 0.3)), (24, (0.1, 0.2), (1, 2))]
)
def test_erased_boxes_stay_inside_with_area_and_aspect_in_range(size, area_range, aspect_range):
    boxes = erase_boxes(1500, 1.0, area_range, aspect_range, size)
    top, left, height, width = boxes[boxes[:, 2] > 0].T
    assert len(top) > 1400
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + height <= size).all() and (left + width <= size).all()
    assert (height < size).all() and (width < size).all()
    # height = round(sqrt(area * aspect)), width = round(sqrt(area / aspect)), each +-0.5.
    tiny = 1e-4
    area = size * size
    assert ((height - 0.5) * (width - 0.5) <= area * area_range[1] * (1 + tiny)).all()
    assert ((height + 0.5) * (width + 0.5) >= area * area_range[0] * (1 - tiny)).all()
    assert ((height - 0.5) / (width + 0.5) <= aspect_range[1] * (1 + tiny)).all()
    assert ((height + 0.5) / (width - 0.5) >= aspect_range[0] * (1 - tiny)).all()
    # Placed uniformly: the tops of boxes of at most half the height spread.
    assert len(set(top[height <= size // 2])) >= size // 2


def test_erasing_replaces_exactly_the_box_with_normal_noise():
    image = tf.constant(sample_images()[0][:, :32])
    noise = []
    for i in range(60):
        seed = seeds.example_seed(0, 1, i)
        config = with_augment(CIFAR, erase_probability=1.0)
        plain = preprocessing.cifar_train(image, seed, CIFAR).numpy()
        erased = preprocessing.cifar_train(image, seed, config).numpy()
        draws = augmentations.draws(seed, config)["erase"]["draws"]
        boxes = augmentations.erase_boxes(draws[None], 32, config.augment)
        top, left, height, width = boxes[0].numpy()
        mask = np.zeros((32, 32, 1), bool)
        mask[top : top + height, left : left + width] = True
        assert mask.any()
        # Outside the box: the crop and flip draws are those without erasing.
        np.testing.assert_array_equal(np.where(mask, 0, erased), np.where(mask, 0, plain))
        inside = erased[np.broadcast_to(mask, erased.shape)]
        assert (inside != plain[np.broadcast_to(mask, plain.shape)]).mean() > 0.99
        noise.append(inside)
    noise = np.concatenate(noise)
    assert len(noise) > 5000
    assert abs(noise.mean()) < 5 / math.sqrt(len(noise)) and abs(noise.std() - 1) < 0.05


# -- the pipeline --------------------------------------------------------------------


def take(dataset, count):
    images, ids = [], []
    for batch in dataset:
        images.append(batch["image"].numpy())
        ids.append(batch["id"].numpy())
        if sum(len(i) for i in ids) >= count:
            break
    return np.concatenate(images)[:count], np.concatenate(ids)[:count]


def old_cifar_train(image, seed, config):
    """The CIFAR recipe before RandAugment and erasing, in NumPy, from the same draws."""
    uniform = tf.random.stateless_uniform([3], seed).numpy()
    top, left, flip = np.floor(uniform * np.float32([9, 9, 2])).astype(int)
    normalized = (image.astype(np.float32) - np.float32(config.mean)) / np.float32(config.std)
    padded = np.pad(normalized, ((4, 4), (4, 4), (0, 0)))
    crop = padded[top : top + 32, left : left + 32]
    return crop[:, ::-1] if flip else crop


def old_imagenet_train(image, seed, config):
    """The ImageNet recipe before RandAugment and erasing, on decoded pixels."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=crop_seed,
        min_object_covered=0.0,
        aspect_ratio_range=config.augment.aspect_ratio_range,
        area_range=config.augment.area_range,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    crop = image[begin[0] : begin[0] + size[0], begin[1] : begin[1] + size[1]]
    crop = tf.image.resize(tf.cast(crop, tf.float32), [config.image_size] * 2)
    crop = tf.image.stateless_random_flip_left_right(crop, seed=flip_seed)
    return ((crop - config.mean) / config.std).numpy()


def shapes_pipeline(**fields):
    config = dict(dataset="shapes", train_examples=64, eval_examples=16, **fields)
    return input_pipeline.create_pipeline(data_config(**config))


def assert_per_example_and_enterable(augment: dict) -> np.ndarray:
    """The `shapes` training stream with `augment` on: each example is `cifar_train` of
    its own seed, and the stream entered mid-epoch is the rest of the whole one.

    Returns:
      The stream's first 96 images, their ids and the pipeline.
    """
    pipeline = shapes_pipeline(augment=augment)
    images, ids = take(pipeline.train_dataset(8), 96)
    for position in range(0, 96, 11):
        seed = seeds.example_seed(0, position // 64, ids[position])
        original = tf.constant(pipeline.train_split.images[ids[position]])
        expected = preprocessing.cifar_train(original, seed, pipeline.preprocessing)
        np.testing.assert_array_equal(images[position], expected.numpy())
    entered, entered_ids = take(pipeline.train_dataset(8, start_example=56), 40)
    np.testing.assert_array_equal(entered_ids, ids[56:])
    np.testing.assert_array_equal(entered, images[56:])
    return images, ids, pipeline


def test_with_the_options_off_cifar_training_images_are_the_old_recipe_bitwise():
    pipeline = shapes_pipeline()
    assert pipeline.preprocessing.augment.randaugment_ops == 0
    assert pipeline.preprocessing.augment.erase_probability == 0
    images, ids = take(pipeline.train_dataset(16), 80)
    for position in range(0, 80, 7):
        epoch = position // 64
        seed = seeds.example_seed(0, epoch, ids[position])
        original = pipeline.train_split.images[ids[position]]
        expected = old_cifar_train(original, seed, pipeline.preprocessing)
        np.testing.assert_array_equal(images[position], expected)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder of 12 PNG images, 64x48, in 2 classes."""
    root = tmp_path_factory.mktemp("folder")
    rng = np.random.default_rng(0)
    for i in range(12):
        directory = root / "train" / f"class{i % 2}"
        directory.mkdir(parents=True, exist_ok=True)
        y, x = np.mgrid[0:48, 0:64]
        image = 128 + 90 * np.sin(x / (5 + i) + np.arange(3)[:, None, None]) * np.cos(y / 7)
        image = np.clip(image.transpose(1, 2, 0) + rng.normal(0, 10, (48, 64, 3)), 0, 255)
        (directory / f"{i}.png").write_bytes(tf.io.encode_png(image.astype(np.uint8)).numpy())
    return str(root)


def folder_pipeline(root, **fields):
    config = data_config(
        dataset=f"folder:{root}", image_size=40, preprocessing="imagenet", **fields
    )
    return input_pipeline.create_pipeline(config)


def test_with_the_options_off_imagenet_training_images_are_the_old_recipe_bitwise(folder):
    pipeline = folder_pipeline(folder)
    images, ids = take(pipeline.train_dataset(4), 12)
    for position in range(12):
        seed = seeds.example_seed(0, 0, ids[position])
        path = pipeline.train_split.files[ids[position]]
        pixels = tf.io.decode_png(tf.io.read_file(path), channels=3)
        expected = old_imagenet_train(pixels, seed, pipeline.preprocessing)
        np.testing.assert_array_equal(images[position], expected)


def assert_per_example_cifar_recipe(pipeline, images, ids):
    """Every 5th image of the first 80 of a 64-example stream is `cifar_train` of its example."""
    for position in range(0, 80, 5):
        seed = seeds.example_seed(0, position // 64, ids[position])
        original = tf.constant(pipeline.train_split.images[ids[position]])
        expected = preprocessing.cifar_train(original, seed, pipeline.preprocessing)
        np.testing.assert_array_equal(images[position], expected.numpy())


def test_cifar_pipeline_with_the_options_on_is_the_per_example_recipe():
    pipeline = shapes_pipeline(randaugment_ops=2, randaugment_magnitude=9, erase_probability=0.5)
    off = shapes_pipeline()
    images, ids = take(pipeline.train_dataset(16), 80)
    plain, _ = take(off.train_dataset(16), 80)
    assert_per_example_cifar_recipe(pipeline, images, ids)
    # The options change the images; the order stays.
    assert np.mean([not np.array_equal(a, b) for a, b in zip(images, plain)]) > 0.5


def test_imagenet_pipeline_with_the_options_on_is_the_per_example_recipe(folder):
    pipeline = folder_pipeline(folder, randaugment_ops=2, erase_probability=0.5)
    off = folder_pipeline(folder)
    images, ids = take(pipeline.train_dataset(4), 12)
    plain, _ = take(off.train_dataset(4), 12)
    for position in range(12):
        seed = seeds.example_seed(0, 0, ids[position])
        encoded = tf.io.read_file(pipeline.train_split.files[ids[position]])
        expected = preprocessing.imagenet_train(encoded, seed, pipeline.preprocessing, True)
        np.testing.assert_array_equal(images[position], expected.numpy())
        assert not np.array_equal(images[position], plain[position])


def test_entering_an_augmented_stream_anywhere_gives_the_same_images():
    assert_per_example_and_enterable({"randaugment_ops": 2, "erase_probability": 0.25})


def test_the_augmented_batch_of_a_step_is_the_same_on_1_and_3_towers(tmp_path):
    """RandAugment, erasing and per-example Mixup/CutMix: the same images, ids,
    partners and shares, whether the step's batch goes to 1 tower or 3."""
    from resnet_app.engine import setup
    from tests import runs

    batches = {}
    for towers in (1, 3):
        config = runs.small_config(
            tmp_path,
            "data.randaugment_ops=2",
            "data.erase_probability=0.5",
            "data.mixup_alpha=0.4",
            "data.cutmix_alpha=1.0",
            "data.mix_mode=example",
            "train.batch_size=24",
            train_steps=2,
            num_towers=towers,
        )
        run = setup.build_run(config, str(tmp_path / f"towers{towers}"))
        batch = next(iter(run.train_dataset(run.plan.sizes.size_at(0))))
        batches[towers] = {}
        for key in ("image", "id", "label", "mix_label", "mix_weight"):
            parts = run.strategy.experimental_local_results(batch[key])
            assert len(parts) == towers
            batches[towers][key] = np.concatenate([part.numpy() for part in parts])
    assert batches[1]["image"].shape == (24, 32, 32, 3)
    assert np.any(batches[1]["mix_weight"] < 1)  # Mixed examples are in the batch.
    for key, value in batches[1].items():
        np.testing.assert_array_equal(batches[3][key], value, err_msg=key)


# -- settings --------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("randaugment_ops", -1),
        ("randaugment_ops", 15),
        ("randaugment_magnitude", -0.5),
        ("randaugment_magnitude", 31),
        ("erase_probability", -0.1),
        ("erase_probability", 1.5),
        ("erase_area_range", (0.5, 0.1)),
        ("erase_area_range", (0.0, 0.3)),
        ("erase_area_range", (0.1, 1.5)),
        ("erase_area_range", (0.1,)),
        ("erase_aspect_range", (2.0, 1.0)),
        ("erase_aspect_range", (-1.0, 3.0)),
        ("erase_aspect_range", (0.3, 1.0, 3.0)),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_key(field, value):
    with pytest.raises(ConfigError, match=field) as error:
        data_config(**{field: value})
    assert "\n" not in str(error.value)


def test_the_options_are_config_keys_and_reach_the_preprocessing():
    from resnet_app import config

    resolved = config.resolve(
        sets=[
            "data.randaugment_ops=3",
            "data.randaugment_magnitude=12.5",
            "data.erase_probability=0.3",
            "data.erase_area_range=[0.05, 0.2]",
            "data.erase_aspect_range=[0.5, 2]",
            "data.train_examples=16",
        ]
    )
    pipeline = run_pipeline.create_run_pipeline(resolved)
    got = pipeline.preprocessing.augment
    assert (got.randaugment_ops, got.randaugment_magnitude, got.erase_probability) == (3, 12.5, 0.3)
    assert got.erase_area_range == (0.05, 0.2) and got.erase_aspect_range == (0.5, 2.0)
    with pytest.raises(
        ConfigError, match=r"randaugment_ops must be 0 \(off\) to 14 ops, .*, got 20"
    ):
        config.resolve(sets=["data.randaugment_ops=20"])


def test_old_data_info_reads_with_the_options_off_and_new_ones_round_trip(tmp_path):
    _, old = run_pipeline.read_data_info(str(FIXTURE))
    assert "randaugment_ops" not in json.loads((FIXTURE / "data_info.json").read_text())
    assert old.augment.randaugment_ops == 0 and old.augment.erase_probability == 0.0
    assert old.eval_resize == 37 and old.family == "cifar"
    new = with_augment(old, randaugment_ops=2, erase_area_range=(0.1, 0.2))
    info = {"dataset": "shapes", "class_names": ["a"], "preprocessing": dataclasses.asdict(new)}
    (tmp_path / "data_info.json").write_text(json.dumps(info))
    assert run_pipeline.read_data_info(str(tmp_path))[1] == new
