"""Optimizers built from the config's `optimizer:` section, as a TF1 trainer's were.

The section names a class (`config/optimizer_kinds.py`): `momentum` (TF1's rule),
Keras 3's `sgd`, `rmsprop`, `adam`, `adamw`, and `lamb` and `lars`
(`large_batch.py`). Weight decay is the model's L2 loss, as in TF1; `adamw`, `lamb`
and `lars` also decay, sparing BatchNorm and biases. Clipping is per replica. Build
the optimizer in `strategy.scope()`: unbuilt, the first `apply_gradients` in
`strategy.run` fails with "You must feed a value for placeholder tensor".
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


class SlotOptimizer(keras.optimizers.Optimizer):
    """A Keras optimizer with a slot per variable for each of `SLOTS` (`self.slots[i]`),
    and `SETTINGS`, {keyword argument: default}: each kept as an attribute of its
    default's type, and in `get_config`."""

    SLOTS: tuple[str, ...] = ()
    SETTINGS: dict[str, Any] = {}

    def __init__(self, learning_rate: Any, name: str, **kwargs: Any):
        settings = {
            key: type(default)(kwargs.pop(key, default)) for key, default in self.SETTINGS.items()
        }
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        for key, value in settings.items():
            setattr(self, key, value)

    def build(self, var_list: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(var_list)
        self.slots = [
            [self.add_variable_from_reference(variable, slot) for variable in var_list]
            for slot in self.SLOTS
        ]

    def _constant(self, value: float, variable: keras.Variable) -> Any:
        # Not ops.cast(value, ...): a Python float goes through float32 first.
        return ops.convert_to_tensor(value, variable.dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), **{name: getattr(self, name) for name in self.SETTINGS}}


@keras.saving.register_keras_serializable(package="resnet_app")
class Momentum(SlotOptimizer):
    """TF1's `MomentumOptimizer` rule: `a = momentum * a + g`, then `w -= lr * a`, or
    with `nesterov` `w -= lr * (g + momentum * a)`. After a rate change TF1 rescales the
    whole velocity at once; Keras `SGD` lets it decay at the old rate. Gradients apply
    densely: `IndexedSlices` decay every row."""

    SLOTS = ("momentum",)
    SETTINGS = {"momentum": 0.9, "nesterov": False}

    def __init__(self, learning_rate: Any = 0.1, name: str = "momentum", **kwargs: Any):
        super().__init__(learning_rate, name, **kwargs)
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        learning_rate = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        momentum = self._constant(self.momentum, variable)
        accumulator = self.slots[0][self._get_variable_index(variable)]
        new_accumulator = ops.add(ops.multiply(accumulator, momentum), gradient)
        self.assign(accumulator, new_accumulator)
        if self.nesterov:
            step = ops.add(gradient, ops.multiply(new_accumulator, momentum))
        else:
            step = new_accumulator
        self.assign_sub(variable, ops.multiply(step, learning_rate))


def check_optimizer_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Validates an optimizer config (an `optimizer:` section or a mapping `{"class":
    name, arg: value}`) without building anything, or raises `ConfigError`; returns
    `class` and every argument, defaults filled in, numbers as floats."""
    if not isinstance(config, OptimizerSection):
        config = OptimizerSection.from_mapping(config)
    return {"class": config.kind, **config.arguments()}


def _with_lr_multipliers(cls: type, multipliers: Mapping[str, float]) -> type:
    """`cls` with a learning-rate multiplier per variable, by path."""

    class Scaled(cls):
        lr_multipliers = dict(multipliers)

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
    """The unbuilt optimizer a config describes (see `check_optimizer_config`), its rate
    a variable (`set_learning_rate`). `lr_multipliers`, {variable path: factor}, scale
    those variables' rates in every class's rule (the decay inside `lamb`'s and
    `lars`'s too, not `adamw`'s decoupled one): fine-tuning's per-part rates.
    """
    if not isinstance(config, OptimizerSection):
        config = OptimizerSection.from_mapping(config)
    cls = None
    if lr_multipliers and any(factor != 1.0 for factor in lr_multipliers.values()):
        cls = _with_lr_multipliers(config.optimizer_class(), lr_multipliers)
    return config.build(cls)


def set_learning_rate(optimizer: keras.optimizers.Optimizer, value: Any) -> None:
    """Sets the rate the next `apply_gradients` uses: a variable, so a traced function
    reads it without retracing (inside one, pass a tensor, not a changing float)."""
    learning_rate = optimizer.learning_rate
    if not isinstance(learning_rate, keras.Variable):
        raise TypeError(
            f"{type(optimizer).__name__} has learning rate {learning_rate!r}, not a "
            "variable; create it with a float learning_rate to set the rate per step"
        )
    learning_rate.assign(value)
