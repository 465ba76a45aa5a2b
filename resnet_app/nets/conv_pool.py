"""The unit of Page 2018's ResNet-9 (`block: conv_pool`), the DAWNBench CIFAR-10 network.

A stage's first unit is conv 3x3, BN, ReLU and a max-pool of the stage's
stride; every later one a residual x + ReLU(BN(conv(ReLU(BN(conv(x)))))).
"""

from __future__ import annotations

import keras

from resnet_app.common.errors import ConfigError
from resnet_app.nets.blocks import Unit
from resnet_app.nets.layers import LayerFactory, Shape, build_layer


class ConvPoolUnit(Unit):
    """One unit of a conv-pool stage: the conv-pool (first in its stage) or a residual."""

    def make_layers(self, config, width, first_in_network, first_in_stage) -> None:
        self.out_channels = width
        self.residual = not first_in_stage
        if self.residual and self.in_channels != width:
            raise ConfigError(f"{self.name}: a residual unit keeps its {self.in_channels} channels")
        make, name = LayerFactory(config), self.name
        self.num_convs = 2 if self.residual else 1
        for number in range(1, self.num_convs + 1):
            setattr(self, f"conv{number}", make.conv(width, 3, 1, f"{name}_conv{number}"))
        for number in range(1, self.num_convs + 1):
            setattr(self, f"bn{number}", make.batch_norm(f"{name}_bn{number}"))
        self.pool = None
        if not self.residual and self.stride > 1:
            self.pool = keras.layers.MaxPooling2D(self.stride, self.stride, name=f"{name}_pool")

    def build(self, input_shape: Shape) -> None:
        shape = input_shape
        for conv, norm in zip(self.convs, self.norms):
            shape = build_layer(conv, shape)
            build_layer(norm, shape)

    def call(self, inputs, training=None, keys=None):
        if self.pool is not None:
            # ReLU(max-pool(x)) is max-pool(ReLU(x)), value and gradient (ReLU is
            # monotone); pooled first, the ReLU touches a quarter of the pixels.
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
