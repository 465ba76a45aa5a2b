"""The unit of Page 2018's ResNet-9 (`block: conv_pool`), the DAWNBench CIFAR-10 network.

David Page, "How to train your ResNet" (2018): CIFAR-10 to 94% in 24 epochs,
79 s on one V100. The network, as the stage table here spells it (the
`resnet9` preset):

    prep    conv 3x3, 64, BN, ReLU                            (the plain stem)
    layer1  conv 3x3, 128, BN, ReLU, max-pool 2; residual(128)   units 2
    layer2  conv 3x3, 256, BN, ReLU, max-pool 2                  units 1
    layer3  conv 3x3, 512, BN, ReLU, max-pool 2; residual(512)   units 2
    head    global max-pool, linear (no bias), times 0.125

where residual(c) is x + ReLU(BN(conv(ReLU(BN(conv(x)))))), two 3x3
convolutions of c channels. A stage's first unit is the conv-pool, every
later one a residual. Convolutions have no bias and pad "same"; the max-pool
has the stage's stride as its window and stride.
"""

from __future__ import annotations

import keras

from resnet_app.common.errors import ConfigError
from resnet_app.nets.layers import LayerFactory, Shape, build_layer
from resnet_app.nets.spec import ResNetConfig


class ConvPoolUnit(keras.layers.Layer):
    """One unit of a conv-pool stage: the conv-pool (first in its stage) or a residual.

    Takes the arguments of `blocks.ResidualBlock`; the stride is the max-pool's.
    """

    def __init__(
        self,
        config: ResNetConfig,
        in_channels: int,
        width: int,
        stride: int,
        first_in_network: bool,
        first_in_stage: bool,
        drop_rate: float = 0.0,
        block_index: int = 0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        del first_in_network, drop_rate, block_index
        self.in_channels, self.out_channels, self.stride = in_channels, width, stride
        self.residual = not first_in_stage
        if self.residual and in_channels != width:
            raise ConfigError(f"{self.name}: a residual unit keeps its {in_channels} channels")
        make, name = LayerFactory(config), self.name
        self.num_convs = 2 if self.residual else 1
        for number in range(1, self.num_convs + 1):
            setattr(self, f"conv{number}", make.conv(width, 3, 1, f"{name}_conv{number}"))
        for number in range(1, self.num_convs + 1):
            setattr(self, f"bn{number}", make.batch_norm(f"{name}_bn{number}"))
        self.pool = None
        if not self.residual and stride > 1:
            self.pool = keras.layers.MaxPooling2D(stride, stride, name=f"{name}_pool")

    @property
    def convs(self) -> list[keras.layers.Layer]:
        return [getattr(self, f"conv{number}") for number in range(1, self.num_convs + 1)]

    @property
    def norms(self) -> list[keras.layers.Layer]:
        return [getattr(self, f"bn{number}") for number in range(1, self.num_convs + 1)]

    def build(self, input_shape: Shape) -> None:
        shape = input_shape
        for conv, norm in zip(self.convs, self.norms):
            shape = build_layer(conv, shape)
            build_layer(norm, shape)

    def call(self, inputs, training=None, keys=None):
        del keys  # No per-example draws: no stochastic depth or dropout here.
        if self.pool is not None:
            # ReLU(max-pool(x)) is max-pool(ReLU(x)), value and gradient, as ReLU is
            # monotone; pooled first, the ReLU and its gradient touch a quarter of
            # the pixels (`tests/test_resnet9.py`).
            return keras.ops.relu(self.pool(self.bn1(self.conv1(inputs), training=training)))
        outputs = inputs
        for conv, norm in zip(self.convs, self.norms):
            outputs = keras.ops.relu(norm(conv(outputs), training=training))
        return inputs + outputs if self.residual else outputs

    def compute_output_shape(self, input_shape: Shape) -> Shape:
        batch, height, width, _ = input_shape
        stride = 1 if self.residual else self.stride
        spatial = [None if size is None else size // stride for size in (height, width)]
        return (batch, *spatial, self.out_channels)

    def source_names(self, layout: str, stage: int, unit: int) -> dict[str, str]:
        """No torchvision, timm or Keras applications file holds a ResNet-9."""
        raise ConfigError(
            f"{self.name}: ResNet-9 has no torchvision, timm or Keras applications weights; "
            "start it from another run's directory, or from scratch"
        )
