"""Every use of a private Keras or TensorFlow API, each behind one small named function.

An upgrade that moves one breaks here, in one place, and tests/test_compat.py
says which. Checked on TensorFlow 2.21.0 and Keras 3.15.1.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.optimizers import base_optimizer


def trace_as_written(package: str = "resnet_app") -> None:
    """Tells AutoGraph to leave `package`'s functions unconverted when traced.

    Our traced code writes its control flow with TensorFlow ops, so the rewrite
    only costs start-up time; `tf.function(autograph=False)` per site would miss
    `tf.data` lambdas. Private: `autograph.core.config.CONVERSION_RULES`.
    """
    from tensorflow.python.autograph.core import config as autograph_config

    rule = autograph_config.DoNotConvert(package)
    rules = autograph_config.CONVERSION_RULES
    if not any(isinstance(r, type(rule)) and r._prefix == package for r in rules):
        autograph_config.CONVERSION_RULES = (rule, *rules)


def converted_by_autograph(function: Callable) -> Callable:
    """Marks a function whose Python `for`/`if` on tensors needs AutoGraph (a step loop).

    It is converted wherever it is traced from, despite `trace_as_written`
    (public API: `tf.autograph.to_graph`).
    """
    graph_version = functools.cache(lambda: tf.autograph.to_graph(function))

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(function)
    def call(*args, **kwargs):
        return graph_version()(*args, **kwargs)

    return call


def nested_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer inside `layer`, however deep, parents first, without `layer` itself.

    `Model.layers` lists only a subclassed model's direct children. Private:
    `Layer._flatten_layers`.
    """
    return list(layer._flatten_layers(include_self=False, recursive=True))


def clip_gradients(optimizer: keras.optimizers.Optimizer, gradients: Sequence[Any]) -> list[Any]:
    """The gradients clipped as `apply_gradients` would (clipnorm, global_clipnorm, clipvalue).

    Private: `BaseOptimizer._clip_gradients`.
    """
    return list(optimizer._clip_gradients(list(gradients)))


def apply_weight_decay_locally(
    optimizer: keras.optimizers.Optimizer, variables: Sequence[Any]
) -> None:
    """Decoupled weight decay, `w -= lr * weight_decay * w`, on this replica's copy.

    The base class's rule: the TensorFlow backend's override merges into
    cross-replica context, which a per-replica (model averaging) update must
    not. Private: `BaseOptimizer._apply_weight_decay`.
    """
    base_optimizer.BaseOptimizer._apply_weight_decay(optimizer, list(variables))


def advance_collective_key_base(step: int = 100_000) -> int:
    """Moves the base the next `MirroredStrategy` numbers its collective groups from; returns it.

    Every strategy copies this class attribute, so two of different sizes in one
    process would share group keys (TF's own tests move it alike). Private:
    `MirroredStrategy._collective_key_base`.
    """
    tf.distribute.MirroredStrategy._collective_key_base += step
    return tf.distribute.MirroredStrategy._collective_key_base


def graph_function(graph: tf.Graph, name: str) -> Any | None:
    """The function `name` of `graph`'s library (with its `.graph`), or None.

    The public graph gives only `FunctionDef` protos. Private: `Graph._get_function`.
    """
    return graph._get_function(name)


def in_xla_context() -> bool:
    """Whether the graph being built is compiled by XLA (`nets/grouped_conv.py` picks ops by it).

    Private: `control_flow_util.GraphOrParentsInXlaContext`.
    """
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def keras_home() -> str:
    """Keras's download cache folder: `$KERAS_HOME`, else ~/.keras.

    Keras reads $KERAS_HOME once, at import; a later change counts here too.
    Private: `keras.src.backend.config.keras_home`.
    """
    from keras.src.backend import config as keras_config

    return os.path.expanduser(os.environ.get("KERAS_HOME") or keras_config.keras_home())


def keras_resnet_weights() -> tuple[str, dict[str, tuple[str, str]]]:
    """(base URL, {"resnet50": (MD5 with top, without top), ...}) of Keras's ResNet weights.

    Private: `keras.src.applications.resnet`'s `BASE_WEIGHTS_PATH`, `WEIGHTS_HASHES`.
    """
    from keras.src.applications import resnet

    return resnet.BASE_WEIGHTS_PATH, dict(resnet.WEIGHTS_HASHES)


# Every module that traces our code imports this one before it traces anything.
trace_as_written()
