"""Every use of a private Keras or TensorFlow API, each behind one small named function.

Checked on TensorFlow 2.21.0 and Keras 3.15.1; tests/test_compat.py names what breaks.
"""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf
from keras.src.optimizers import base_optimizer


def trace_as_written(package: str = "resnet_app") -> None:
    """Leaves `package`'s functions unconverted by AutoGraph: their control flow is TF ops
    already, so it only costs start-up time. Private: `autograph...CONVERSION_RULES`."""
    from tensorflow.python.autograph.core import config as autograph_config

    rule = autograph_config.DoNotConvert(package)
    rules = autograph_config.CONVERSION_RULES
    if not any(isinstance(r, type(rule)) and r._prefix == package for r in rules):
        autograph_config.CONVERSION_RULES = (rule, *rules)


def converted_by_autograph(function: Callable) -> Callable:
    """Marks a function whose Python `for`/`if` on tensors needs AutoGraph, despite
    `trace_as_written` (public: `tf.autograph.to_graph`)."""
    graph_version = functools.cache(lambda: tf.autograph.to_graph(function))

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(function)
    def call(*args, **kwargs):
        return graph_version()(*args, **kwargs)

    return call


def nested_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer inside `layer`, however deep, parents first (`Model.layers` lists only
    direct children). Private: `Layer._flatten_layers`."""
    return list(layer._flatten_layers(include_self=False, recursive=True))


def clip_gradients(optimizer: keras.optimizers.Optimizer, gradients: Sequence[Any]) -> list[Any]:
    """The gradients clipped as `apply_gradients` would. Private: `_clip_gradients`."""
    return list(optimizer._clip_gradients(list(gradients)))


def apply_weight_decay_locally(
    optimizer: keras.optimizers.Optimizer, variables: Sequence[Any]
) -> None:
    """Decoupled weight decay on this replica's copy: the TF backend's override merges into
    cross-replica context. Private: `BaseOptimizer._apply_weight_decay`."""
    base_optimizer.BaseOptimizer._apply_weight_decay(optimizer, list(variables))


def advance_collective_key_base(step: int = 100_000) -> int:
    """Moves the base the next `MirroredStrategy` numbers its collective groups from, so two
    strategies in one process do not share keys. Private: `_collective_key_base`."""
    tf.distribute.MirroredStrategy._collective_key_base += step
    return tf.distribute.MirroredStrategy._collective_key_base


def graph_function(graph: tf.Graph, name: str) -> Any | None:
    """The function `name` of `graph`'s library with its `.graph` (public: only protos), or
    None. Private: `Graph._get_function`."""
    return graph._get_function(name)


def in_xla_context() -> bool:
    """Whether the graph being built is compiled by XLA. Private: `control_flow_util`."""
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def keras_home() -> str:
    """Keras's download cache, `$KERAS_HOME` (read now, not at import) else ~/.keras.
    Private: `keras.src.backend.config.keras_home`."""
    from keras.src.backend import config as keras_config

    return os.path.expanduser(os.environ.get("KERAS_HOME") or keras_config.keras_home())


def keras_resnet_weights() -> tuple[str, dict[str, tuple[str, str]]]:
    """(base URL, {"resnet50": (MD5 with top, without top)}) of Keras's ResNet weights.
    Private: `keras.src.applications.resnet`."""
    from keras.src.applications import resnet

    return resnet.BASE_WEIGHTS_PATH, dict(resnet.WEIGHTS_HASHES)


def keep_call_cancellation(calls: int = 256) -> None:
    """Gives each tf.function call its own CancellationManager, kept until `calls` more
    calls have started. TensorFlow frees a call's own when the call returns, but a collective
    that timed out returns with its RPC to the stalled peer still in flight, and the RPC's
    late end deregisters from the freed manager: SIGABRT ("Mutex corrupt") before the
    survivor saves. Private: `eager.cancellation.context`, read by every call."""
    from tensorflow.python.eager import cancellation

    if getattr(cancellation.context, "keeps", None) is not None:
        return
    kept = collections.deque(maxlen=calls)

    def context():
        if cancellation._active_context is not None:  # A caller's own (cancellable calls).
            return cancellation._active_context
        manager = cancellation.CancellationManager()
        kept.append(manager)
        return manager

    context.keeps = kept
    cancellation.context = context


# Every module that traces our code imports this one before it traces anything.
trace_as_written()
