"""Optimizers built from the config's `optimizer:` section, as a TF1 trainer's were.

A config's `optimizer:` section names a class and its arguments, e.g.
`{"class": "momentum", "learning_rate": 0.1, "momentum": 0.9, "nesterov": False}`;
`config/optimizer_kinds.py` declares each class's arguments, defaults and checks
(`OPTIMIZERS` here lists them). `check_optimizer_config` validates a config
without building anything, and `create_optimizer` builds the optimizer.
`set_learning_rate` is how the trainer changes the learning rate every step.

Classes:
  * `momentum`: `Momentum` below, TF1's `MomentumOptimizer` rule. After a learning
    rate drop it applies the new rate to the whole accumulated velocity at once;
    Keras `SGD` keeps the velocity it accumulated at the old rate.
  * `sgd`, `rmsprop`, `adam`, `adamw`: the Keras 3 optimizers.
  * `lamb`, `lars`: `large_batch.Lamb` and `.Lars`, the large-batch rules with a
    trust ratio per variable; their weight decay is inside the rule.
  * Every class also takes `clipnorm` (per variable) or `global_clipnorm`.

Weight decay: the model's L2 penalties (`model.losses`, see `nets/blocks.py`) are summed
into the loss by the trainer, as in TF1, whatever the optimizer. `adamw`'s decoupled
decay (`w -= learning_rate * weight_decay * w`, before the Adam step) is separate:
use one or the other. Keras applies it to every variable the optimizer updates, so
`create_optimizer` excludes BatchNorm `gamma` and `beta` and every `bias`. `lamb`
and `lars` take the same exclusions (`NO_WEIGHT_DECAY`, by variable path) from
both their decay and their trust ratio.

Distribution (tf.distribute):
  * Create the optimizer and build it inside `strategy.scope()`:
    `optimizer = create_optimizer(config); optimizer.build(model.trainable_variables)`.
    Construction makes the iteration and learning-rate variables and records the
    strategy (built in a scope after construction outside it: "Mixing different
    tf.distribute.Strategy objects"); left unbuilt, the first `apply_gradients`
    inside `strategy.run` fails with "You must feed a value for placeholder tensor".
  * `apply_gradients` in replica context sums the gradients over replicas.
    Model averaging (`averaging.py`) applies each replica's own gradients to
    its own copy instead, with the same update rules.
  * Clipping happens in each replica, before that sum: with `global_clipnorm=1` and
    two replicas the summed gradient can have norm 2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import keras
from keras import ops

from resnet_app.config.optimizer_kinds import NO_WEIGHT_DECAY as NO_WEIGHT_DECAY
from resnet_app.config.optimizer_kinds import OptimizerSection

# Class name -> argument -> default, read from the dataclasses of `optimizer_kinds`.
OPTIMIZERS: dict[str, dict[str, Any]] = {
    name: {field.name: field.default for field in dataclasses.fields(kind)}
    for name, kind in OptimizerSection.KINDS.items()
}


@keras.saving.register_keras_serializable(package="resnet_app")
class Momentum(keras.optimizers.Optimizer):
    """TF1's `tf.compat.v1.train.MomentumOptimizer` update rule.

    With accumulator `a` (zero at first), gradient `g` and learning rate `lr`:

        a = momentum * a + g
        w -= lr * a                        (nesterov=False)
        w -= lr * (g + momentum * a)       (nesterov=True, TF1's use_nesterov)

    Keras `SGD` keeps `v = momentum * v - lr * g` instead: the same steps while the
    learning rate is constant, but after a change TF1 rescales the whole velocity
    at once, while `SGD` lets the old velocity decay at the old rate. Gradients are
    applied densely (as `SGD` does), so `IndexedSlices` decay every row.

    Args:
      learning_rate: a float (kept in a variable, see `set_learning_rate`), a
        `LearningRateSchedule` or a callable.
      momentum: in [0, 1).
      nesterov: whether to use Nesterov momentum.
      name: the name scope of the optimizer's variables.
      **kwargs: base `keras.optimizers.Optimizer` arguments (`clipnorm`, ...).
    """

    def __init__(
        self,
        learning_rate: Any = 0.1,
        momentum: float = 0.9,
        nesterov: bool = False,
        name: str = "momentum",
        **kwargs: Any,
    ):
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

    def build(self, var_list: list[keras.Variable]) -> None:
        """Creates one zero "momentum" accumulator per variable."""
        if self.built:
            return
        super().build(var_list)
        self.accumulators = [
            self.add_variable_from_reference(variable, "momentum") for variable in var_list
        ]

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        """Applies one step of TF1's momentum rule to `variable`."""
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        # Not ops.cast(self.momentum, ...): a Python float goes through float32 first.
        momentum = ops.convert_to_tensor(self.momentum, variable.dtype)
        accumulator = self.accumulators[self._get_variable_index(variable)]

        new_accumulator = ops.add(ops.multiply(accumulator, momentum), gradient)
        self.assign(accumulator, new_accumulator)
        if self.nesterov:
            step = ops.add(gradient, ops.multiply(new_accumulator, momentum))
        else:
            step = new_accumulator
        self.assign_sub(variable, ops.multiply(step, learning_rate))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"momentum": self.momentum, "nesterov": self.nesterov})
        return config


