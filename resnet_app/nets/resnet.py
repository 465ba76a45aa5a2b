"""ResNet architectures, built from a stage table.

One parameterized network covers every depth of He et al. 2015 ("Deep Residual
Learning", v1, post-activation) and He et al. 2016 ("Identity Mappings", v2,
pre-activation). A preset is one line of data in `presets.PRESETS`; `create_model`
turns a preset name plus overrides into a Keras 3 model. The stage tables are in
`nets/presets.py`, the `ResNetConfig` they fill in `nets/spec.py`; the residual blocks the table
picks (basic or bottleneck, post- or pre-activation) are in `nets/blocks.py`.

Architecture only: no loss, optimizer, schedule, logging or printing lives here.
The command-line summary is `resnet-app model` (`resnet_app/tools/model_summary.py`,
with the counting in `nets/summary.py`).

Conventions:
  * NHWC everywhere. Convolutions have no bias (a BatchNorm follows or precedes).
    Strided convolutions pad "same" (TensorFlow's) or, with `padding: symmetric`,
    as torchvision and Keras applications do (see `ResNetConfig.padding`).
  * Stages are numbered from 1, units within a stage from 0, convolutions within a
    unit from 1, so layer names read `stage2_unit0_conv1`.
  * A bottleneck unit's output width is 4x its stage width (the seed's filter
    multiplication: CIFAR widths 16-32-64 give unit outputs 64-128-256).
  * BatchNorm defaults: momentum 0.9 (PyTorch's 0.1), epsilon 1e-5, per-tower
    statistics. `bn_synchronized=True` makes the statistics cross-tower.
  * Weight decay is an L2 penalty `weight_decay * sum(w**2) / 2` (TF1
    `tf.nn.l2_loss`) on conv and dense kernels only, never on BatchNorm
    parameters or biases. It is reported through `model.losses`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from resnet_app.common import migration
from resnet_app.nets import drop_path
from resnet_app.nets import stem as stem_lib
from resnet_app.nets.blocks import block_class
from resnet_app.nets.layers import LayerFactory, Shape, build_layer
from resnet_app.nets.presets import ResNetConfig, get_config


def create_model(name: str, **overrides: Any) -> ResNet:
    """Creates preset `name`, e.g. `create_model("resnet50", num_classes=10)`.

    Args:
      name: a preset from `presets.model_names()`.
      **overrides: any `ResNetConfig` field.

    Returns:
      An unbuilt model: its variables are created by the first call, or by
      `model.build((None, height, width, 3))`.

    Raises:
      ConfigError: for an unknown preset, field or bad value.
    """
    return ResNet(get_config(name, **overrides), name=name)


@keras.saving.register_keras_serializable(package="resnet_app")
class ResNet(keras.Model):
    """A ResNet: stem, stages of residual blocks, global average pool, logits.

    Call as `model(images, training=...)` for logits (no softmax), or with
    `return_hidden=True` for `(logits, hidden)`. In training with
    `drop_path_rate`, `drop_keys` (uint64 [batch], `drop_path.example_keys`)
    give stochastic depth its per-example draws. `hidden` holds the stem output,
    then the output of every stage; its last element is the feature map that
    is pooled (for v2, after the final BN-ReLU), so it has len(units) + 1
    entries.
    """

    def __init__(self, config: ResNetConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        make = LayerFactory(config)
        # The stem's layers are the network's own attributes (`nets/stem.py`),
        # as they were before the stem had kinds: checkpoints keep their keys.
        self.stem_pool = self.stem_pool_conv = self.stem_pool_bn = None
        for attribute, layer in stem_lib.make_layers(config).items():
            setattr(self, attribute, layer)
        # Names, not layers: a list of layers would be tracked as a second path
        # to them, and checkpoints key each variable by its first path.
        self.stem_names = tuple(stem_lib.conv_names(config))

        # Units are attributes named stage2_unit0, ... (checkpoints follow
        # attributes, not lists); `stage_names` keeps the table's order.
        block = block_class(config)
        rates = iter(drop_path.block_rates(config.drop_path_rate, sum(config.units)))
        stage_names = []
        in_channels = config.stem_filters
        index = 0
        for stage, (units, width, stride) in enumerate(
            zip(config.units, config.widths, config.strides), start=1
        ):
            names = []
            for unit in range(units):
                name = f"stage{stage}_unit{unit}"
                layer = block(
                    config,
                    in_channels=in_channels,
                    width=width,
                    stride=stride if unit == 0 else 1,
                    first_in_network=stage == 1 and unit == 0,
                    first_in_stage=unit == 0,
                    drop_rate=next(rates),
                    block_index=index,
                    name=name,
                )
                index += 1
                setattr(self, name, layer)
                names.append(name)
                in_channels = width * config.expansion
            stage_names.append(tuple(names))
        self.stage_names = tuple(stage_names)

        self.final_bn = make.batch_norm("final_bn") if config.version == "v2" else None
        if config.head_pool == "max":  # ResNet-9's.
            self.pool = keras.layers.GlobalMaxPooling2D(name="pool")
        else:
            self.pool = keras.layers.GlobalAveragePooling2D(name="pool")
        # Logits stay float32 under a mixed-precision policy.
        self.logits = make.dense(config.num_classes, "logits", bias=config.head_bias)

    @property
    def uses_example_keys(self) -> bool:
        """Training draws per example (stochastic depth, dropout): the step passes `drop_keys`."""
        return bool(self.config.drop_path_rate or self.config.dropout)

    @property
    def stem_pairs(self) -> list[tuple[keras.layers.Layer, keras.layers.Layer]]:
        """The stem's (conv, BatchNorm) pairs, input to output."""
        return [(getattr(self, conv), getattr(self, norm)) for conv, norm in self.stem_names]

    @property
    def stem_layers(self) -> list[keras.layers.Layer]:
        """The stem's layers with weights, input to output."""
        layers = [layer for pair in self.stem_pairs for layer in pair]
        if self.stem_pool_conv is not None:
            layers += [self.stem_pool_conv, self.stem_pool_bn]
        return layers

    @property
    def stages(self) -> list[list[keras.layers.Layer]]:
        """The residual blocks, stage by stage."""
        return [[getattr(self, name) for name in names] for names in self.stage_names]

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "config": dataclasses.asdict(self.config)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ResNet:
        fields = migration.model_fields(config["config"])  # Saved before a rename, too.
        return cls(ResNetConfig(**fields), name=config["name"])

    def build(self, input_shape: Shape) -> None:
        # Shapes are walked through the table instead of traced: a symbolic
        # call builds ResNet-1202 in about 27 s, this in about 10 s.
        shape = input_shape
        for conv, norm in self.stem_pairs:
            shape = build_layer(conv, shape)
            build_layer(norm, shape)
        if self.stem_pool_conv is not None:
            shape = build_layer(self.stem_pool_conv, shape)
            build_layer(self.stem_pool_bn, shape)
        elif self.stem_pool is not None:
            shape = self.stem_pool.compute_output_shape(shape)
        for stage_units in self.stages:
            for unit in stage_units:
                shape = build_layer(unit, shape)
        if self.final_bn is not None:
            build_layer(self.final_bn, shape)
        build_layer(self.logits, self.pool.compute_output_shape(shape))

    def call(self, inputs, training=None, return_hidden=False, drop_keys=None):
        outputs = stem_lib.call(self, inputs, training)
        hidden = [outputs]
        # Stochastic depth's per-example keys (`nets/drop_path.py`), from the
        # training step; without them (evaluation, serving) no branch drops.
        extra = {"keys": drop_keys} if drop_keys is not None else {}
        for stage_units in self.stages:
            for unit in stage_units:
                outputs = unit(outputs, training=training, **extra)
            hidden.append(outputs)
        if self.final_bn is not None:
            outputs = keras.ops.relu(self.final_bn(outputs, training=training))
            hidden[-1] = outputs
        logits = self.logits(self.pool(outputs))
        if self.config.logit_scale != 1:
            logits = logits * self.config.logit_scale
        if return_hidden:
            return logits, hidden
        return logits

    def features(self, inputs, training=None):
        """The globally pooled activations that the logits layer reads: [batch, width]."""
        _, hidden = self(inputs, training=training, return_hidden=True)
        return self.pool(hidden[-1])
