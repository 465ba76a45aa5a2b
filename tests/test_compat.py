"""Each private Keras/TensorFlow API in resnet_app/common/compat.py still does its job here.

An upgrade that moves one fails here, by name, before it shows up as a wrong
number somewhere else. References: the tiny network's layer names as the
architecture defines them, NumPy for clipping and weight decay, and a traced
graph with a known nested function.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import compat
from resnet_app.common.distribute import mirrored_strategy
from resnet_app.engine import averaging
from resnet_app.nets import resnet as model_lib


def test_nested_layers_finds_every_layer_once_without_the_model():
    model = model_lib.create_model("tiny", units=(1, 1), widths=(4, 8), strides=(1, 2))
    model.build((None, 8, 8, 3))
    names = [layer.name for layer in compat.nested_layers(model)]
    unit = ["conv1", "conv2", "bn1", "bn2"]
    expected = {"stem_conv", "stem_bn", "stage1_unit0", "stage2_unit0", "pool", "logits"}
    expected |= {f"stage1_unit0_{name}" for name in unit}
    expected |= {f"stage2_unit0_{name}" for name in [*unit, "shortcut_pad"]}
    assert sorted(names) == sorted(expected)  # Each once; the model itself not among them.


@pytest.mark.parametrize(
    "option,reference",
    [
        ({}, lambda grads: grads),
        (
            {"clipnorm": 1.0},
            lambda grads: [g * min(1.0, 1.0 / np.linalg.norm(g)) for g in grads],
        ),
        (
            {"global_clipnorm": 1.0},
            lambda grads: [
                g * min(1.0, 1.0 / np.sqrt(sum(np.sum(h**2) for h in grads))) for g in grads
            ],
        ),
        ({"clipvalue": 0.5}, lambda grads: [np.clip(g, -0.5, 0.5) for g in grads]),
    ],
)
def test_clip_gradients_clips_as_the_optimizer_option_says(option, reference):
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(3, 4)), 0.01 * rng.normal(size=(5,)), rng.normal(size=(2, 2))]
    grads = [g.astype("float32") for g in grads]
    optimizer = keras.optimizers.SGD(learning_rate=0.1, **option)
    clipped = compat.clip_gradients(optimizer, [tf.constant(g) for g in grads])
    assert len(clipped) == len(grads)
    for got, expected in zip(clipped, reference(grads)):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-7)
    if option:  # The options do clip these gradients: the comparison means something.
        assert not all(np.allclose(g, e) for g, e in zip(grads, reference(grads)))


def test_apply_weight_decay_locally_decays_as_numpy_and_skips_excluded_variables():
    rng = np.random.default_rng(1)
    values = [rng.normal(size=(3, 3)).astype("float32"), rng.normal(size=(3,)).astype("float32")]
    kernel = keras.Variable(values[0], name="kernel")
    bias = keras.Variable(values[1], name="bias")
    optimizer = keras.optimizers.SGD(learning_rate=0.5, weight_decay=0.1)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build([kernel, bias])

    @tf.function  # As in a compiled step.
    def decay():
        compat.apply_weight_decay_locally(optimizer, [kernel, bias])

    decay()
    np.testing.assert_allclose(kernel.numpy(), values[0] * (1 - 0.5 * 0.1), rtol=1e-6)
    np.testing.assert_array_equal(bias.numpy(), values[1])
    # Without weight_decay, nothing moves.
    plain = keras.optimizers.SGD(learning_rate=0.5)
    plain.build([kernel])
    before = kernel.numpy()
    compat.apply_weight_decay_locally(plain, [kernel])
    np.testing.assert_array_equal(kernel.numpy(), before)


def test_apply_weight_decay_locally_decays_each_replica_copy_from_its_own_value():
    """What model averaging needs: in replica context, each copy decays on its own."""
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    with strategy.scope(), averaging.local_variables():
        kernel = keras.Variable(np.zeros((2, 2), "float32"), name="kernel")
        optimizer = keras.optimizers.SGD(learning_rate=0.5, weight_decay=0.1)
        optimizer.build([kernel])
    copies = kernel.value.values
    for index, copy in enumerate(copies):
        copy.assign(np.full((2, 2), index + 1.0, "float32"))

    @tf.function
    def decay():
        strategy.run(lambda: compat.apply_weight_decay_locally(optimizer, [kernel]))

    decay()
    for index, copy in enumerate(copies):
        np.testing.assert_allclose(copy.numpy(), (index + 1.0) * (1 - 0.5 * 0.1), rtol=1e-6)


def test_advance_collective_key_base_moves_the_base_the_next_strategy_reads():
    before = tf.distribute.MirroredStrategy._collective_key_base
    base = compat.advance_collective_key_base(7)
    assert base == before + 7 == tf.distribute.MirroredStrategy._collective_key_base
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.extended._collective_key_base == base
    # And that strategy still reduces across its replicas.
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(float(context.replica_id_in_sync_group + 1))
    )
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)
    assert float(total) == 3.0


def test_graph_function_returns_the_traced_function_a_call_op_runs():
    @tf.function
    def inner(x):
        return tf.math.cumsum(x)

    @tf.function
    def outer(x):
        return inner(x) + 1.0

    graph = outer.get_concrete_function(tf.TensorSpec([4], tf.float32)).graph
    called = [
        op.get_attr("f").name
        for op in graph.get_operations()
        if op.type.endswith("PartitionedCall")
    ]
    assert len(called) == 1
    function = compat.graph_function(graph, called[0])
    assert "Cumsum" in [op.type for op in function.graph.get_operations()]
    assert compat.graph_function(graph, "no_such_function") is None


def test_in_xla_context_is_true_only_while_an_xla_function_is_traced():
    seen = []

    def probe(x):
        seen.append(compat.in_xla_context())
        return x + 1

    tf.function(probe, jit_compile=True)(tf.constant(1.0))
    tf.function(probe)(tf.constant(1.0))
    probe(tf.constant(1.0))  # Eagerly.
    assert seen == [True, False, False]
