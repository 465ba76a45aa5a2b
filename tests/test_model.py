"""Tests of the ResNet builder against the papers and independent references.

References used here: the parameter counts published by He et al. and
torchvision; a closed-form parameter and MAC count written from the papers'
architecture description (not from the builder); and NumPy for the shortcut,
weight decay and unit arithmetic.
"""

import functools
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import compat
from resnet_app.common.errors import ConfigError
from resnet_app.nets import blocks, presets
from resnet_app.nets import resnet as model_lib
from resnet_app.nets.summary import count_params, summarize
from tests import timm_reference
from tests.reference import closed_form_macs, closed_form_params

ALL = presets.model_names(include_test_only=True)
# The deepest presets are checked by parameter count only: a forward pass of
# ResNet-1202 adds nothing that ResNet-110 does not test, at 10x the cost.
DEEPEST = ("resnet1202", "preact_resnet1001")
# Published trainable parameter counts: He et al. 2015 (CIFAR) and torchvision
# (ImageNet v1 networks, which ours match layer for layer).
PUBLISHED_PARAMS = {
    "resnet20": 269_722,
    "resnet32": 464_154,
    "resnet44": 658_586,
    "resnet56": 853_018,
    "resnet110": 1_727_962,
    "resnet1202": 19_421_274,
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
}
# The family's trainable counts: torchvision's `num_params` (ResNeXt, wide
# ResNets), timm 1.0.31's models (ResNet-C/D/S, SE, ECA, ResNet-RS; 1,000
# classes), and WRNs written from Zagoruyko & Komodakis 2016 (10 classes,
# bias-free convs, pre-activation units). tests/timm_reference.py counts the
# timm and torchvision ones from their state dicts (test_timm_reference.py).
FAMILY_PARAMS = {
    **timm_reference.PUBLISHED_PARAMS,
    "wrn28_10": 36_479_194,
    "wrn16_8": 10_961_370,
    "wrn40_4": 8_949_210,
}
# He et al. 2016, table 2 of "Identity Mappings", and Xie et al. 2017, table 7
# (ResNeXt-29 on CIFAR): "about" these many.
APPROXIMATE_PARAMS = {
    "preact_resnet164": 1.7e6,
    "preact_resnet1001": 10.2e6,
    "resnext29_8x64d": 34.4e6,
    "resnext29_16x64d": 68.1e6,
    "resnext50d_32x4d": 25.05e6,  # timm's results table: 25.05 M.
}
# The family's deeper members (4 to 18 s to build each): their counts against
# timm_reference and the closed form in the slow tier only.
DEEP_FAMILY = {
    name
    for name in ALL
    if name not in FAMILY_PARAMS
    and any(
        name.startswith(prefix)
        for prefix in (
            "resnext101",
            "resnet101d",
            "resnet152d",
            "resnet200d",
            "seresnet1",
            "seresnext101",
            "ecaresnet101",
            "resnetrs",
        )
    )
}
# One of each kind of the family, for forward passes: grouped, wide, deep stem
# with the average-pool shortcut, the wide deep stem, SE, ECA, RS, WRN, ResNeXt-29.
FAMILY_FORWARD = [
    "resnext50_32x4d",
    "wide_resnet50_2",
    "resnet18d",
    "resnet50s",
    "seresnet50",
    "ecaresnet50d",
    "resnetrs50",
    "wrn16_8",
    "resnext29_8x64d",
]
HE_ET_AL = [name for name in ALL if name not in DEEP_FAMILY and name not in FAMILY_PARAMS]


@functools.cache
def built(name: str, **overrides) -> model_lib.ResNet:
    """Each preset is built once per session; tests only read it."""
    model = model_lib.create_model(name, **overrides)
    size = model.config.default_image_size
    model.build((None, size, size, 3))
    return model


def layers_of_type(model, types):
    """Every layer of `model`, however deeply nested, that is one of `types`."""
    return [layer for layer in compat.nested_layers(model) if isinstance(layer, types)]


