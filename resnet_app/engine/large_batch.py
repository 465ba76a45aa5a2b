"""LAMB and LARS: the large-batch rules, with a trust ratio per variable.

Each scales a variable's step by the ratio of its weights' norm to its update's.
BatchNorm gamma and beta and every bias (`NO_WEIGHT_DECAY`) get neither the
weight decay nor the ratio (`exclude_from_adaptation`).
"""

from __future__ import annotations

import re
from typing import Any

import keras
from absl import logging
from keras import ops

from resnet_app.config.optimizer_kinds import NO_WEIGHT_DECAY
from resnet_app.engine.optim import SlotOptimizer

_EXCLUDED = re.compile("|".join(NO_WEIGHT_DECAY))


def _norm(tensor: Any) -> Any:
    """The L2 norm of a whole tensor."""
    return ops.sqrt(ops.sum(ops.square(tensor)))


def _trust_ratio(numerator: Any, denominator: Any, w_norm: Any, other_norm: Any) -> Any:
    """`numerator / denominator` where ||w|| > 0 and the other norm > 0, else 1 (as the papers)."""
    ratio = ops.divide(numerator, denominator)
    one = ops.ones_like(ratio)
    return ops.where(ops.greater(w_norm, 0), ops.where(ops.greater(other_norm, 0), ratio, one), one)


class _Layerwise(SlotOptimizer):
    """What `Lamb` and `Lars` share: the decay inside the rule, the exclusions.

    The decay enters the trust ratio, so it is kept as `weight_decay_rate` and never
    given to Keras, whose `apply_gradients` would decay the weights a second time.
    """

    def __init__(self, learning_rate: Any, name: str, weight_decay: float = 0.0, **kwargs: Any):
        super().__init__(learning_rate, name, **kwargs)
        if not weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.weight_decay_rate = float(weight_decay)

    def build(self, var_list: list[keras.Variable]) -> None:
        if self.built:
            return
        super().build(var_list)
        self.adapted = [
            not (self.exclude_from_adaptation and _EXCLUDED.search(variable.path))
            for variable in var_list
        ]
        logging.info(
            "%s: trust ratio (and weight_decay=%g) on %d of %d variables",
            self.name, self.weight_decay_rate, sum(self.adapted), len(var_list),
        )  # fmt: skip

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "weight_decay": self.weight_decay_rate}


@keras.saving.register_keras_serializable(package="resnet_app")
class Lamb(_Layerwise):
    """LAMB, Algorithm 2 of You et al. 2020, "Large Batch Optimization for Deep Learning".

    With gradient `g`, step `t` (from 1), learning rate `lr`, decay `wd`:

        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g**2
        r = (m / (1 - beta_1**t)) / (sqrt(v / (1 - beta_2**t)) + epsilon)
        u = r + wd * w
        w -= lr * (||w|| / ||u||) * u      (ratio 1 if ||w|| or ||u|| is 0)

    An excluded variable takes `w -= lr * r` (Adam), as in timm's `Lamb`; unlike timm,
    the ratio applies even at `wd` 0, as in the paper. (`keras.optimizers.Lamb` decays
    outside the ratio and excludes nothing.)
    """

    SLOTS = ("momentum", "velocity")
    SETTINGS = {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-6, "exclude_from_adaptation": True}

    def __init__(self, learning_rate: Any = 0.001, name: str = "lamb", **kwargs: Any):
        super().__init__(learning_rate, name, **kwargs)

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        index = self._get_variable_index(variable)
        m, v = self.slots[0][index], self.slots[1][index]
        gradient = ops.cast(gradient, variable.dtype)
        beta_1 = self._constant(self.beta_1, variable)
        beta_2 = self._constant(self.beta_2, variable)
        step = ops.cast(self.iterations + 1, variable.dtype)
        new_m = ops.add(ops.multiply(beta_1, m), ops.multiply(1 - beta_1, gradient))
        new_v = ops.add(ops.multiply(beta_2, v), ops.multiply(1 - beta_2, ops.square(gradient)))
        self.assign(m, new_m)
        self.assign(v, new_v)
        root = ops.sqrt(ops.divide(new_v, 1 - ops.power(beta_2, step)))
        update = ops.divide(
            ops.divide(new_m, 1 - ops.power(beta_1, step)),
            ops.add(root, self._constant(self.epsilon, variable)),
        )
        if self.adapted[index]:
            if self.weight_decay_rate:
                decay = self._constant(self.weight_decay_rate, variable)
                update = ops.add(update, ops.multiply(decay, variable))
            w_norm, u_norm = _norm(variable), _norm(update)
            update = ops.multiply(update, _trust_ratio(w_norm, u_norm, w_norm, u_norm))
        self.assign_sub(variable, ops.multiply(ops.cast(learning_rate, variable.dtype), update))


@keras.saving.register_keras_serializable(package="resnet_app")
class Lars(_Layerwise):
    """LARS, Algorithm 1 of You, Gitman, Ginsburg 2017, "Large Batch Training of ConvNets".

    With gradient `g`, learning rate `lr`, decay `wd`, velocity `v` (zero at first):

        ratio = eeta * ||w|| / (||g|| + wd * ||w|| + epsilon)   (1 if ||w|| or ||g|| is 0)
        v = momentum * v + lr * ratio * (g + wd * w)
        w -= v                                         (nesterov=False)
        w -= momentum * v + lr * ratio * (g + wd * w)   (nesterov=True)

    An excluded variable takes ratio 1 and wd 0: Keras `SGD`'s momentum. The
    denominator is TF 1.x `LARSOptimizer`'s (MLPerf's ResNet-50); Model Garden's
    divides by ||g + wd * w||. `v` holds rate-scaled steps, as `SGD`'s.
    """

    SLOTS = ("momentum",)
    SETTINGS = {
        "momentum": 0.9,
        "eeta": 0.001,
        "epsilon": 0.0,
        "nesterov": False,
        "exclude_from_adaptation": True,
    }

    def __init__(self, learning_rate: Any = 0.1, name: str = "lars", **kwargs: Any):
        super().__init__(learning_rate, name, **kwargs)

    def update_step(self, gradient: Any, variable: keras.Variable, learning_rate: Any) -> None:
        index = self._get_variable_index(variable)
        velocity = self.slots[0][index]
        gradient = ops.cast(gradient, variable.dtype)
        rate = ops.cast(learning_rate, variable.dtype)
        if self.adapted[index]:
            decay = self._constant(self.weight_decay_rate, variable)
            w_norm, g_norm = _norm(variable), _norm(gradient)
            denominator = ops.add(
                ops.add(g_norm, ops.multiply(decay, w_norm)), self._constant(self.epsilon, variable)
            )
            eeta = self._constant(self.eeta, variable)
            ratio = _trust_ratio(ops.multiply(eeta, w_norm), denominator, w_norm, g_norm)
            rate = ops.multiply(rate, ratio)
            if self.weight_decay_rate:
                gradient = ops.add(gradient, ops.multiply(decay, variable))
        momentum = self._constant(self.momentum, variable)
        step = ops.multiply(rate, gradient)
        new_velocity = ops.add(ops.multiply(momentum, velocity), step)
        self.assign(velocity, new_velocity)
        if self.nesterov:
            self.assign_sub(variable, ops.add(ops.multiply(momentum, new_velocity), step))
        else:
            self.assign_sub(variable, new_velocity)
