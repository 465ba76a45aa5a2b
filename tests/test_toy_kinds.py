"""A new stem, block or attention kind is one registration line (`nets/kinds.py`).

A block or attention kind also has its Keras class; a stem is its
convolutions' kernels and widths. The toy kinds here are registered from
inside the tests, with monkeypatch so that no other test sees them, and with
no other edit: the config accepts,
refuses and lists them, the network builds and runs them, and the depth,
widths and parameter count agree with closed forms written here. Every
registered kind's facts are also checked against the layers it builds.
"""

import dataclasses
import os

import keras
import numpy as np
import pytest

from resnet_app.common.errors import ConfigError
from resnet_app.nets import blocks, kinds, presets
from resnet_app.nets import resnet as model_lib
from resnet_app.nets.attention import SqueezeExcite
from resnet_app.nets.summary import count_params
from tests import reference
from tests.commands import REPO, blocked_packages, error_line, run_command


class ChannelGate(keras.layers.Layer):
    """Toy attention: x * sigmoid(a_c * mean_hw(x_c) + b_c), 2 weights per channel."""

    def __init__(self, make, channels, **kwargs):
        super().__init__(**kwargs)
        del make
        self.channels = channels

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(self.channels,), initializer="ones", name="scale")
        self.shift = self.add_weight(shape=(self.channels,), initializer="zeros", name="shift")

    def call(self, inputs):
        mean = keras.ops.mean(inputs, axis=(1, 2))
        return inputs * keras.ops.sigmoid(mean * self.scale + self.shift)[:, None, None, :]

    def compute_output_shape(self, input_shape):
        return input_shape


class TripleBlock(blocks.ResidualBlock):
    """Toy block: three 3x3 convs, the first strided, the last to 2x the stage width."""

    @classmethod
    def conv_specs(cls, config, in_channels, width, stride):
        del in_channels
        return [
            blocks.ConvSpec(width, 3, stride),
            blocks.ConvSpec(width, 3, 1),
            blocks.ConvSpec(width * config.expansion, 3, 1),
        ]


TRIPLE = kinds.BlockKind("triple", TripleBlock, "three 3x3 convs", expansion=2, convs=3)
# Works with basic and triple units only, to have a combination to refuse.
GATE = kinds.AttentionKind("gate", ChannelGate, "a per-channel gate", blocks=("basic", "triple"))


@pytest.fixture
def toy_kinds(monkeypatch):
    """The toy kinds registered: one line each, undone after the test."""
    monkeypatch.setitem(kinds.BLOCKS, TRIPLE.name, TRIPLE)
    monkeypatch.setitem(kinds.ATTENTIONS, GATE.name, GATE)


def _triple_convs(config, channels, width):
    """The toy block's closed form: (kernel, in, out, groups) of its convs."""
    return [(3, channels, width, 1), (3, width, width, 1), (3, width, 2 * width, 1)]


def test_registering_is_undone_and_a_name_is_taken_once(monkeypatch):
    with monkeypatch.context() as patch:
        patch.setitem(kinds.BLOCKS, TRIPLE.name, TRIPLE)
        assert presets.get_config("resnet20", block="triple").block == "triple"
    assert "triple" not in kinds.BLOCKS
    with pytest.raises(ConfigError, match="'block' must be one of"):
        presets.get_config("resnet20", block="triple")
    with pytest.raises(ValueError, match="registered twice"):
        kinds.register(kinds.AttentionKind("se", SqueezeExcite))


def test_the_toy_names_are_choices_and_help(toy_kinds):
    for field, value, names in (
        ("block", "quad", "basic, bottleneck, conv_pool, triple"),
        ("attention", "cbam", "none, se, eca, gate"),
    ):
        with pytest.raises(ConfigError) as error:
            presets.get_config("resnet20", **{field: value})
        assert f"model field '{field}' must be one of: {names}, got '{value}'" == str(error.value)
    assert kinds.choices_help(kinds.BLOCKS).endswith('"triple" (three 3x3 convs)')
    assert kinds.choices_help(kinds.ATTENTIONS).endswith('or "gate" (a per-channel gate)')