@pytest.mark.parametrize(
    "name",
    [n for n in ALL if n not in DEEP_FAMILY and n not in DEEPEST]
    # The deepest build is ResNet-110's code path 11 times over: in the slow tier.
    + [pytest.param(n, marks=pytest.mark.slow) for n in sorted({*DEEP_FAMILY, *DEEPEST})],
)
def test_parameter_counts_match_the_closed_form_and_the_published_tables(name):
    # Built afresh, not kept: the family holds 2.6 G parameters in all.
    model = built(name) if name in HE_ET_AL or name in FAMILY_FORWARD else _fresh(name)
    trainable, non_trainable = closed_form_params(model.config)
    assert count_params(model.trainable_variables) == trainable
    assert count_params(model.non_trainable_variables) == non_trainable
    if name in FAMILY_PARAMS:
        assert trainable == FAMILY_PARAMS[name]
    if name in timm_reference.ARCHS:  # Counted from timm's or torchvision's state dict.
        assert trainable == timm_reference.trainable_params(name)


def _fresh(name):
    model = model_lib.create_model(name)
    size = model.config.default_image_size
    model.build((None, size, size, 3))
    return model


def _trainable_params(name):
    """The preset's trainable parameter count, as the built network has it.

    The closed form, which the test above ties to the built network (for
    `DEEPEST`, ResNet-1202 and PreAct-1001, in the slow tier, which CI runs);
    the family's deepest presets are built here.
    """
    if name in DEEP_FAMILY:
        return count_params(built(name).trainable_variables)
    return closed_form_params(presets.get_config(name))[0]


@pytest.mark.parametrize("name,expected", sorted(PUBLISHED_PARAMS.items()))
def test_parameter_counts_match_the_published_table(name, expected):
    assert _trainable_params(name) == expected


@pytest.mark.parametrize("name,expected", sorted(APPROXIMATE_PARAMS.items()))
def test_preactivation_parameter_counts_are_about_the_published(name, expected):
    assert _trainable_params(name) == pytest.approx(expected, rel=0.02)


