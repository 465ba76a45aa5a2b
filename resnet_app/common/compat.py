"""Every use of a private Keras or TensorFlow API, each behind one small named function.

The rest of resnet_app calls these instead of reaching into `_private`
attributes, so that a Keras or TensorFlow upgrade that moves one breaks in one
place, named, and tests/test_compat.py says which. Each function says why no
public API does the job and the versions it was checked on.

Checked on TensorFlow 2.21.0 and Keras 3.15.1 (`CHECKED_ON`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

# Private module: the optimizer base class that does not merge into cross-replica context.
from keras.src.optimizers import base_optimizer

# The versions every function below was read against and tested on.
CHECKED_ON = {"tensorflow": "2.21.0", "keras": "3.15.1"}

# How far `advance_collective_key_base` moves the base: more group keys than
# one strategy uses.
COLLECTIVE_KEY_STEP = 100_000


def trace_as_written(package: str = "resnet_app") -> None:
    """Tells AutoGraph to trace `package`'s functions as written, unconverted.

    AutoGraph rewrites every Python function a `tf.function` or a `tf.data`
    transformation traces (`if`/`for` on tensors into `tf.cond`/`tf.while_loop`).
    resnet_app's traced code writes its control flow with TensorFlow ops, so
    the rewrite changes nothing in the graphs but costs time: about 2 s of CPU,
    nearly half of a tiny run's time after TensorFlow's import, at every start,
    resume, evaluation and export. Code outside `package` (a user's schedule
    script, a test's helper) is still converted. `tf.function(autograph=False)`
    at each site would do the same publicly, but misses `tf.data` lambdas and
    every site added later; tests/test_compat.py checks that no resnet_app
    function is converted.
    Checked on TensorFlow 2.21.0: `autograph.core.config.CONVERSION_RULES`,
    read at each conversion.

    Args:
      package: the top-level module whose functions are left as written.
    """
    from tensorflow.python.autograph.core import config as autograph_config

    rule = autograph_config.DoNotConvert(package)
    rules = autograph_config.CONVERSION_RULES
    if not any(isinstance(r, type(rule)) and r._prefix == package for r in rules):
        autograph_config.CONVERSION_RULES = (rule, *rules)


def converted_by_autograph(function: Callable) -> Callable:
    """Marks a function whose Python `for`/`if` on tensors needs AutoGraph (a step loop).

    `trace_as_written` leaves resnet_app's functions unconverted when another
    traced function calls them (a `tf.function` still converts the function
    it wraps itself); a function so marked is converted wherever it is called
    from: directly by `tf.function`, or from inside another traced function
    (a subclass's or a test's wrapper). Public API: `tf.autograph.to_graph`.
    """
    graph_version = functools.cache(lambda: tf.autograph.to_graph(function))

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(function)
    def call(*args, **kwargs):
        return graph_version()(*args, **kwargs)

    return call


def nested_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer inside `layer`, however deeply nested, without `layer` itself.

    `Model.layers` lists only the direct children of a subclassed model, and a
    plain `Layer` has no public list at all.
    Checked on Keras 3.15.1: `Layer._flatten_layers(include_self, recursive)`.

    Args:
      layer: a layer or model.

    Returns:
      Its sublayers, each once, parents before their children.
    """
    return list(layer._flatten_layers(include_self=False, recursive=True))


def clip_gradients(optimizer: keras.optimizers.Optimizer, gradients: Sequence[Any]) -> list[Any]:
    """The gradients clipped as `optimizer.apply_gradients` would, without applying them.

    Clipping follows the optimizer's `clipnorm`, `global_clipnorm` or `clipvalue`.
    Checked on Keras 3.15.1: `BaseOptimizer._clip_gradients(grads)`.

    Args:
      optimizer: a Keras optimizer, with or without a clipping option.
      gradients: one per variable (None allowed).

    Returns:
      The clipped gradients, in order (unchanged without a clipping option).
    """
    return list(optimizer._clip_gradients(list(gradients)))


def apply_weight_decay_locally(
    optimizer: keras.optimizers.Optimizer, variables: Sequence[Any]
) -> None:
    """Decoupled weight decay, `w -= learning_rate * weight_decay * w`, on this replica's copy.

    The decay `apply_gradients` does for every variable the optimizer decays
    (not excluded by `exclude_from_weight_decay`); nothing without
    `weight_decay`. It calls the base class's rule: the TensorFlow backend's
    override merges into cross-replica context, which a per-replica (model
    averaging) update must not.
    Checked on Keras 3.15.1: `BaseOptimizer._apply_weight_decay(self, variables)`.

    Args:
      optimizer: a built Keras optimizer.
      variables: the variables to decay (those the optimizer was built for).
    """
    base_optimizer.BaseOptimizer._apply_weight_decay(optimizer, list(variables))


def advance_collective_key_base(step: int = COLLECTIVE_KEY_STEP) -> int:
    """Moves the base from which the next `MirroredStrategy` numbers its collective groups.

    Every MirroredStrategy copies this class attribute when it is created, so
    two strategies of different sizes in one process would share group keys;
    TF's own tests move it the same way. There is no public setting.
    Checked on TensorFlow 2.21.0: `MirroredStrategy._collective_key_base`,
    read by `MirroredExtended.__init__`.

    Args:
      step: how far to move it.

    Returns:
      The new base.
    """
    tf.distribute.MirroredStrategy._collective_key_base += step
    return tf.distribute.MirroredStrategy._collective_key_base


def graph_function(graph: tf.Graph, name: str) -> Any | None:
    """The function called `name` in `graph`'s library, e.g. the body a `PartitionedCall` runs.

    The public graph gives only the `FunctionDef` protos
    (`graph.as_graph_def().library`), not the traced functions with their graphs.
    Checked on TensorFlow 2.21.0: `Graph._get_function(name)`.

    Args:
      graph: a traced graph.
      name: a function name from an op's `func` attribute.

    Returns:
      The function (with a `.graph` for a traced one), or None if `graph` has none by that name.
    """
    return graph._get_function(name)


def in_xla_context() -> bool:
    """Whether the graph being built is compiled by XLA (inside a jit_compile=True tf.function).

    No public API says so; a layer that picks its ops for XLA (grouped
    convolutions, `nets/grouped_conv.py`) needs to know. Checked on TensorFlow
    2.21.0: `control_flow_util.GraphOrParentsInXlaContext`.
    """
    from tensorflow.python.framework import ops
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def keras_home() -> str:
    """Keras's own folder (`$KERAS_HOME`, else ~/.keras), where its downloads are cached.

    Keras has no public function for it. Checked on Keras 3.15.1:
    `keras.src.backend.config.keras_home()`.
    """
    from keras.src.backend import config as keras_config

    # Keras reads $KERAS_HOME once, at import; a later change counts here too.
    return os.path.expanduser(os.environ.get("KERAS_HOME") or keras_config.keras_home())


def keras_resnet_weights() -> tuple[str, dict[str, tuple[str, str]]]:
    """Where Keras applications download ResNet weights from, and their MD5 hashes.

    Returns:
      (base URL, {"resnet50": (hash with top, hash without top), ...}), as
      `keras.applications.ResNet50(weights="imagenet")` uses them; no public
      API gives them. Checked on Keras 3.15.1: `keras.src.applications.resnet`'s
      `BASE_WEIGHTS_PATH` and `WEIGHTS_HASHES`.
    """
    from keras.src.applications import resnet

    return resnet.BASE_WEIGHTS_PATH, dict(resnet.WEIGHTS_HASHES)


# Every module that traces resnet_app code imports this one (through the data
# sources, the layers or the step), before it traces anything.
trace_as_written()
