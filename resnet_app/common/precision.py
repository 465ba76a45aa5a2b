"""The names `train.precision` takes and what each computes in (no TensorFlow).

One registry for the config's check, the images' dtype, the Keras dtype policy
and the loss scaling; `auto` (`auto_precision.py`) resolves to one of these.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Precision:
    """One `train.precision`.

    Attributes:
      name: the config's name ("bf16").
      compute_dtype: the layers' dtype, and the images' (unless `data.dtype` is
        set); weights stay float32.
      loss_scaling: wrap the optimizer in Keras's `LossScaleOptimizer` (float16's
        narrow range).
    """

    name: str
    compute_dtype: str
    loss_scaling: bool = False

    @property
    def keras_policy(self) -> str:
        """The Keras dtype policy its model is built under."""
        dtype = self.compute_dtype
        return dtype if dtype in ("float32", "float64") else f"mixed_{dtype}"


PRECISIONS: dict[str, Precision] = {}


def register(precision: Precision) -> None:
    """Makes `precision.name` a value of `train.precision`."""
    PRECISIONS[precision.name] = precision


def get(name: str) -> Precision:
    """The registered precision `name` (a resolved one, not "auto")."""
    return PRECISIONS[name]


register(Precision("fp32", "float32"))
register(Precision("bf16", "bfloat16"))
register(Precision("fp16", "float16", loss_scaling=True))
