"""TrivialAugment-wide: its ranges against torchvision's definition, each op against
torchvision's PIL path (written here from torchvision's `_apply_op`), the draws, the
pipeline (per example, enterable anywhere) and the config checks.

The reference is torchvision's `TrivialAugmentWide(interpolation=NEAREST, fill=...)`
on a PIL image (PIL's transforms with torchvision's inverse affine matrices, float32
`torch.linspace` magnitudes). Pointwise, histogram and blend ops are exact; geometric
ops may differ only where a source point lies on a pixel boundary (a tie float32 and
doubles break apart; rotations by 45 degrees hit whole lines: `GEOMETRIC_MISMATCH`).
"""

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageEnhance, ImageOps

from resnet_app.common.errors import ConfigError
from resnet_app.data import augment_ops, augmentations, seeds, settings, trivialaugment
from resnet_app.data import randaugment as ra
from resnet_app.data.settings import data_config
from tests.test_randaugment import (
    FILL,
    assert_per_example_and_enterable,
    old_cifar_train,
    one_by_one,
    over_seeds,
    sample_images,
    shapes_pipeline,
    take,
)
from tests.test_randaugment import apply as apply_ranges

GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")
SIGNED = (*GEOMETRIC, "Brightness", "Color", "Contrast", "Sharpness")
BINS = (0, 1, 7, 14, 15, 16, 22, 29, 30)
WIDE, TA = trivialaugment.WIDE_RANGES, trivialaugment.TA_WIDE
KEYS = ("op_indices", "op_signs", "op_magnitudes")
GEOMETRIC_MISMATCH = 0.03

pytestmark = pytest.mark.usefixtures("private_shapes_cache")


# -- the reference: torchvision's TrivialAugmentWide on PIL ----------------------------


def linspace32(start, end, index, steps=31):
    """torch.linspace's float32 value at `index`, as a Python float: its CPU rule, from
    the start for the first half and from the end for the rest, each step a fused
    multiply-add (a single rounding: torch 2.14 gives 15.999999 at index 15 of 0 to 32)."""
    start, end = np.float32(start), np.float32(end)
    step = float((end - start) / np.float32(steps - 1))
    if index < steps // 2:
        return float(np.float32(float(start) + step * index))
    return float(np.float32(float(end) - step * (steps - 1 - index)))


def tv_magnitude(name, index):
    """torchvision's `_augmentation_space(31, ...)` for TrivialAugmentWide, at bin `index`."""
    if name in ("ShearX", "ShearY", "Brightness", "Color", "Contrast", "Sharpness"):
        return linspace32(0.0, 0.99, index)
    if name in ("TranslateX", "TranslateY"):
        return linspace32(0.0, 32.0, index)
    if name == "Rotate":
        return linspace32(0.0, 135.0, index)
    if name == "Posterize":
        return int(8 - round(index / 5))  # torch: (arange / 5).round(): never a half here.
    if name == "Solarize":
        return linspace32(255.0, 0.0, index)
    return 0.0