@pytest.mark.parametrize(
    "name,overrides,message",
    [
        (
            "resnet50",
            {"attention": "gate"},
            "model field 'attention' gate works with block basic, triple; this model has "
            "block=bottleneck: use one of those, or another attention (none, se, eca)",
        ),
        (
            "resnet9",
            {"block": "conv_pool", "attention": "gate"},
            "model field 'attention' does not apply to block=conv_pool",
        ),
        (
            "resnet20",
            {"block": "triple", "groups": 2},
            "shape a bottleneck's 3x3 conv; this model has triple blocks",
        ),
        (
            "resnet20",
            {"attention": "gate", "se_ratio": 0.25},
            "but resnet20 has attention=gate; drop it, or also set model.attention=se",
        ),
    ],
)
def test_a_bad_combination_is_one_line_naming_the_choices(toy_kinds, name, overrides, message):
    with pytest.raises(ConfigError) as error:
        presets.get_config(name, **overrides)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_an_attention_field_is_accepted_by_every_kind_that_reads_it(monkeypatch):
    twin = kinds.AttentionKind("se_twin", SqueezeExcite, fields={"se_ratio": "its reduction"})
    monkeypatch.setitem(kinds.ATTENTIONS, twin.name, twin)
    assert presets.get_config("resnet20", attention="se_twin", se_ratio=0.25).se_ratio == 0.25
    with pytest.raises(ConfigError, match="also set model.attention=se or se_twin$"):
        presets.get_config("resnet20", se_ratio=0.25)


def test_the_spec_reads_the_toy_blocks_facts(toy_kinds):
    config = presets.get_config("resnet20", block="triple", attention="gate")
    assert config.depth == 1 + 3 * 9 + 1  # Stem, three convs in each of 9 units, logits.
    assert config.expansion == 2
    assert config.stage_channels() == (32, 64, 128)
    assert config.inner_width(32) == 32


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_toy_kinds_build_run_and_match_the_closed_form(toy_kinds, monkeypatch, version):
    monkeypatch.setitem(reference.UNIT_CONVS, "triple", _triple_convs)
    monkeypatch.setitem(reference.ATTENTION_PARAMS, "gate", lambda config, c: 2 * c)
    model = model_lib.create_model(
        "tiny",
        block="triple",
        attention="gate",
        version=version,
        shortcut="projection",
        units=(1, 2),
        widths=(4, 8),
        strides=(1, 2),
    )
    images = np.random.default_rng(3).normal(size=(2, 12, 12, 3)).astype("float32")
    logits, hidden = model(images, training=False, return_hidden=True)
    assert logits.shape == (2, 10) and np.all(np.isfinite(logits))
    assert [tuple(h.shape[1:]) for h in hidden] == [(12, 12, 4), (12, 12, 8), (6, 6, 16)]
    assert all(type(unit) is TripleBlock for stage in model.stages for unit in stage)
    trainable, non_trainable = reference.closed_form_params(model.config)
    assert count_params(model.trainable_variables) == trainable
    assert count_params(model.non_trainable_variables) == non_trainable
    convs = sum(len(unit.convs) for stage in model.stages for unit in stage)
    assert 1 + convs + 1 == model.config.depth == 1 + 3 * 3 + 1


def test_the_toy_attention_gates_each_channel_by_its_mean(toy_kinds):
    model = model_lib.create_model("tiny", attention="gate")
    model.build((None, 8, 8, 3))
    unit = model.stages[0][0]
    assert isinstance(unit.attention, ChannelGate) and unit.attention.name == f"{unit.name}_se"
    rng = np.random.default_rng(5)
    scale, shift = rng.normal(size=(2, 4)).astype("float32")
    unit.attention.scale.assign(scale)
    unit.attention.shift.assign(shift)
    x = rng.normal(size=(2, 8, 8, 4)).astype("float32")
    expected = x / (1 + np.exp(-(x.mean(axis=(1, 2)) * scale + shift)))[:, None, None, :]
    np.testing.assert_allclose(unit.attention(x), expected, rtol=1e-5, atol=1e-6)


# Every registered kind's facts against the layers it builds: a new kind is checked too.


def _tiny(**overrides):
    model = model_lib.create_model(
        "tiny", units=(2, 1), widths=(8, 16), strides=(1, 2), shortcut="projection", **overrides
    )
    logits = model(np.zeros((1, 16, 16, 3), "float32"), training=False)
    assert logits.shape == (1, 10)
    return model


