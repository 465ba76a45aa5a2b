"""The block classes: old checkpoints restore into them, and each computes its paper's formula.

References: checkpoints written by the code before the block classes
(tests/fixtures/blocks_v0, one per block kind, random values in every
variable; tests/fixtures/run_v0_tiny, a run whose optimizer slots are stored
by variable position), read back with TensorFlow's checkpoint reader; and
each block's forward pass written out with `tf.nn.conv2d` and NumPy BatchNorm.
"""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from resnet_app.nets import blocks, presets
from resnet_app.nets import resnet as model_lib

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
KINDS = json.loads((FIXTURES / "blocks_v0" / "kinds.json").read_text())
# The attribute that holds each unit layer, by the suffix of its layer name.
UNIT_ATTRIBUTES = {
    "bn0": "preact_norm",
    "shortcut_conv": "projection",
    "shortcut_bn": "projection_norm",
}


def checkpoint_key(variable) -> str:
    """The key TF checkpoints give `variable` of a ResNet held as `Checkpoint(model=...)`.

    Written from the layer names, so a layer stored under another attribute
    than its name says (conv1 under conv2, bn0 under bn1) shows as a mismatch.
    """
    _, *layers, name = variable.path.split("/")  # e.g. tiny/stage1_unit0/stage1_unit0_conv1/kernel
    if len(layers) == 2:  # A unit's layer: stage1_unit0_conv1 is attribute conv1 of stage1_unit0.
        unit, layer = layers
        suffix = layer.removeprefix(unit + "_")
        layers = [unit, UNIT_ATTRIBUTES.get(suffix, suffix)]
    if name == "kernel":  # Keras 3 Conv2D and Dense hold their kernel as `_kernel`.
        name = "_kernel"
    return "/".join(["model", *layers, name, ".ATTRIBUTES/VARIABLE_VALUE"])


def build(kind: dict) -> model_lib.ResNet:
    model = model_lib.create_model("tiny", **kind)
    model.build((None, 32, 32, 3))
    return model


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_checkpoint_of_the_old_code_restores_every_variable(kind):
    path = str(FIXTURES / "blocks_v0" / kind / "ckpt")
    model = build(KINDS[kind])
    initial = [variable.numpy() for variable in model.variables]
    status = tf.train.Checkpoint(model=model).read(path)
    status.assert_existing_objects_matched()
    status.assert_consumed()  # Every value saved was used.
    reader = tf.train.load_checkpoint(path)
    saved = {key for key, _ in tf.train.list_variables(path)} - {"_CHECKPOINTABLE_OBJECT_GRAPH"}
    keys = [checkpoint_key(variable) for variable in model.variables]
    assert sorted(keys) == sorted(saved)
    for variable, key, before in zip(model.variables, keys, initial):
        expected = reader.get_tensor(key)
        np.testing.assert_array_equal(variable.numpy(), expected, err_msg=key)
        # The fixture holds random values: the restore changed every variable.
        assert not np.array_equal(expected, before), key


def _object_paths(graph, node_id: int, prefix: tuple[str, ...]) -> dict[int, str]:
    """Node id -> attribute path, for every object under `node_id` of a checkpoint's graph."""
    paths = {node_id: "/".join(prefix)}
    for child in graph.nodes[node_id].children:
        if child.node_id not in paths:
            paths.update(_object_paths(graph, child.node_id, (*prefix, child.local_name)))
    return paths


