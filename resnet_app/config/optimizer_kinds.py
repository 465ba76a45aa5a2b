"""The `optimizer:` section: one dataclass per optimizer class, its arguments and defaults.

`OPTIMIZER` names the Keras class, imported only by `build`: a bad argument is
answered before TensorFlow loads.
"""

from __future__ import annotations

import dataclasses
import importlib
import numbers
from typing import Any

from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import (
    AT_LEAST_0,
    CHECK,
    FLAG,
    FRACTION,
    MORE_THAN_0,
    FieldType,
    Rule,
    field_types,
    setting,
)
from resnet_app.config.oneof import ALTERNATIVE, OneOfSection, check_alternatives

_NORM = Rule(MORE_THAN_0.test, "a number > 0 or null")

# The variables no optimizer decays: BatchNorm gamma and beta and every bias.
# Keras matches the whole variable path ("stage1_unit0_bn1/gamma/replica_1:0"),
# so the pattern is anchored to the last component (a layer named "beta..." keeps
# its kernel's decay).
NO_WEIGHT_DECAY = (r"(?:^|/)(?:gamma|beta|bias)(?:/replica_\d+)?(?::\d+)?$",)


def clipping(other: str) -> Any:
    """`clipnorm` or `global_clipnorm`: off by default, at most one of the two."""
    return setting(None, _NORM, **{ALTERNATIVE: other})


class OptimizerSection(OneOfSection):
    """The `optimizer:` section's family: `class` names the kind.

    The help of arguments several kinds share; a kind's own text wins.

    Attributes:
      learning_rate: the base learning rate (the schedule scales it).
      beta_1: the first moment's decay, in [0, 1).
      beta_2: the second moment's decay, in [0, 1).
      epsilon: added to the root of the second moment, > 0.
      amsgrad: use the largest second moment so far (Reddi et al. 2018).
      nesterov: Nesterov momentum.
      clipnorm: clip each variable's gradient to this norm (or null).
      global_clipnorm: or clip all gradients together to this norm (or null).
    """

    SECTION = "optimizer"
    KEY = "class"
    KINDS: dict[str, type[OptimizerSection]] = {}
    OPTIMIZER = ""  # "module:Class": the Keras optimizer class the kind builds.

    def __post_init__(self):
        types = field_types(type(self))
        for field in dataclasses.fields(self):
            value = _check_value(self.KIND, field, getattr(self, field.name), types[field.name])
            object.__setattr__(self, field.name, value)
        check_alternatives(self, "{}", within=f"optimizer '{self.KIND}'")

    def arguments(self) -> dict[str, Any]:
        """The optimizer class's keyword arguments: every field, None included."""
        return self.field_values()

    @property
    def decays_weights(self) -> bool:
        """Whether the optimizer decays the weights itself (a preset's L2 would decay twice)."""
        return getattr(self, "weight_decay", 0) > 0

    def optimizer_class(self) -> type:
        """The Keras optimizer class `OPTIMIZER` names (imports Keras)."""
        module, name = self.OPTIMIZER.split(":")
        return getattr(importlib.import_module(module), name)

    def build(self, cls: type | None = None) -> Any:
        """The unbuilt Keras optimizer: `cls` (by default `optimizer_class()`, which
        a caller may subclass first) called with the arguments."""
        return (cls or self.optimizer_class())(**self.arguments())

    @classmethod
    def not_a_mapping_error(cls, value: Any) -> ConfigError:
        return ConfigError(
            f"optimizer config must be a mapping like {{'class': 'momentum'}}, got {value!r}"
        )

    @classmethod
    def missing_kind_error(cls) -> ConfigError:
        return ConfigError(f"optimizer config needs a 'class', one of: {cls.valid_kinds()}")

    @classmethod
    def unknown_kind_error(cls, kind: Any) -> ConfigError:
        return ConfigError(f"unknown optimizer class {kind!r}; valid classes: {cls.valid_kinds()}")

    @classmethod
    def unknown_keys_error(cls, keys: list[Any]) -> ConfigError:
        valid = ", ".join(field.name for field in dataclasses.fields(cls))
        return ConfigError(
            f"unknown argument(s) {', '.join(sorted(map(str, keys)))} for optimizer class "
            f"'{cls.KIND}'; valid arguments: {valid}"
        )


def _check_value(kind: str, field: dataclasses.Field, value: Any, type_: FieldType) -> Any:
    """Returns `value` for argument `field` of class `kind`, or raises ConfigError."""
    where = f"optimizer '{kind}' argument '{field.name}'"
    if type_.base is bool:
        return FLAG.check(where, value)
    if value is None and type_.optional:
        return None
    rule = field.metadata[CHECK]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        hint = ""
        if isinstance(value, str) and _is_float(value):
            # PyYAML reads `1e-7` (no dot) as a string; `1.0e-7` is a float.
            if "e" in value.lower() and "." not in value:
                hint = f"; YAML reads {value} as text, write {value.lower().replace('e', '.0e')}"
            else:
                hint = "; write the number without quotes"
        raise ConfigError(
            f"{where} must be {rule.wanted}, got {value!r} ({type(value).__name__}){hint}"
        )
    return rule.check(where, float(value))


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True, eq=False)
class Momentum(OptimizerSection, kind="momentum"):
    """TF1's momentum rule (`optim.Momentum`); see `optim.py` for how it differs from sgd.

    Attributes:
      momentum: the accumulator's decay, in [0, 1).
    """

    OPTIMIZER = "resnet_app.engine.optim:Momentum"

    learning_rate: float = setting(0.1, AT_LEAST_0)
    momentum: float = setting(0.9, FRACTION)
    nesterov: bool = False
    clipnorm: float | None = clipping("global_clipnorm")
    global_clipnorm: float | None = clipping("clipnorm")


