"""AutoAugment's policies: the ranges against torchvision's definition, each op at each
bin against torchvision's PIL path (tests/test_trivialaugment.py's reference, the
code both policies share there), the draws against the policy's chances, and the
pipeline. Tolerances as in tests/test_trivialaugment.py: exact, but geometric ops
at ties on pixel boundaries."""

import math

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.data import autoaugment as aa
from tests.test_randaugment import apply as apply_ranges
from tests.test_randaugment import assert_per_example_and_enterable, over_seeds, sample_images
from tests.test_trivialaugment import GEOMETRIC, SIGNED, linspace32, source_ties, tv_apply_op

pytestmark = pytest.mark.usefixtures("private_shapes_cache")


def tv_magnitude(name, index, width, height):
    """torchvision's `AutoAugment._augmentation_space(10, (height, width))` at bin `index`."""
    if name in ("ShearX", "ShearY"):
        return linspace32(0.0, 0.3, index, 10)
    if name == "TranslateX":
        return linspace32(0.0, 150.0 / 331.0 * width, index, 10)
    if name == "TranslateY":
        return linspace32(0.0, 150.0 / 331.0 * height, index, 10)
    if name == "Rotate":
        return linspace32(0.0, 30.0, index, 10)
    if name in ("Brightness", "Color", "Contrast", "Sharpness"):
        return linspace32(0.0, 0.9, index, 10)
    if name == "Posterize":
        return int(8 - round(index / 2.25))
    if name == "Solarize":
        return linspace32(255.0, 0.0, index, 10)
    return 0.0


def apply(name, image, index, sign):
    return apply_ranges(name, image, tf.constant([float(index)]), sign, aa.RANGES)


def test_the_ranges_are_torchvisions_ten_bins():
    k = np.arange(10)
    assert aa.TABLES["bits"].tolist() == [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]
    np.testing.assert_array_equal(aa.TABLES["threshold"], np.ceil(255 - 255 * k / 9 - 1e-9))
    for name, top in (("degrees", 30.0), ("shear", 0.3), ("factor", 0.9)):
        assert aa.TABLES[name].tolist() == [linspace32(0.0, top, i, 10) for i in k]
        np.testing.assert_allclose(aa.TABLES[name], top * k / 9, rtol=1e-6, atol=0)
    for size in (28, 32, 40, 224, 331):
        pixels = aa.translation(tf.constant(k, tf.float32), tf.constant(float(size))).numpy()
        assert pixels.tolist() == [int(linspace32(0.0, 150 / 331 * size, i, 10)) for i in k]
        assert pixels[-1] == int(150 / 331 * size)


def test_the_policies_are_the_papers():
    for name, policy in aa.POLICIES.items():
        assert len(policy) == 25, name
        for pair in policy:
            assert len(pair) == 2
            for op, chance, bin_ in pair:
                assert op in aa.OPS and 0 <= chance <= 1
                assert (bin_ is None) == (op in ("AutoContrast", "Equalize", "Invert"))
                assert bin_ is None or 0 <= bin_ <= 9
    # Spot checks against the paper's tables (Cubuk et al. 2019, appendix).
    assert aa.POLICIES["imagenet"][0] == (("Posterize", 0.4, 8), ("Rotate", 0.6, 9))
    assert aa.POLICIES["cifar10"][1] == (("Rotate", 0.7, 2), ("TranslateX", 0.3, 9))
    assert aa.POLICIES["svhn"][0] == (("ShearX", 0.9, 4), ("Invert", 0.2, None))


@pytest.mark.parametrize("name", aa.OPS)
def test_each_op_at_each_bin_equals_torchvision(name):
    for image in sample_images():
        height, width = image.shape[:2]
        for index in range(10):
            for sign in (-1, 1):
                value = tv_magnitude(name, index, width, height) * (sign if name in SIGNED else 1)
                ours = apply(name, image, index, sign)
                theirs = tv_apply_op(name, image, value)
                if name in GEOMETRIC:  # Exact but at ties (translations have none).
                    differ = np.any(ours != theirs, axis=-1)
                    tie = source_ties(name, value, width, height)
                    assert not np.any(differ & ~tie), (name, index, sign)
                else:
                    np.testing.assert_array_equal(ours, theirs, err_msg=f"{name} {index} {sign}")


def test_sub_policies_and_their_chances_are_drawn_as_the_policy_says():
    count = 4000
    policy = aa.AutoAugment("imagenet")
    drawn = over_seeds(lambda seed: policy.draw(seed, None), [(i, 11) for i in range(count)])
    indices, signs = drawn["op_indices"], drawn["op_signs"]
    applied = indices != aa.OPS.index("Identity")
    # Over the policy, each op applies with the mean of its chances.
    expected = np.mean([[p for _, p, _ in pair] for pair in aa.POLICIES["imagenet"]], axis=0)
    bound = 5 * math.sqrt(0.25 / count)
    np.testing.assert_allclose(applied.mean(axis=0), expected, atol=bound)
    # Where an op applies it is its sub-policy's, with its bin.
    ops = {(pair[0][0], pair[1][0]) for pair in aa.POLICIES["imagenet"]}
    for drawn in indices[:300]:
        names = [aa.OPS[int(i)] for i in drawn]
        assert any(all(n in ("Identity", want) for n, want in zip(names, pair)) for pair in ops), (
            names
        )
    assert abs(np.mean(signs > 0) - 0.5) < 5 * math.sqrt(0.25 / signs.size)


@pytest.mark.parametrize("policy", ["cifar10", "imagenet"])
def test_the_pipeline_augments_each_example_by_its_own_draw_and_enters_anywhere(policy):
    assert_per_example_and_enterable({"auto_augment": policy})


def test_the_configs_choices_are_augmentations_each_kind_with_streams_of_its_own():
    from resnet_app.data.augmentations import AUGMENTATIONS
    from resnet_app.data.settings import AUTO_AUGMENTS

    assert set(AUTO_AUGMENTS) - {"none"} <= set(AUGMENTATIONS)
    # AutoAugment's policies share their class's stream: one is on at most.
    streams = [s for kind in {type(a) for a in AUGMENTATIONS.values()} for s in kind.streams]
    assert len(streams) == len(set(streams))
