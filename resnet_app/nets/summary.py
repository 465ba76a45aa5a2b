"""What a ResNet costs: stage shapes, parameter counts and multiply-accumulates.

`resnet-app model` prints it (see `resnet_app/tools/model_summary.py`).

MACs are counted from the TensorFlow graph of one forward pass on one image,
not from the stage table: every Conv2D, depthwise conv and MatMul op in the
traced graph contributes its exact multiply-accumulate count. BatchNorm, ReLU,
pooling and additions are not counted, as in the published figures (ResNet-50:
4.09 G with the stride on the 3x3 conv).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from resnet_app.common.errors import ConfigError
from resnet_app.nets import presets


def count_params(variables: Iterable[Any]) -> int:
    """Counts scalars.

    Args:
      variables: variables or tensors with static shapes.

    Returns:
      The total number of elements.
    """
    return sum(math.prod(int(dim) for dim in variable.shape) for variable in variables)


def count_macs(graph: Any) -> int:
    """Counts the multiply-accumulates of a traced graph.

    Args:
      graph: a `tf.Graph` (e.g. a concrete function's) with static shapes.

    Returns:
      The MACs of its Conv2D, depthwise conv and MatMul ops, for the traced
      batch size.
    """
    macs = 0
    for op in graph.get_operations():
        if op.type in ("Conv2D", "DepthwiseConv2dNative"):
            output = op.outputs[0].shape.as_list()  # [N, H, W, C_out] (NHWC).
            kernel = op.inputs[1].shape.as_list()  # [kh, kw, C_in, C_out or mult].
            kernel_macs = kernel[0] * kernel[1] * kernel[2]
            if op.type == "DepthwiseConv2dNative":
                kernel_macs = kernel[0] * kernel[1]
            macs += output[0] * output[1] * output[2] * output[3] * kernel_macs
        elif op.type == "MatMul":
            rows, inner = op.inputs[0].shape.as_list()
            if op.get_attr("transpose_a"):
                rows, inner = inner, rows
            columns = op.outputs[0].shape.as_list()[1]
            macs += rows * inner * columns
    return macs


def summarize(name: str, image_size: int | None = None, **overrides: Any) -> dict[str, Any]:
    """Builds preset `name`, with any `ResNetConfig` field overridden, and measures it.

    Args:
      name: a preset name.
      image_size: input height and width; default: the preset's native size.
      **overrides: `ResNetConfig` fields, e.g. `num_classes=100`.

    Returns:
      A dict with `model`, `image_size`, `params`, `trainable_params`,
      `non_trainable_params`, `macs` (per image), `stem` (the stem's output
      shape, [H, W, C]) and `stages` (each stage's output shape).
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
    """Formats a `summarize()` result as a human-readable table.

    Args:
      summary: what `summarize` returned.

    Returns:
      Multi-line text without a trailing newline.
    """
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