@dataclasses.dataclass(frozen=True, eq=False)
class SGD(Momentum, kind="sgd"):
    """Keras `SGD`, whose velocity keeps the learning rate it was accumulated at.

    Attributes:
      momentum: the velocity's decay, in [0, 1) (0: plain gradient descent).
    """

    OPTIMIZER = "keras.optimizers:SGD"

    momentum: float = setting(0.0, FRACTION)  # Momentum's other fields, in their order.


@dataclasses.dataclass(frozen=True, eq=False)
class RMSprop(OptimizerSection, kind="rmsprop"):
    """Keras `RMSprop`.

    Attributes:
      rho: the decay of the squared gradients' average, in [0, 1).
      momentum: the step's momentum, in [0, 1).
      epsilon: added to the root of the average, > 0.
      centered: divide by the gradients' variance instead of their second moment.
    """

    OPTIMIZER = "keras.optimizers:RMSprop"

    learning_rate: float = setting(0.001, AT_LEAST_0)
    rho: float = setting(0.9, FRACTION)
    momentum: float = setting(0.0, FRACTION)
    epsilon: float = setting(1e-7, MORE_THAN_0)
    centered: bool = False
    clipnorm: float | None = clipping("global_clipnorm")
    global_clipnorm: float | None = clipping("clipnorm")


@dataclasses.dataclass(frozen=True, eq=False)
class Adam(OptimizerSection, kind="adam"):
    """Keras `Adam`."""

    OPTIMIZER = "keras.optimizers:Adam"

    learning_rate: float = setting(0.001, AT_LEAST_0)
    beta_1: float = setting(0.9, FRACTION)
    beta_2: float = setting(0.999, FRACTION)
    epsilon: float = setting(1e-7, MORE_THAN_0)
    amsgrad: bool = False
    clipnorm: float | None = clipping("global_clipnorm")
    global_clipnorm: float | None = clipping("clipnorm")


@dataclasses.dataclass(frozen=True, eq=False)
class AdamW(OptimizerSection, kind="adamw"):
    """Keras `AdamW`: decoupled weight decay, per unit of learning rate (Keras's default).

    Attributes:
      weight_decay: the decoupled decay, multiplied by the learning rate.
    """

    OPTIMIZER = "keras.optimizers:AdamW"

    learning_rate: float = setting(0.001, AT_LEAST_0)
    weight_decay: float = setting(0.004, AT_LEAST_0)
    beta_1: float = setting(0.9, FRACTION)
    beta_2: float = setting(0.999, FRACTION)
    epsilon: float = setting(1e-7, MORE_THAN_0)
    amsgrad: bool = False
    clipnorm: float | None = clipping("global_clipnorm")
    global_clipnorm: float | None = clipping("clipnorm")

    @property
    def decays_weights(self) -> bool:
        return True

    def build(self, cls: type | None = None) -> Any:
        # Keras decays every variable it updates; BatchNorm and biases are spared.
        optimizer = super().build(cls)
        optimizer.exclude_from_weight_decay(var_names=list(NO_WEIGHT_DECAY))
        return optimizer


@dataclasses.dataclass(frozen=True, eq=False)
class Lamb(OptimizerSection, kind="lamb"):
    """LAMB (You et al. 2020), `large_batch.Lamb`: Adam's step, decayed, scaled per variable.

    Attributes:
      weight_decay: decay added to the Adam step, inside the trust ratio (0: none).
      exclude_from_adaptation: BatchNorm gamma/beta and biases get neither the
        decay nor the trust ratio (plain Adam).
    """

    OPTIMIZER = "resnet_app.engine.large_batch:Lamb"

    learning_rate: float = setting(0.001, AT_LEAST_0)
    beta_1: float = setting(0.9, FRACTION)
    beta_2: float = setting(0.999, FRACTION)
    epsilon: float = setting(1e-6, MORE_THAN_0)
    weight_decay: float = setting(0.0, AT_LEAST_0)
    exclude_from_adaptation: bool = True
    clipnorm: float | None = clipping("global_clipnorm")
    global_clipnorm: float | None = clipping("clipnorm")


@dataclasses.dataclass(frozen=True, eq=False)
class Lars(OptimizerSection, kind="lars"):
    """LARS (You, Gitman, Ginsburg 2017), `large_batch.Lars`: momentum with a per-layer rate.

    Attributes:
      learning_rate: the base learning rate (the schedule scales it); the
        trust ratio, about eeta * ||w|| / ||g||, multiplies it per variable.
      momentum: the velocity's decay, in [0, 1).
      eeta: the trust coefficient, > 0.
      weight_decay: L2 decay added to the gradient, and to the ratio's denominator.
      epsilon: added to the trust ratio's denominator, >= 0.
      exclude_from_adaptation: BatchNorm gamma/beta and biases get neither the
        decay nor the trust ratio (plain momentum).
    """

    OPTIMIZER = "resnet_app.engine.large_batch:Lars"

    learning_rate: float = setting(0.1, AT_LEAST_0)
    momentum: float = setting(0.9, FRACTION)
    eeta: float = setting(0.001, MORE_THAN_0)
    weight_decay: float = setting(0.0, AT_LEAST_0)
    epsilon: float = setting(0.0, AT_LEAST_0)
    nesterov: bool = False
    exclude_from_adaptation: bool = True
    clipnorm: float | None = clipping("global_clipnorm")
    global_clipnorm: float | None = clipping("clipnorm")
