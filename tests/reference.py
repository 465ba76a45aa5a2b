"""Independent references for the tests: training steps written out by hand (without step.py
or optim.py), and closed-form parameter and MAC counts from the papers (He et al. 2015, 2016),
not from model.py, so that a mistake in the builder is not copied.

The kinds' formulas are tables by kind name, not read from `nets/kinds.py` (a kind's own facts
cannot check themselves); a test of a new kind adds its closed form with `monkeypatch.setitem`.
"""

import numpy as np
import tensorflow as tf

from resnet_app.nets import presets


def momentum_steps(model, batches, learning_rates, momentum: float) -> None:
    """Trains `model` in place, one step per (images, labels) batch, on one device: the mean
    cross-entropy plus the model's regularization losses, and TF1's momentum rule
    (a = m*a + g; w -= lr*a), plain SGD when momentum is 0."""
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


def _plain_stem(config: presets.ResNetConfig) -> list[tuple[int, int, int, int]]:
    """One convolution (He et al. 2015)."""
    return [(config.stem_kernel, 3, config.stem_filters, config.init_stride)]


def _deep_stem(config: presets.ResNetConfig) -> list[tuple[int, int, int, int]]:
    """Three 3x3 (He et al. 2019's ResNet-C, widths w/2, w/2, w unless given)."""
    first, second = config.stem_widths or (config.stem_filters // 2,) * 2
    return [
        (3, 3, first, config.init_stride),
        (3, first, second, 1),
        (3, second, config.stem_filters, 1),
    ]


STEM_CONVS = {"plain": _plain_stem, "deep": _deep_stem}


def _stem_convs(config: presets.ResNetConfig) -> list[tuple[int, int, int, int]]:
    """(kernel, in, out, stride) of the stem's convolutions, and the 3x3/2 conv that
    replaces the max-pool (Bello et al. 2021)."""
    convs = list(_formula(STEM_CONVS, config.stem, "STEM_CONVS")(config))
    if config.replace_stem_pool:
        convs.append((3, config.stem_filters, config.stem_filters, 2))
    return convs


def _se_width(config: presets.ResNetConfig, channels: int) -> int:
    return max(8, int(channels * config.se_ratio + 4) // 8 * 8)


def _eca_kernel(channels: int) -> int:
    t = int((np.log2(channels) + 1) / 2)
    return max(t if t % 2 else t + 1, 3)


# Parameters of an attention kind on a branch of C channels. SE (Hu et al.
# 2018): two biased 1x1 convs through C * ratio rounded to a multiple of 8;
# ECA (Wang et al. 2020): one bias-free 1-D conv of k = odd(int((log2 C + 1) / 2)), >= 3.
ATTENTION_PARAMS = {
    "none": lambda config, c: 0,
    "se": lambda config, c: 2 * c * _se_width(config, c) + _se_width(config, c) + c,
    "eca": lambda config, c: _eca_kernel(c),
}
# Their multiply-accumulates: SE's two matrix products on the pooled vector,
# ECA's k-tap filter at every channel.
ATTENTION_MACS = {
    "none": lambda config, c: 0,
    "se": lambda config, c: 2 * c * _se_width(config, c),
    "eca": lambda config, c: c * _eca_kernel(c),
}


def _basic(config, channels: int, width: int) -> list[tuple[int, int, int, int]]:
    return [(3, channels, width, 1), (3, width, width, 1)]


def _bottleneck(config, channels: int, width: int) -> list[tuple[int, int, int, int]]:
    # Xie et al. 2017 / torchvision: the 3x3 conv has `groups` groups of
    # width * base_width / 64 channels; the output is 4x the stage width.
    inner = width * config.base_width // 64 * config.groups
    return [(1, channels, inner, 1), (3, inner, inner, config.groups), (1, inner, 4 * width, 1)]


def _conv_pool(config, channels: int, width: int) -> list[tuple[int, int, int, int]]:
    # Page 2018: a stage's conv-pool is its unit with another input width;
    # each residual is two 3x3 convs of the stage width.
    return [(3, channels, width, 1)] if channels != width else [(3, width, width, 1)] * 2


# (kernel, in, out, groups) of a unit's branch convolutions, by block kind.
UNIT_CONVS = {"basic": _basic, "bottleneck": _bottleneck, "conv_pool": _conv_pool}


def _formula(table: dict, kind: str, name: str):
    if kind not in table:
        raise KeyError(f"tests/reference.py has no closed form for {kind!r}: add it to {name}")
    return table[kind]


def _attention_params(config: presets.ResNetConfig, channels: int) -> int:
    return _formula(ATTENTION_PARAMS, config.attention, "ATTENTION_PARAMS")(config, channels)


def _unit_convs(config, channels: int, width: int) -> list[tuple[int, int, int, int]]:
    """(kernel, in, out, groups) of a unit's branch convolutions."""
    return _formula(UNIT_CONVS, config.block, "UNIT_CONVS")(config, channels, width)


def closed_form_params(config: presets.ResNetConfig) -> tuple[int, int]:
    """(trainable, non-trainable) counts from the papers' description."""
    conv_weights = 0
    bn_channels = []  # One entry per BatchNorm: its channel count.
    for kernel, cin, cout, _ in _stem_convs(config):
        conv_weights += kernel**2 * cin * cout
        bn_channels.append(cout)
    channels = config.stem_filters
    first_unit = True
    attention = 0
    for units, width, stride in zip(config.units, config.widths, config.strides):
        for unit in range(units):
            convs = _unit_convs(config, channels, width)
            out = convs[-1][2]
            conv_weights += sum(k * k * cin // groups * cout for k, cin, cout, groups in convs)
            if config.version == "v1":
                bn_channels += [cout for _, _, cout, _ in convs]  # BN after each conv.
            else:
                before = [cin for _, cin, _, _ in convs]  # BN before each conv...
                bn_channels += before[1:] if first_unit else before  # ...but the first.
            attention += _attention_params(config, out)
            unit_stride = stride if unit == 0 else 1
            shortcut = config.shortcut != "pad" and config.block != "conv_pool"
            if (unit_stride != 1 or channels != out) and shortcut:
                conv_weights += channels * out
                if config.version == "v1":
                    bn_channels.append(out)
            channels = out
            first_unit = False
    if config.version == "v2":
        bn_channels.append(channels)
    dense = channels * config.num_classes + (config.num_classes if config.head_bias else 0)
    # BN: gamma and beta are trained, moving mean and variance are not.
    trainable = conv_weights + attention + 2 * sum(bn_channels) + dense
    return trainable, 2 * sum(bn_channels)


def closed_form_macs(config: presets.ResNetConfig, size: int) -> int:
    """Conv and dense multiply-accumulates, with TF "same" padding."""

    def out_size(size, stride):
        return -(-size // stride)  # ceil

    macs = 0
    for kernel, cin, cout, stride in _stem_convs(config):
        size = out_size(size, stride)
        macs += size * size * kernel**2 * cin * cout
    if config.init_max_pool and not config.replace_stem_pool:
        size = out_size(size, 2)
    channels = config.stem_filters
    for units, width, stride in zip(config.units, config.widths, config.strides):
        for unit in range(units):
            unit_stride = stride if unit == 0 else 1
            convs = _unit_convs(config, channels, width)
            out = convs[-1][2]
            new_size = out_size(size, unit_stride)
            if config.block == "conv_pool":  # Convs at stride 1; the conv-pool pools after.
                macs += size**2 * sum(9 * cin * cout for _, cin, cout, _ in convs)
                size, channels = (size // unit_stride if unit == 0 else size), out
                continue
            # Every conv at the unit's output size, but a bottleneck's first
            # 1x1 when the stride sits on its 3x3.
            sizes = [new_size] * len(convs)
            if config.block == "bottleneck" and not config.stride_in_1x1:
                sizes[0] = size
            for conv_size, (k, cin, cout, groups) in zip(sizes, convs):
                macs += conv_size**2 * k * k * cin // groups * cout
            macs += _formula(ATTENTION_MACS, config.attention, "ATTENTION_MACS")(config, out)
            if (unit_stride != 1 or channels != out) and config.shortcut != "pad":
                macs += new_size**2 * channels * out
            size, channels = new_size, out
    return macs + channels * config.num_classes
