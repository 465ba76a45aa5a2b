"""What a ResNet costs (`resnet-app model`): stage shapes, parameters and MACs.

MACs are counted from the traced graph of one image's forward pass: every
Conv2D, depthwise conv and MatMul; not BatchNorm, ReLU, pooling or additions,
as in the published figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from resnet_app.common.errors import ConfigError
from resnet_app.nets import presets


def count_params(variables: Iterable[Any]) -> int:
    """The total number of elements of variables or tensors with static shapes."""
    return sum(math.prod(int(dim) for dim in variable.shape) for variable in variables)


def count_macs(graph: Any) -> int:
    """The MACs of a traced `tf.Graph`'s Conv2D, depthwise conv and MatMul ops."""
    macs = 0
    for op in graph.get_operations():
        if op.type in ("Conv2D", "DepthwiseConv2dNative"):
            output = op.outputs[0].shape.as_list()  # [N, H, W, C_out] (NHWC).
            kernel = op.inputs[1].shape.as_list()  # [kh, kw, C_in, C_out or mult].
            depth = kernel[2] if op.type == "Conv2D" else 1  # Depthwise: one input channel.
            macs += math.prod(output) * kernel[0] * kernel[1] * depth
        elif op.type == "MatMul":
            rows, inner = op.inputs[0].shape.as_list()
            if op.get_attr("transpose_a"):
                rows, inner = inner, rows
            columns = op.outputs[0].shape.as_list()[1]
            macs += rows * inner * columns
    return macs


def summarize(name: str, image_size: int | None = None, **overrides: Any) -> dict[str, Any]:
    """Builds preset `name` with `ResNetConfig` fields `overrides`, and measures it.

    Returns:
      `model`, `image_size`, `num_classes`, `params`, `trainable_params`,
      `non_trainable_params`, `macs` (per image), and the output shapes
      [H, W, C] of the `stem` and of each of the `stages`.
    """
    config = presets.get_config(name, **overrides)
    image_size = config.default_image_size if image_size is None else image_size
    if image_size < 1:
        raise ConfigError(f"--image_size must be positive, got {image_size}")

    import tensorflow as tf  # Deferred: flags and names are checked first.

    from resnet_app.nets import grouped_conv
    from resnet_app.nets import resnet as model_lib

    model = model_lib.ResNet(config, name=name)
    model.build((1, image_size, image_size, 3))

    @tf.function
    def forward(images):
        return model(images, training=False, return_hidden=True)

    # The architecture's MACs: grouped convs traced as one grouped op, not as
    # the formulation that is fastest on this machine (`nets/grouped_conv.py`).
    with grouped_conv.forced("native"):
        concrete = forward.get_concrete_function(
            tf.TensorSpec((1, image_size, image_size, 3), tf.float32)
        )
    _, hidden = concrete.structured_outputs
    shapes = [tensor.shape.as_list()[1:] for tensor in hidden]
    trainable = count_params(model.trainable_variables)
    non_trainable = count_params(model.non_trainable_variables)
    return {
        "model": name,
        "image_size": image_size,
        "num_classes": config.num_classes,
        "params": trainable + non_trainable,
        "trainable_params": trainable,
        "non_trainable_params": non_trainable,
        "macs": count_macs(concrete.graph),
        "stem": shapes[0],
        "stages": shapes[1:],
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A `summarize()` result as a table (no trailing newline)."""
    size = summary["image_size"]
    lines = [
        f"{summary['model']} at {size}x{size}, {summary['num_classes']} classes",
        f"  {'layer':<8} output (H x W x C)",
    ]
    rows = [("stem", summary["stem"])]
    rows += [(f"stage{index}", shape) for index, shape in enumerate(summary["stages"], 1)]
    for layer, shape in rows:
        lines.append(f"  {layer:<8} {' x '.join(str(dim) for dim in shape)}")
    lines += [
        f"  {'logits':<8} {summary['num_classes']}",
        f"params: {summary['params']:,} (trainable {summary['trainable_params']:,}, "
        f"non-trainable {summary['non_trainable_params']:,})",
        f"MACs per image: {format_count(summary['macs'])} ({summary['macs']:,})",
    ]
    return "\n".join(lines)


def format_count(value: int) -> str:
    """Formats `value` with a K, M or G suffix and two decimals, e.g. "4.09 G"."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return str(value)
