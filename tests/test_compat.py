"""Each private Keras/TensorFlow API in resnet_app/common/compat.py still does its job here.

An upgrade that moves one fails here, by name, before it shows up as a wrong
number somewhere else. References: the tiny network's layer names as the
architecture defines them, NumPy for clipping and weight decay, and a traced
graph with a known nested function, AutoGraph's own conversion of the same
code outside resnet_app.
"""

import importlib.util
import json
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import compat
from resnet_app.common.distribute import mirrored_strategy
from resnet_app.engine import local_sgd
from resnet_app.nets import resnet as model_lib
from tests.commands import run_code


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
    with strategy.scope(), local_sgd.local_variables():
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


# Python control flow on a tensor: AutoGraph turns it into a `tf.cond`; as written,
# it cannot be traced.
ABSOLUTE = """
def absolute(x):
    if x > 0:
        return x
    return -x
"""


def _module(name, directory, monkeypatch):
    """ABSOLUTE and a marked copy in a file of `directory`, imported as module `name`.

    A file, because AutoGraph reads the source of what it converts.
    """
    path = directory / f"{name.replace('.', '_')}.py"
    path.write_text(
        "import tensorflow as tf\nfrom resnet_app.common import compat\n"
        + ABSOLUTE
        + "\n\nmarked = compat.converted_by_autograph(absolute)\n"
    )
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_trace_as_written_leaves_nested_resnet_app_code_as_written_unless_marked(
    tmp_path, monkeypatch
):
    compat.trace_as_written()
    compat.trace_as_written()  # Once is enough; again adds nothing.
    from tensorflow.python.autograph.core import config as autograph_config

    assert sum("resnet_app" in str(r) for r in autograph_config.CONVERSION_RULES) == 1
    elsewhere = _module("autograph_probe", tmp_path, monkeypatch)
    ours = _module("resnet_app.autograph_probe", tmp_path, monkeypatch)

    def twice(function):  # The probe called from inside another traced function.
        return tf.function(lambda x: 2.0 * function(x))(tf.constant(-2.0))

    assert float(twice(elsewhere.absolute)) == 4.0  # Converted.
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        twice(ours.absolute)  # As written.
    assert float(twice(ours.marked)) == 4.0  # Marked: converted wherever it is called from.
    assert float(tf.function(ours.absolute)(tf.constant(-3.0))) == 3.0  # tf.function's own.


# A run with the augmentations, mixing, EMA and an evaluation, in a process that
# records every resnet_app function AutoGraph converts, with the decorators in
# its source; a user's function with Python control flow on a tensor (in its
# own file) is the control that conversion still happens outside resnet_app.
CONVERTED = """
import inspect, json, runpy, sys
import tensorflow as tf
from tensorflow.python.autograph.impl import api

converted = {}
convert = api._convert_actual

def recording(entity, program_ctx):
    if entity.__module__.startswith("resnet_app"):
        lines = inspect.getsourcelines(entity)[0]
        decorators = [line.strip() for line in lines if line.strip().startswith("@")]
        converted[entity.__qualname__] = decorators
    return convert(entity, program_ctx)

api._convert_actual = recording
sys.path.insert(0, sys.argv.pop(1))
import users_code

absolute = float(tf.function(users_code.absolute)(tf.constant(-2.0)))
sys.argv = ["train", *sys.argv[1:]]
try:
    runpy.run_module("resnet_app.train", run_name="__main__")
except SystemExit as stop:
    assert not stop.code, stop.code
print(json.dumps({"absolute": absolute, "converted": converted}))
"""
# The only ways a resnet_app function is converted: `tf.function` wraps it, or it is marked.
ENTRIES = ("@tf.function", "@compat.converted_by_autograph")


def test_a_run_converts_only_the_functions_tf_function_wraps_and_the_marked_ones(tmp_path):
    (tmp_path / "users_code.py").write_text("import tensorflow as tf\n" + ABSOLUTE)
    result = run_code(
        CONVERTED,
        str(tmp_path),
        "--dataset=shapes",
        "--model=tiny",
        "--batch_size=8",
        "--train_steps=4",
        "--eval_every=4",
        "--set=data.train_examples=32",
        "--set=data.eval_examples=12",
        "--set=data.augment.randaugment_ops=2",
        "--set=data.mix.mixup_alpha=0.2",
        "--set=data.augment.erase_probability=0.5",
        "--set=data.augment.cutout_size=4",
        "--set=train.ema_decay=0.9",
        f"--set=data.data_dir={tmp_path / 'data'}",
        f"--model_dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["absolute"] == 2.0  # The user's `if` on a tensor was converted.
    converted = report["converted"]
    # The step loop (marked) and the evaluation's step (a tf.function) at least.
    assert "TrainStep.run_steps" in converted and len(converted) < 10, converted
    for name, decorators in converted.items():
        assert any(d.startswith(ENTRIES) for d in decorators), (name, decorators)


def test_keep_call_cancellation_runs_each_call_under_a_manager_it_keeps(monkeypatch):
    """What a lost worker's survivor needs: each call's manager outlives the call (kept for
    the next `calls` calls) and is the one the call runs under (cancelled, it stops it)."""
    from tensorflow.python.eager import cancellation

    monkeypatch.setattr(cancellation, "context", cancellation.context)  # Restored after.
    compat.keep_call_cancellation(calls=2)
    compat.keep_call_cancellation()  # Once is enough.
    kept = cancellation.context.keeps
    add_one = tf.function(lambda x: x + 1.0)
    managers = []
    for value in range(3):
        assert float(add_one(tf.constant(float(value)))) == value + 1.0
        managers.append(kept[-1])
    assert len({id(m) for m in managers}) == 3
    assert [id(m) for m in kept] == [id(m) for m in managers[1:]]

    class Cancelled(cancellation.CancellationManager):
        def __init__(self):
            super().__init__()
            self.start_cancel()

    with monkeypatch.context() as patch:
        patch.setattr(cancellation, "CancellationManager", Cancelled)
        with pytest.raises(tf.errors.CancelledError):
            add_one(tf.constant(1.0))
    # A caller's own manager (a cancellable function) still comes first.
    own = cancellation.CancellationManager()
    concrete = add_one.get_concrete_function(tf.TensorSpec([], tf.float32))
    assert float(own.get_cancelable_function(concrete)(tf.constant(1.0))) == 2.0
    own.start_cancel()
    with pytest.raises(tf.errors.CancelledError):
        own.get_cancelable_function(concrete)(tf.constant(1.0))