def _expected_hidden_shapes(config, size):
    size = -(-size // config.init_stride)
    if config.init_max_pool:
        size = -(-size // 2)
    shapes = [(size, size, config.stem_filters)]
    for width, stride in zip(config.widths, config.strides):
        size = -(-size // stride)
        shapes.append((size, size, width * (4 if config.block == "bottleneck" else 1)))
    return shapes


@pytest.mark.parametrize(
    "name", [n for n in HE_ET_AL if n not in DEEPEST and n != "resnext29_16x64d"] + FAMILY_FORWARD
)
def test_forward_pass_logits_and_hidden_states(name):
    model = built(name)
    # Small images keep the ImageNet presets quick; every stage still sees > 1 pixel.
    size = 64 if model.config.init_max_pool else 32
    images = np.random.default_rng(0).normal(size=(2, size, size, 3)).astype("float32")
    logits, hidden = model(images, training=False, return_hidden=True)
    assert logits.shape == (2, model.config.num_classes)
    assert np.all(np.isfinite(logits))
    assert len(hidden) == len(model.config.units) + 1
    assert [tuple(h.shape[1:]) for h in hidden] == _expected_hidden_shapes(model.config, size)
    # The logits are the dense layer applied to the pooled last hidden state.
    # (An untrained deep v1 net in inference mode has huge activations, so the
    # tolerance scales with them.)
    config = model.config
    pool = np.max if config.head_pool == "max" else np.mean
    pooled = pool(np.asarray(hidden[-1], np.float64), axis=(1, 2))
    kernel, *bias = (np.asarray(w, np.float64) for w in model.logits.weights)
    assert len(bias) == int(config.head_bias)
    expected = config.logit_scale * (pooled @ kernel + (bias[0] if bias else 0))
    scale = np.max(np.abs(logits))
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5 * scale)
    # Without return_hidden, the same logits alone.
    np.testing.assert_allclose(model(images, training=False), logits, rtol=1e-5, atol=1e-6 * scale)


# Names that count depth as He et al. do (stem, unit convs, logits): the first
# number. WRN-d counts its 3 projections too; ResNet-RS names its depth apart.
COUNTED_DEPTH = [
    n for n in ALL if any(c.isdigit() for c in n) and not n.startswith(("wrn", "resnetrs"))
]


@pytest.mark.parametrize("name", COUNTED_DEPTH)
def test_preset_depth_matches_its_name(name):
    digits = re.search(r"\d+", name).group()
    assert presets.get_config(name).depth == int(digits)


@pytest.mark.parametrize("name", [n for n in ALL if n.startswith("wrn")])
def test_wide_resnet_depth_counts_the_projections(name):
    """WRN-d-k: d = 6n + 4 (Zagoruyko & Komodakis), i.e. He's count plus 2."""
    depth, k = (int(part) for part in name.removeprefix("wrn").split("_"))
    config = presets.get_config(name)
    assert config.depth + 2 == depth
    assert config.widths == (16 * k, 32 * k, 64 * k)


def test_bottleneck_multiplies_the_seed_filters_by_four():
    model = built("preact_resnet164")
    # The seed's CIFAR filters [16, 16, 32, 64] become [16, 64, 128, 256].
    assert model.stem_conv.filters == 16
    for stage, (width, out) in enumerate([(16, 64), (32, 128), (64, 256)]):
        for unit in model.stages[stage]:
            assert [conv.filters for conv in unit.convs] == [width, width, out]
            assert [conv.kernel_size for conv in unit.convs] == [(1, 1), (3, 3), (1, 1)]


# Combinations no preset uses, so that every branch of the builder is counted.
CUSTOM = {
    "v2_basic_pad": dict(version="v2", units=(2, 2), widths=(8, 16), strides=(1, 2)),
    "v2_bottleneck_pad": dict(
        version="v2", block="bottleneck", units=(1, 2), widths=(4, 8), strides=(2, 2)
    ),
    "v1_bottleneck_pad_no_abr": dict(
        block="bottleneck", units=(2, 1), widths=(4, 8), strides=(1, 2)
    ),
    "v2_projection_no_abr": dict(
        version="v2",
        shortcut="projection",
        activate_before_residual=False,
        units=(1, 1, 1),
        widths=(4, 8, 16),
        strides=(1, 2, 2),
    ),
    "stem_7x7_maxpool": dict(
        stem_kernel=7,
        init_stride=2,
        init_max_pool=True,
        units=(1, 1),
        widths=(8, 8),
        strides=(1, 1),
    ),
}


@pytest.mark.parametrize("variant", sorted(CUSTOM))
def test_custom_variants_match_the_closed_form_and_run(variant):
    model = model_lib.create_model("tiny", **CUSTOM[variant])
    images = np.random.default_rng(7).normal(size=(2, 33, 33, 3)).astype("float32")
    logits, hidden = model(images, training=True, return_hidden=True)
    trainable, non_trainable = closed_form_params(model.config)
    assert count_params(model.trainable_variables) == trainable
    assert count_params(model.non_trainable_variables) == non_trainable
    assert logits.shape == (2, 10) and np.all(np.isfinite(logits))
    assert [tuple(h.shape[1:]) for h in hidden] == _expected_hidden_shapes(model.config, 33)


@pytest.mark.parametrize(
    "name,published",
    # torchvision's published GFLOPS (multiply-accumulates) at 224 px.
    [("resnext50_32x4d", 4.23e9), ("wide_resnet50_2", 11.40e9)],
)
def test_family_macs_match_torchvisions_figures(name, published):
    summary = summarize(name)
    assert summary["macs"] == pytest.approx(published, rel=0.01)
    assert summary["macs"] == closed_form_macs(presets.get_config(name), 224)


@pytest.mark.parametrize("stride_in_1x1,published", [(False, 4.09e9), (True, 3.86e9)])
def test_resnet50_macs_match_the_published_figures(stride_in_1x1, published):

    summary = summarize("resnet50", stride_in_1x1=stride_in_1x1)
    assert summary["macs"] == pytest.approx(published, rel=0.02)
    config = presets.get_config("resnet50", stride_in_1x1=stride_in_1x1)
    assert summary["macs"] == closed_form_macs(config, 224)


@pytest.mark.parametrize(
    "name",
    [
        "resnet20",
        "resnet110",
        "preact_resnet164",
        "resnet18_v2",
        "resnext50_32x4d",
        "resnet50d",
        "seresnet50",
        "ecaresnet50d",
        "resnetrs50",
        "wrn16_8",
    ],
)
def test_macs_match_the_closed_form(name):

    summary = summarize(name)
    config = presets.get_config(name)
    assert summary["macs"] == closed_form_macs(config, summary["image_size"])
    if name == "resnet20":
        assert summary["macs"] == pytest.approx(41e6, rel=0.02)


def test_bottleneck_stride_placement():
    default = model_lib.create_model("resnet50")
    original = model_lib.create_model("resnet50", stride_in_1x1=True)
    # stage2_unit0 is the first unit that downsamples.
    assert [c.strides for c in default.stages[1][0].convs] == [(1, 1), (2, 2), (1, 1)]
    assert [c.strides for c in original.stages[1][0].convs] == [(2, 2), (1, 1), (1, 1)]


@pytest.mark.parametrize("size, dtype", [(8, "float32"), (7, "float32"), (9, "bfloat16")])
def test_pad_shortcut_subsamples_and_zero_pads_like_numpy(size, dtype):
    """Exactly, forward and backward: a weighted sum's gradient lands on the kept pixels."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    x = tf.cast(rng.normal(size=(2, size, size, 16)), dtype)
    weights = rng.normal(size=(2, (size + 1) // 2, (size + 1) // 2, 32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = blocks.ZeroPadShortcut(stride=2, extra_channels=16)(x)
        total = tf.reduce_sum(tf.cast(out, "float32") * weights)
    kept = np.asarray(tf.cast(x, "float32"))[:, ::2, ::2, :]
    expected = np.zeros(weights.shape, "float32")
    expected[..., 8:24] = kept
    np.testing.assert_array_equal(np.asarray(tf.cast(out, "float32")), expected)
    gradient = np.zeros(x.shape, "float32")
    gradient[:, ::2, ::2, :] = weights[..., 8:24]
    found = np.asarray(tf.cast(tape.gradient(total, x), "float32"))
    np.testing.assert_array_equal(found, np.asarray(tf.cast(tf.cast(gradient, dtype), "float32")))


def _relu(x):
    return np.maximum(np.asarray(x), 0)


def test_v1_unit_is_post_activation():
    model = built("resnet20")
    images = np.random.default_rng(2).normal(size=(2, 32, 32, 3)).astype("float32")
    _, hidden = model(images, training=False, return_hidden=True)
    # stage2_unit0: 16 -> 32 channels, stride 2, option A shortcut; its input
    # is the output of stage 1.
    unit = model.stages[1][0]
    h = np.asarray(hidden[1])
    conv1, conv2 = unit.convs
    bn1, bn2 = unit.norms
    branch = bn2(conv2(_relu(bn1(conv1(h), training=False))), training=False)
    shortcut = np.zeros((2, 16, 16, 32), "float32")
    shortcut[..., 8:24] = np.asarray(h)[:, ::2, ::2, :]
    np.testing.assert_allclose(
        unit(h, training=False), _relu(np.asarray(branch) + shortcut), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("activate_before_residual", [True, False])
def test_v2_structure(activate_before_residual):
    model = model_lib.create_model(
        "tiny",
        version="v2",
        units=(1, 1),
        widths=(4, 8),
        strides=(1, 2),
        shortcut="projection",
        activate_before_residual=activate_before_residual,
    )
    rng = np.random.default_rng(3)
    images = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    model.build(images.shape)
    # Random BN statistics, so that a skipped or doubled BN shows in the numbers.
    for layer in layers_of_type(model, keras.layers.BatchNormalization):
        for weight in layer.weights:
            weight.assign(rng.uniform(0.5, 1.5, size=weight.shape).astype("float32"))
    _, hidden = model(images, training=False, return_hidden=True)
    first, second = model.stages[0][0], model.stages[1][0]
    names = {layer.name for layer in compat.nested_layers(model)}
    # No BN-ReLU before the network's very first unit: its input is the stem
    # output, already normalized and activated.
    assert "stage1_unit0_bn0" not in names and "stage2_unit0_bn0" in names
    conv1, conv2 = first.convs
    (bn1,) = first.norms
    h0 = np.asarray(hidden[0])
    expected = conv2(_relu(bn1(conv1(h0), training=False))) + h0
    np.testing.assert_allclose(first(h0, training=False), expected, rtol=1e-5, atol=1e-5)
    # A stage's first unit: its BN-ReLU feeds the shortcut too, if asked.
    h1 = np.asarray(first(h0, training=False))
    pre = _relu(second.preact_norm(h1, training=False))
    branch = second.convs[1](_relu(second.norms[0](second.convs[0](pre), training=False)))
    shortcut = second.projection(pre if activate_before_residual else h1)
    out = np.asarray(branch) + np.asarray(shortcut)
    np.testing.assert_allclose(second(h1, training=False), out, rtol=1e-5, atol=1e-5)
    # A final BN + ReLU runs before pooling, and its output is the last hidden state.
    assert model.final_bn is not None
    final = _relu(model.final_bn(out, training=False))
    np.testing.assert_allclose(hidden[-1], final, rtol=1e-5, atol=1e-5)


def test_v1_has_no_final_batch_norm():
    assert built("resnet50").final_bn is None
    assert built("resnet50_v2").final_bn is not None


def test_regularization_losses_are_half_l2_on_kernels_only():
    model = model_lib.create_model("resnet20", weight_decay=3e-4)
    model.build((None, 32, 32, 3))
    kernel_layers = layers_of_type(model, (keras.layers.Conv2D, keras.layers.Dense))
    assert len(kernel_layers) == 20  # 19 convs and the logits: ResNet-20.
    assert len(model.losses) == len(kernel_layers)
    rng = np.random.default_rng(4)
    for variable in model.weights:  # BN weights and biases too: they must not count.
        variable.assign(rng.normal(size=variable.shape).astype("float32"))
    expected = (
        3e-4 * sum(np.sum(np.asarray(layer.kernel, np.float64) ** 2) for layer in kernel_layers) / 2
    )
    assert float(sum(model.losses)) == pytest.approx(expected, rel=1e-5)


def test_training_mode_normalizes_with_batch_statistics_and_updates_moving_ones():
    model = model_lib.create_model("tiny")
    images = 3.0 + np.random.default_rng(8).normal(size=(4, 8, 8, 3)).astype("float32")
    model.build(images.shape)
    stem = model.stem_conv(images)
    before = np.asarray(model.stem_bn.moving_mean)
    model(images, training=True)
    # Keras momentum m: moving = m * moving + (1 - m) * batch mean.
    batch_mean = np.mean(np.asarray(stem), axis=(0, 1, 2))
    np.testing.assert_allclose(
        model.stem_bn.moving_mean, 0.9 * before + 0.1 * batch_mean, rtol=1e-4, atol=1e-5
    )


def test_batch_norm_defaults_are_the_documented_ones():
    config = presets.get_config("resnet50")
    assert (config.bn_momentum, config.bn_epsilon, config.bn_synchronized) == (0.9, 1e-5, False)
    norms = layers_of_type(built("resnet50"), keras.layers.BatchNormalization)
    assert len(norms) == 53  # Stem, 3 per unit (16 units), 4 projection shortcuts.
    for layer in norms:
        assert (layer.momentum, layer.epsilon, layer.synchronized) == (0.9, 1e-5, False)


def test_unit_output_shape_follows_its_input():
    model = built("resnet20")
    assert model.stages[1][0].compute_output_shape((None, 15, 15, 16)) == (None, 8, 8, 32)


def test_keras_save_and_load_round_trip(tmp_path):
    model = model_lib.create_model(
        "tiny", version="v2", units=(1, 1), widths=(4, 8), strides=(1, 2)
    )
    images = np.random.default_rng(9).normal(size=(2, 16, 16, 3)).astype("float32")
    logits = model(images, training=False)
    model.save(tmp_path / "tiny.keras")
    loaded = keras.models.load_model(tmp_path / "tiny.keras")
    assert loaded.config == model.config
    np.testing.assert_array_equal(loaded(images, training=False), logits)


def test_zero_weight_decay_adds_no_losses():
    model = model_lib.create_model("tiny", weight_decay=0.0)
    model.build((None, 8, 8, 3))
    assert model.losses == []


def test_batch_norm_settings_reach_every_layer():
    model = model_lib.create_model("tiny", bn_momentum=0.99, bn_epsilon=1e-3, bn_synchronized=True)
    norms = layers_of_type(model, keras.layers.BatchNormalization)
    assert norms
    for layer in norms:
        assert (layer.momentum, layer.epsilon, layer.synchronized) == (0.99, 1e-3, True)


def test_zero_init_residual_makes_each_unit_start_as_identity_plus_relu():
    model = model_lib.create_model("tiny", zero_init_residual=True)
    x = np.random.default_rng(5).normal(size=(2, 8, 8, 4)).astype("float32")
    unit = model.stages[0][0]
    np.testing.assert_allclose(unit(x, training=False), _relu(x), atol=1e-6)


def test_layer_and_variable_names_are_stable_and_unique():
    model = built("resnet20")
    names = [layer.name for layer in compat.nested_layers(model)]
    assert "stage2_unit0_conv1" in names and "stage3_unit2_bn2" in names
    assert len(names) == len(set(names))
    paths = [variable.path for variable in model.weights]
    assert len(paths) == len(set(paths))


def test_create_model_overrides_any_field():
    model = model_lib.create_model("resnet50", num_classes=10, version="v2")
    assert (model.config.num_classes, model.config.version) == (10, "v2")


@pytest.mark.parametrize(
    "name,overrides,message",
    [
        (
            "resnet51",
            {},
            "unknown model 'resnet51' (did you mean resnet56 or resnet50 or resnet18?)",
        ),
        ("resnet20", {"depth": 3}, "unknown model field(s) depth"),
        ("resnet20", {"block": "wide"}, "'block' must be one of: basic, bottleneck"),
        ("resnet20", {"units": (3, 3)}, "one entry per stage"),
        ("resnet20", {"num_classes": 0}, "'num_classes'"),
        ("resnet20", {"weight_decay": -1.0}, "'weight_decay'"),
        ("resnet20", {"widths": (64, 32, 16)}, "cannot shrink"),
        ("resnet50_v2", {"zero_init_residual": True}, "needs version v1"),
        ("resnet50", {"init_max_pool": "no"}, "'init_max_pool' must be true or false"),
        ("resnet20", {"units": 3}, "'units' needs a list with one entry per stage"),
        ("tiny", {"bn_momentum": 1.0}, "'bn_momentum' must be in [0, 1)"),
        # The family's fields.
        ("seresnet50", {"attention": "cbam"}, "'attention' must be one of: none, se, eca"),
        ("resnet50", {"stem": "tiered"}, "'stem' must be one of: plain, deep"),
        ("resnet18", {"groups": 32}, "shape a bottleneck's 3x3 conv; this model has basic"),
        (
            "resnet50d",
            {"stem_kernel": 7},
            "sets a plain stem's kernel, but resnet50d has stem=deep",
        ),
        ("resnet50", {"se_ratio": 0.25}, "but resnet50 has attention=none; drop it"),
        ("resnet50", {"stem_widths": (32, 32)}, "'stem_widths' belongs to stem=deep"),
        ("resnet50d", {"stem_widths": (32,)}, "needs the deep stem's first two widths"),
        ("resnet20", {"replace_stem_pool": True}, "this model has none (init_max_pool"),
        ("tiny", {"block": "bottleneck", "groups": 2, "base_width": 8}, "0.5 channels per group"),
        ("wrn28_10", {"dropout": 1.0}, "'dropout' must be in [0, 1)"),
        ("seresnet50", {"se_ratio": 0.0}, "'se_ratio' must be in (0, 1]"),
    ],
)
def test_bad_configs_are_rejected_with_the_key_named(name, overrides, message):
    with pytest.raises(ConfigError) as error:
        model_lib.create_model(name, **overrides)
    assert message in str(error.value)


def test_logits_stay_float32_under_a_mixed_precision_policy():
    images = np.random.default_rng(6).normal(size=(2, 16, 16, 3)).astype("float32")
    reference = model_lib.create_model("tiny")
    reference_logits = np.asarray(reference(images, training=False))
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = model_lib.create_model("tiny")
        model.build(images.shape)
        model.set_weights(reference.get_weights())
        logits = model(images, training=False)
        assert model.stem_conv.compute_dtype == "bfloat16"
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert logits.dtype == "float32"
    # bf16 keeps 8 bits of mantissa: the same network to about 1%.
    np.testing.assert_allclose(logits, reference_logits, rtol=0.02, atol=0.02)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(units=(2, 1), widths=(4, 8), strides=(1, 2)),  # v1, pad shortcut
        dict(
            units=(1, 2),
            widths=(4, 8),
            strides=(1, 2),
            block="bottleneck",
            version="v2",
            shortcut="projection",
        ),
        dict(units=(1, 1), widths=(4, 8), strides=(1, 2), shortcut="projection"),  # v1 + BN
    ],
)
def test_checkpoint_holds_every_variable(tmp_path, overrides):
    """TF checkpoints follow attributes, not lists: every variable must be reachable."""
    model = model_lib.create_model("tiny", **overrides)
    model.build((None, 8, 8, 3))
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/")]
    assert len(saved) == len(model.variables)
    fresh = model_lib.create_model("tiny", **overrides)
    fresh.build((None, 8, 8, 3))
    tf.train.Checkpoint(model=fresh).restore(path).assert_consumed()
    for expected, restored in zip(model.variables, fresh.variables):
        np.testing.assert_array_equal(restored.numpy(), expected.numpy())
