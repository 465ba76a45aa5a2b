"""Independent references for the tests.

Closed-form parameter and MAC counts, written from the papers' description of
the architecture (He et al. 2015, 2016), not from model.py, so that a mistake in
the builder shows up as a mismatch instead of being copied. And training steps
on one device written out by hand, without step.py or optim.py.
"""

import numpy as np
import tensorflow as tf

from resnet_app.nets import presets


def momentum_steps(model, batches, learning_rates, momentum: float) -> None:
    """Trains `model` in place, one step per (images, labels) batch, on one device.

    The loss is the mean cross-entropy plus the model's regularization losses,
    and the update TF1's momentum rule (a = m*a + g; w -= lr*a); plain SGD when
    momentum is 0.
    """
    variables = model.trainable_variables
    accumulators = [np.zeros(v.shape, np.float32) for v in variables]
    for (images, labels), learning_rate in zip(batches, learning_rates):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            cross_entropy = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            )
            loss = cross_entropy + tf.add_n(model.losses)
        gradients = tape.gradient(loss, variables)
        for variable, gradient, accumulator in zip(variables, gradients, accumulators):
            accumulator *= momentum
            accumulator += gradient.numpy()
            variable.assign(variable.numpy() - learning_rate * accumulator)


def closed_form_params(config: presets.ResNetConfig) -> tuple[int, int]:
    """(trainable, non-trainable) counts from the papers' description."""
    conv_weights = 0
    bn_channels = []  # One entry per BatchNorm: its channel count.
    conv_weights += config.init_filter**2 * 3 * config.stem_filters
    bn_channels.append(config.stem_filters)
    channels = config.stem_filters
    first_unit = True
    for units, width, stride in zip(config.units, config.widths, config.strides):
        for unit in range(units):
            out = width * (4 if config.block == "bottleneck" else 1)
            if config.block == "basic":
                convs = [(3, channels, width), (3, width, out)]
            else:
                convs = [(1, channels, width), (3, width, width), (1, width, out)]
            conv_weights += sum(k * k * cin * cout for k, cin, cout in convs)
            if config.version == "v1":
                bn_channels += [cout for _, _, cout in convs]  # BN after each conv.
            else:
                before = [cin for _, cin, _ in convs]  # BN before each conv...
                bn_channels += before[1:] if first_unit else before  # ...but the first.
            unit_stride = stride if unit == 0 else 1
            if (unit_stride != 1 or channels != out) and config.shortcut == "projection":
                conv_weights += channels * out
                if config.version == "v1":
                    bn_channels.append(out)
            channels = out
            first_unit = False
    if config.version == "v2":
        bn_channels.append(channels)
    dense = channels * config.num_classes + config.num_classes
    # BN: gamma and beta are trained, moving mean and variance are not.
    return conv_weights + 2 * sum(bn_channels) + dense, 2 * sum(bn_channels)


def closed_form_macs(config: presets.ResNetConfig, size: int) -> int:
    """Conv and dense multiply-accumulates, with TF "same" padding."""

    def out_size(size, stride):
        return -(-size // stride)  # ceil

    size = out_size(size, config.init_stride)
    macs = size * size * config.init_filter**2 * 3 * config.stem_filters
    if config.init_max_pool:
        size = out_size(size, 2)
    channels = config.stem_filters
    for units, width, stride in zip(config.units, config.widths, config.strides):
        for unit in range(units):
            unit_stride = stride if unit == 0 else 1
            out = width * (4 if config.block == "bottleneck" else 1)
            new_size = out_size(size, unit_stride)
            if config.block == "basic":
                macs += new_size**2 * 9 * (channels * width + width * out)
            else:
                first = new_size if config.stride_in_1x1 else size  # First 1x1 output.
                macs += first**2 * channels * width
                macs += new_size**2 * 9 * width * width + new_size**2 * width * out
            if (unit_stride != 1 or channels != out) and config.shortcut == "projection":
                macs += new_size**2 * channels * out
            size, channels = new_size, out
    return macs + channels * config.num_classes