def check_optimizer_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Validates an optimizer config without building anything.

    Args:
      config: an `optimizer:` section, or a mapping `{"class": name, arg: value,
        ...}` with a class from `OPTIMIZERS` and any of its arguments.

    Returns:
      A new dict with `class` and every argument of the class: missing ones get
      their default, numbers become floats (Keras rejects an int learning rate).

    Raises:
      ConfigError: for a missing or unknown class, an unknown argument, or a value
        of the wrong type or out of range; the message is one line naming the key.
    """
    if not isinstance(config, OptimizerSection):
        config = OptimizerSection.from_mapping(config)
    return {"class": config.kind, **config.arguments()}


def _with_lr_multipliers(
    cls: type[keras.optimizers.Optimizer],
) -> type[keras.optimizers.Optimizer]:
    """`cls` with a learning-rate multiplier per variable (`lr_multipliers`, by path)."""

    class Scaled(cls):
        lr_multipliers: dict[str, float] = {}

        def build(self, var_list: list[keras.Variable]) -> None:
            if self.built:
                return
            super().build(var_list)
            self.lr_factors = [self.lr_multipliers.get(v.path, 1.0) for v in var_list]

        def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any):
            factor = self.lr_factors[self._get_variable_index(variable)]
            if factor != 1.0:
                learning_rate = ops.multiply(learning_rate, factor)
            return super().update_step(gradient, variable, learning_rate)

    Scaled.__name__ = Scaled.__qualname__ = f"{cls.__name__}WithLrMultipliers"
    return Scaled


def create_optimizer(
    config: Mapping[str, Any], lr_multipliers: Mapping[str, float] | None = None
) -> keras.optimizers.Optimizer:
    """Creates the optimizer a config describes, e.g. `{"class": "adam"}`.

    Call it (and then `optimizer.build(model.trainable_variables)`) inside
    `strategy.scope()` when training with a `tf.distribute` strategy.

    Args:
      config: see `check_optimizer_config`.
      lr_multipliers: {variable path: factor}: those variables' updates use
        the learning rate times the factor (fine-tuning's per-part rates), in
        every class's own rule; the decoupled decay of `adamw` is not scaled,
        the decay inside the rules of `lamb` and `lars` is.

    Returns:
      An unbuilt Keras 3 optimizer whose learning rate is a variable, so that
      `set_learning_rate` can change it between steps.

    Raises:
      ConfigError: for a bad config, see `check_optimizer_config`.
    """
    if not isinstance(config, OptimizerSection):
        config = OptimizerSection.from_mapping(config)
    cls = None
    if lr_multipliers and any(factor != 1.0 for factor in lr_multipliers.values()):
        cls = _with_lr_multipliers(config.optimizer_class())
        cls.lr_multipliers = dict(lr_multipliers)
    return config.build(cls)


def set_learning_rate(optimizer: keras.optimizers.Optimizer, value: Any) -> None:
    """Sets the learning rate the next `apply_gradients` uses.

    The rate lives in a variable, so a `tf.function` traced earlier reads the new
    value; this does not retrace it. Called inside a `tf.function`, pass a tensor
    rather than a Python float that changes every step.

    Args:
      optimizer: an optimizer made with a float learning rate, e.g. by
        `create_optimizer`.
      value: the new learning rate, a float or a scalar tensor.

    Raises:
      TypeError: if the optimizer's learning rate is a schedule or a callable.
    """
    learning_rate = optimizer.learning_rate
    if not isinstance(learning_rate, keras.Variable):
        raise TypeError(
            f"{type(optimizer).__name__} has learning rate {learning_rate!r}, not a "
            "variable; create it with a float learning_rate to set the rate per step"
        )
    learning_rate.assign(value)
