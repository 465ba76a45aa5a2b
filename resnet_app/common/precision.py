"""The names `train.precision` takes and what each computes in (no TensorFlow)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Precision:
    """One `train.precision`: its `name`, the dtype the layers (and images) compute in
    (weights stay float32), and whether the loss is scaled (float16)."""

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