def inverse_affine(center, angle, translate, shear):
    """torchvision's `_get_inverse_affine_matrix` at scale 1 (PIL's AFFINE data)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    matrix = [d, -b, 0.0, -c, a, 0.0]
    matrix[2] += matrix[0] * (-cx - tx) + matrix[1] * (-cy - ty)
    matrix[5] += matrix[3] * (-cx - tx) + matrix[4] * (-cy - ty)
    matrix[2] += cx
    matrix[5] += cy
    return matrix


def tv_apply_op(name, image, magnitude, resample=Image.NEAREST):
    """torchvision's `_apply_op(img, name, magnitude, interpolation, fill)` on a PIL image,
    at a signed magnitude (its policies' shared op code), NEAREST unless told."""
    pil = Image.fromarray(image)
    width, height = pil.size

    def affine(center, angle=0.0, translate=(0, 0), shear=(0.0, 0.0)):
        matrix = inverse_affine(center, angle, translate, shear)
        return pil.transform(pil.size, Image.AFFINE, matrix, resample, fillcolor=FILL)

    centre = (width * 0.5, height * 0.5)  # F.affine's centre for PIL images.
    out = {
        "ShearX": lambda: affine((0, 0), shear=(math.degrees(math.atan(magnitude)), 0.0)),
        "ShearY": lambda: affine((0, 0), shear=(0.0, math.degrees(math.atan(magnitude)))),
        "TranslateX": lambda: affine(centre, translate=(int(magnitude), 0)),
        "TranslateY": lambda: affine(centre, translate=(0, int(magnitude))),
        "Rotate": lambda: pil.rotate(magnitude, resample=resample, fillcolor=FILL),
        "Brightness": lambda: ImageEnhance.Brightness(pil).enhance(1.0 + magnitude),
        "Color": lambda: ImageEnhance.Color(pil).enhance(1.0 + magnitude),
        "Contrast": lambda: ImageEnhance.Contrast(pil).enhance(1.0 + magnitude),
        "Sharpness": lambda: ImageEnhance.Sharpness(pil).enhance(1.0 + magnitude),
        "Posterize": lambda: ImageOps.posterize(pil, int(magnitude)),
        "Solarize": lambda: ImageOps.solarize(pil, magnitude),
        "AutoContrast": lambda: ImageOps.autocontrast(pil),
        "Equalize": lambda: ImageOps.equalize(pil),
        "Invert": lambda: ImageOps.invert(pil),
        "Identity": lambda: pil,
    }[name]()
    return np.asarray(out)


def reference_op(name, image, index, sign):
    """TrivialAugmentWide's op `name` at bin `index` and `sign`, torchvision's way."""
    return tv_apply_op(name, image, tv_magnitude(name, index) * (sign if name in SIGNED else 1))


def apply(name, image, index, sign):
    """Our op at bin `index` on one image (a batch of one), TrivialAugment's ranges."""
    return apply_ranges(name, image, tf.constant([float(index)]), sign, WIDE)


# -- the ranges --------------------------------------------------------------------


def test_the_ranges_are_torchvisions_wide_bins():
    tables = trivialaugment.TABLES
    k = np.arange(31)
    np.testing.assert_array_equal(tables["degrees"], 4.5 * k)  # 135 / 30, exact in float32.
    # int() of 32k/30, but at bin 15, where torch's float32 value is 15.999999.
    np.testing.assert_array_equal(tables["translate"], (32 * k) // 30 - (k == 15))
    np.testing.assert_array_equal(tables["threshold"], np.ceil(255 - 8.5 * k))
    np.testing.assert_array_equal(tables["bits"], [8 - round(i / 5) for i in k])
    assert tables["bits"][[0, 2, 3, 28, 30]].tolist() == [8, 8, 7, 2, 2]
    for name in ("shear", "factor"):
        # Within a float32 step of 0.99 k / 30, and torch's float32 values exactly.
        np.testing.assert_allclose(tables[name], 0.99 * k / 30, rtol=0, atol=1.2e-7)
        assert tables[name].tolist() == [linspace32(0.0, 0.99, i) for i in k]


# -- each op against torchvision's PIL path --------------------------------------------


@pytest.mark.parametrize("name", [op for op in ra.OPS if op not in GEOMETRIC])
def test_pointwise_histogram_and_blend_ops_equal_torchvision(name):
    for image in sample_images():
        for index in BINS:
            for sign in (-1, 1):
                np.testing.assert_array_equal(
                    apply(name, image, index, sign),
                    reference_op(name, image, index, sign),
                    err_msg=f"{name} bin={index} sign={sign}",
                )


def tv_matrix(name, magnitude, width, height):
    """PIL's affine matrix of torchvision's geometric op at a signed magnitude
    (Image.rotate's about the centre, unrounded, for Rotate)."""
    if name == "Rotate":
        angle = -math.radians(magnitude)
        cos, sin = math.cos(angle), math.sin(angle)
        cx, cy = width / 2, height / 2
        return (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)
    shear = math.degrees(math.atan(magnitude))
    centre = (width / 2, height / 2)
    return {
        "ShearX": lambda: inverse_affine((0, 0), 0.0, (0, 0), (shear, 0.0)),
        "ShearY": lambda: inverse_affine((0, 0), 0.0, (0, 0), (0.0, shear)),
        "TranslateX": lambda: inverse_affine(centre, 0, (int(magnitude), 0), (0, 0)),
        "TranslateY": lambda: inverse_affine(centre, 0, (0, int(magnitude)), (0, 0)),
    }[name]()


def source_ties(name, magnitude, width, height):
    """bool [H, W]: the output pixels whose source point, in doubles, lies within 1e-3 of a
    pixel boundary, for a geometric op at a signed magnitude (torchvision's)."""
    y, x = np.mgrid[0:height, 0:width] + 0.5
    a, b, c, d, e, f = tv_matrix(name, magnitude, width, height)
    u, v = a * x + b * y + c, d * x + e * y + f
    return np.minimum(np.abs(u - np.round(u)), np.abs(v - np.round(v))) < 1e-3


@pytest.mark.parametrize("name", GEOMETRIC)
def test_geometric_ops_equal_torchvision_nearest_but_at_ties(name):
    """A pixel may differ only where its exact source point lies on a pixel boundary (a
    rotation by 45 degrees puts whole lines of points there), within 1e-3 of it: there
    float32 and PIL's doubles (its sines rounded to 15 digits) break the tie apart."""
    for image in sample_images():
        height, width = image.shape[:2]
        for index in BINS:
            for sign in (-1, 1):
                ours = apply(name, image, index, sign)
                theirs = reference_op(name, image, index, sign)
                differ = np.any(ours != theirs, axis=-1)
                tie = source_ties(name, tv_magnitude(name, index) * sign, width, height)
                assert not np.any(differ & ~tie), (name, index, sign, np.argwhere(differ & ~tie))
                assert differ.mean() <= GEOMETRIC_MISMATCH, (name, index, sign)


def test_translate_moves_whole_pixels_right_and_down_for_a_positive_sign():
    image = np.zeros((8, 10, 3), np.uint8)
    image[2, 3] = 255
    moved = apply("TranslateX", image, 30, 1)  # 32 px: off the image.
    assert np.all(moved == FILL)
    moved = apply("TranslateX", image, 1, 1)  # 32 / 30 -> 1 px right.
    assert moved[2, 4].tolist() == [255, 255, 255] and moved[2, 3].tolist() != [255] * 3
    moved = apply("TranslateY", image, 1, -1)  # 1 px up.
    assert moved[1, 3].tolist() == [255, 255, 255]


# -- the draws and the policy ---------------------------------------------------------


def test_ops_bins_and_signs_are_drawn_uniformly():
    drawn = over_seeds(lambda seed: TA.draw(seed, None), [(i, 7) for i in range(3000)])
    ops, signs, bins = (drawn[key][:, 0] for key in KEYS)
    assert set(ops) == set(range(14)) and set(bins) == set(range(31))
    # 3000 draws: each op's share within 5 standard deviations of 1/14, each bin's of 1/31.
    for values, count in ((ops, 14), (bins, 31)):
        shares = np.bincount(values.astype(int), minlength=count) / len(values)
        bound = 5 * math.sqrt((1 / count) * (1 - 1 / count) / len(values))
        assert np.all(np.abs(shares - 1 / count) < bound)
    assert abs(np.mean(signs > 0) - 0.5) < 5 * math.sqrt(0.25 / 3000)


def test_one_op_per_image_as_drawn_and_a_batch_as_each_of_its_images():
    images = np.stack(sample_images() * 4)  # 12 images.
    drawn = [TA.draw(tf.constant([i, 3], tf.int64), None) for i in range(12)]
    indices, signs, bins = (tf.concat([d[k] for d in drawn], 0)[:, None] for k in KEYS)
    batch = augment_ops.apply_ops(tf.constant(images), indices, signs, bins, FILL, WIDE).numpy()
    for i, (index, sign, bin_) in enumerate(zip(indices[:, 0], signs[:, 0], bins[:, 0])):
        name = ra.OPS[int(index)]
        expected = apply(name, images[i], int(bin_), float(sign))
        np.testing.assert_array_equal(batch[i], expected, err_msg=name)
        single = one_by_one(images[i], indices[i], signs[i], bins[i], WIDE)
        np.testing.assert_array_equal(single, expected, err_msg=name)


# -- the pipeline and the config -------------------------------------------------------


def test_the_pipeline_augments_each_example_by_its_own_draw_and_enters_anywhere():
    images, _, _ = assert_per_example_and_enterable({"auto_augment": "ta_wide"})
    plain, _ = take(shapes_pipeline().train_dataset(8), 96)
    # One op in 14 is the Identity, and a few others change little: most images change.
    assert np.mean([not np.array_equal(a, b) for a, b in zip(images, plain)]) > 0.6


def test_it_replaces_randaugment_and_is_a_config_key():
    from resnet_app import config

    message = "data.augment.auto_augment=ta_wide replaces RandAugment, and randaugment_ops=2"
    with pytest.raises(ConfigError, match=message):
        data_config(augment={"auto_augment": "ta_wide", "randaugment_ops": 2})
    resolved = config.resolve(sets=["data.augment.auto_augment=ta_wide"])
    assert resolved.data.augment.auto_augment == "ta_wide"
    message = "auto_augment must be one of: none, ta_wide, imagenet, cifar10, svhn, augmix"
    with pytest.raises(ConfigError, match=message):
        config.resolve(sets=["data.augment.auto_augment=ta"])


# -- a toy op, registered here with no other edit ----------------------------------------


class Darken(augment_ops.Op):
    """Toy op: each value halved, x // 2 (no magnitude)."""

    def apply(self, images, signs, magnitude, fill, ranges):
        return images // 2


def test_a_toy_op_is_used_by_a_policy_checked_by_the_config_and_resumed_bitwise(monkeypatch):
    """The op, a TrivialAugment over it and the Identity, and that policy's name: the
    config takes the name; each image is the recipe (NumPy) on itself or on its halved
    pixels, as its per-example path makes it, and the stream entered mid-epoch alike."""
    from resnet_app import config

    toy = trivialaugment.TrivialAugment(
        "toy", dataclasses.replace(WIDE, ops=("Identity", "Darken")), 2
    )
    monkeypatch.setitem(augment_ops.OPS, "Darken", Darken())
    monkeypatch.setitem(augmentations.AUGMENTATIONS, "toy", toy)
    monkeypatch.setitem(settings.AUTO_AUGMENTS, "toy", None)
    assert config.resolve(sets=["data.augment.auto_augment=toy"]).data.augment.auto_augment == "toy"
    with pytest.raises(ConfigError, match="one of: none, .*, augmix, toy, got 'toys'"):
        config.resolve(sets=["data.augment.auto_augment=toys"])
    images, ids, pipeline = assert_per_example_and_enterable({"auto_augment": "toy"})
    halved = 0
    for position in range(0, 96, 3):
        seed = seeds.example_seed(0, position // 64, ids[position])
        original = pipeline.train_split.images[ids[position]]
        plain, dark = (
            old_cifar_train(x, seed, pipeline.preprocessing) for x in (original, original // 2)
        )
        assert np.array_equal(images[position], plain) or np.array_equal(images[position], dark)
        halved += np.array_equal(images[position], dark) and not np.array_equal(plain, dark)
    assert 5 < halved < 27  # Half of 32, within 4 sigma.