@pytest.mark.parametrize("name", sorted(kinds.BLOCKS))
def test_each_block_kinds_facts_match_its_layers(name):
    kind = kinds.BLOCKS[name]
    assert issubclass(kinds.layer_class(kind), keras.layers.Layer)
    fields = {field.name for field in dataclasses.fields(presets.ResNetConfig)}
    assert set(kind.fixed) <= fields
    model = _tiny(block=name)
    convs = [len(unit.convs) for stage in model.stages for unit in stage]
    assert 1 + sum(convs) + 1 == model.config.depth
    for stage, width in zip(model.stages, model.config.widths):
        assert [unit.out_channels for unit in stage] == [width * kind.expansion] * len(stage)


ATTENTION_PAIRS = [
    (attention, block)
    for attention, kind in kinds.ATTENTIONS.items()
    for block in kinds.BLOCKS
    if kind.layer is not None
    and "attention" not in kinds.BLOCKS[block].fixed
    and (kind.blocks is None or block in kind.blocks)
]


@pytest.mark.parametrize("attention,block", ATTENTION_PAIRS)
def test_each_attention_kind_builds_on_each_block_it_takes(attention, block):
    kind = kinds.ATTENTIONS[attention]
    assert set(kind.fields) <= {field.name for field in dataclasses.fields(presets.ResNetConfig)}
    model = _tiny(block=block, attention=attention)
    for unit in (unit for stage in model.stages for unit in stage):
        assert isinstance(unit.attention, kinds.layer_class(kind))
        assert unit.attention.name == f"{unit.name}_se"  # Checkpoints key on it.


def test_the_kinds_are_checked_before_tensorflow_loads(tmp_path):
    blocked = blocked_packages(tmp_path / "blocked", "tensorflow")
    env = {"PYTHONPATH": f"{blocked}{os.pathsep}{REPO}"}
    result = run_command("resnet_app.train", "--set", "model.attention=cbam", env=env)
    line = error_line(result)
    assert "model field 'attention' must be one of: none, se, eca, got 'cbam'" in line


# --- A new stem: one registration line --------------------------------------------------

# Toy stem: a 5x5 conv to twice the stem's width, then a 1x1 down to it.
WIDE = kinds.StemKind(
    "wide_then_narrow",
    "a 5x5 conv to twice `stem_filters`, then a 1x1 to it",
    lambda config: ((5, 2 * config.stem_filters), (1, config.stem_filters)),
)


@pytest.fixture
def toy_stem(monkeypatch):
    monkeypatch.setitem(kinds.STEMS, WIDE.name, WIDE)
    monkeypatch.setitem(
        reference.STEM_CONVS,
        WIDE.name,
        lambda c: [
            (5, 3, 2 * c.stem_filters, c.init_stride),
            (1, 2 * c.stem_filters, c.stem_filters, 1),
        ],
    )


def test_a_toy_stem_is_checked_listed_and_refuses_the_others_fields(toy_stem):
    with pytest.raises(ConfigError) as error:
        presets.get_config("resnet20", stem="patchify")
    assert "must be one of: plain, deep, wide_then_narrow, got 'patchify'" in str(error.value)
    assert kinds.choices_help(kinds.STEMS).endswith(
        '"wide_then_narrow" (a 5x5 conv to twice `stem_filters`, then a 1x1 to it)'
    )
    with pytest.raises(
        ConfigError,
        match="but resnet20 has stem=wide_then_narrow; drop it, or also set model.stem=plain",
    ):
        presets.get_config("resnet20", stem="wide_then_narrow", stem_kernel=7)
    with pytest.raises(
        ConfigError, match="belongs to stem=deep; this model's stem is wide_then_narrow"
    ):
        presets.get_config("resnet20", stem="wide_then_narrow", stem_widths=(8, 8))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_toy_stem_builds_runs_and_matches_the_closed_form(toy_stem, version):
    from resnet_app.nets import stem

    model = model_lib.create_model("tiny", stem="wide_then_narrow", version=version, stem_filters=3)
    images = np.random.default_rng(4).normal(size=(2, 12, 12, 3)).astype("float32")
    logits = model(images, training=False)
    assert logits.shape == (2, 10) and np.all(np.isfinite(logits))
    kernels = [tuple(conv.kernel.shape) for conv, _ in model.stem_pairs]
    assert kernels == [(5, 5, 3, 6), (1, 1, 6, 3)]
    assert model.config.stem_channels() == (6, 3)
    trainable, non_trainable = reference.closed_form_params(model.config)
    assert count_params(model.trainable_variables) == trainable
    assert count_params(model.non_trainable_variables) == non_trainable
    with pytest.raises(ConfigError, match="hold no stem=wide_then_narrow"):
        stem.source_names(model.config, stem.TORCH)