def test_variables_keep_the_order_that_old_optimizer_slots_were_saved_in():
    """Optimizer slots are saved by the position of their variable: the order is part of the format.

    The run fixture's checkpoint records, as one object graph, which model
    variable sat at each position of the optimizer's list.
    """
    reader = tf.train.load_checkpoint(str(FIXTURES / "run_v0_tiny" / "ckpt-6"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    root = {child.local_name: child.node_id for child in graph.nodes[0].children}
    model_paths = _object_paths(graph, root["model"], ("model",))
    optimizer = {
        child.local_name: child.node_id for child in graph.nodes[root["optimizer"]].children
    }
    listed = graph.nodes[optimizer["_trainable_variables"]].children
    saved_order = [
        model_paths[child.node_id] for child in sorted(listed, key=lambda c: int(c.local_name))
    ]

    model = build({})  # The run's model: the tiny preset as it is.
    order = [
        checkpoint_key(v).removesuffix("/.ATTRIBUTES/VARIABLE_VALUE")
        for v in model.trainable_variables
    ]
    assert order == saved_order
    assert len(order) == 11  # Stem conv + BN, 2 convs + 2 BNs, logits kernel + bias.


def _unit_layer_order(config: presets.ResNetConfig, first_in_network: bool, projects: bool):
    """The order in which a unit's layers hold variables: convs, then BNs, then the shortcut."""
    convs = 2 if config.block == "basic" else 3
    names = [f"conv{i}" for i in range(1, convs + 1)]
    if config.version == "v1":
        names += [f"bn{i}" for i in range(1, convs + 1)]
        return names + (["shortcut_conv", "shortcut_bn"] if projects else [])
    names = ([] if first_in_network else ["bn0"]) + names + [f"bn{i}" for i in range(1, convs)]
    return names + (["shortcut_conv"] if projects else [])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_keeps_the_variable_order_of_the_old_code(kind):
    model = build(KINDS[kind])
    config = model.config
    expected = ["stem_conv", "stem_bn"]
    channels = config.stem_filters
    for stage, (units, width, stride) in enumerate(
        zip(config.units, config.widths, config.strides), 1
    ):
        for unit in range(units):
            out = width * (4 if config.block == "bottleneck" else 1)
            projects = config.shortcut == "projection" and (
                unit == 0 and stride != 1 or channels != out
            )
            first = stage == 1 and unit == 0
            expected += [
                f"stage{stage}_unit{unit}_{name}"
                for name in _unit_layer_order(config, first, projects)
            ]
            channels = out
    expected += ["final_bn"] if config.version == "v2" else []
    expected += ["logits"]
    layers = []
    for variable in model.variables:
        layer = variable.path.split("/")[-2]
        if not layers or layers[-1] != layer:
            layers.append(layer)
    assert layers == expected


@pytest.mark.parametrize(
    "block,version,cls",
    [
        ("basic", "v1", blocks.BasicBlock),
        ("bottleneck", "v1", blocks.BottleneckBlock),
        ("basic", "v2", blocks.BasicBlock),
        ("bottleneck", "v2", blocks.BottleneckBlock),
    ],
)
def test_the_config_picks_the_block_class_and_its_expansion(block, version, cls):
    config = presets.ResNetConfig(block=block, version=version, shortcut="projection")
    assert blocks.block_class(config) is cls
    assert config.expansion == (4 if block == "bottleneck" else 1)
    model = model_lib.create_model("tiny", block=block, version=version, shortcut="projection")
    assert all(type(unit) is cls for stage in model.stages for unit in stage)
    assert all(unit.preact == (version == "v2") for stage in model.stages for unit in stage)
    assert [unit.out_channels for stage in model.stages for unit in stage] == [
        width * config.expansion for width in model.config.widths
    ]


# A reference forward pass of each block, written from the papers with tf.nn.conv2d and NumPy.


def _conv(x, layer):
    stride = layer.strides[0]
    return tf.nn.conv2d(x, layer.kernel, strides=stride, padding="SAME").numpy()


def _bn(x, layer):
    """Inference-mode BatchNorm, in float64."""
    mean, variance, gamma, beta = (
        np.asarray(w, np.float64)
        for w in (layer.moving_mean, layer.moving_variance, layer.gamma, layer.beta)
    )
    return (np.asarray(x, np.float64) - mean) / np.sqrt(variance + layer.epsilon) * gamma + beta


def _relu(x):
    return np.maximum(x, 0)


def _shortcut(x, unit, in_channels):
    if unit.projection is not None:
        out = _conv(x, unit.projection)
        return _bn(out, unit.projection_norm) if unit.projection_norm is not None else out
    stride, extra = unit.stride, unit.out_channels - in_channels
    out = np.asarray(x)[:, ::stride, ::stride, :]
    return np.pad(out, [(0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)])


def _reference(unit, version, x, in_channels, shortcut_preactivated):
    f32 = np.float32
    if version == "v1":
        out = x
        for index, (conv, norm) in enumerate(zip(unit.convs, unit.norms)):
            out = _bn(_conv(out.astype(f32), conv), norm)
            out = _relu(out) if index < len(unit.convs) - 1 else out
        return _relu(out + _shortcut(x, unit, in_channels))
    activated = _relu(_bn(x, unit.preact_norm)).astype(f32)
    out = _conv(activated, unit.convs[0])
    for conv, norm in zip(unit.convs[1:], unit.norms):
        out = _conv(_relu(_bn(out, norm)).astype(f32), conv)
    shortcut_input = activated if shortcut_preactivated else x
    return out + _shortcut(shortcut_input, unit, in_channels)


@pytest.mark.parametrize(
    "block,stride_in_1x1", [("basic", False), ("bottleneck", False), ("bottleneck", True)]
)
@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("shortcut", ["pad", "projection"])
def test_each_block_computes_its_formula(block, version, shortcut, stride_in_1x1):
    model = model_lib.create_model(
        "tiny",
        block=block,
        version=version,
        shortcut=shortcut,
        stride_in_1x1=stride_in_1x1,
        units=(1, 2),
        widths=(4, 8),
        strides=(1, 2),
    )
    model.build((None, 12, 12, 3))
    rng = np.random.default_rng(11)
    for variable in model.variables:  # Random statistics too, so a skipped BN shows.
        scale = 0.3 if "kernel" in variable.path else 1.0
        values = (
            rng.normal(0, scale, variable.shape)
            if scale < 1
            else rng.uniform(0.5, 1.5, variable.shape)
        )
        variable.assign(values.astype("float32"))
    in_channels = model.stages[0][0].out_channels
    x = rng.normal(size=(2, 12, 12, in_channels)).astype("float32")
    # stage2_unit0 downsamples and widens; stage2_unit1 keeps the shape.
    for unit, first_in_stage, channels in [
        (model.stages[1][0], True, in_channels),
        (model.stages[1][1], False, model.stages[1][0].out_channels),
    ]:
        inputs = x if first_in_stage else np.asarray(model.stages[1][0](x, training=False))
        expected = _reference(unit, version, inputs, channels, first_in_stage)
        np.testing.assert_allclose(unit(inputs, training=False), expected, rtol=1e-4, atol=1e-4)
    strided = [conv.strides for conv in model.stages[1][0].convs]
    if block == "bottleneck":
        assert strided[:2] == ([(2, 2), (1, 1)] if stride_in_1x1 else [(1, 1), (2, 2)])
