"""The ResNet network: stem, stages of residual units, pooled logits, from a `ResNetConfig`.

Every depth of He et al. 2015 (v1, post-activation) and 2016 (v2,
pre-activation) and their variants; presets are `nets/presets.py`. NHWC,
bias-free convolutions; layer names read `stage2_unit0_conv1` (stages from 1,
units from 0, convolutions from 1). Weight decay is the L2 penalty
`weight_decay * sum(w**2) / 2` (TF1's `tf.nn.l2_loss`) on kernels only,
reported through `model.losses`.
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
    """Preset `name` with `ResNetConfig` fields `overrides`, unbuilt, e.g.
    `create_model("resnet50", num_classes=10)` (ConfigError for a bad one)."""
    return ResNet(get_config(name, **overrides), name=name)


@keras.saving.register_keras_serializable(package="resnet_app")
class ResNet(keras.Model):
    """A ResNet: stem, stages of residual blocks, global pool, logits.

    `model(images, training=...)` gives logits, with `return_hidden=True`
    `(logits, hidden)`: the stem's output, then each stage's (the last as
    pooled, after v2's final BN-ReLU). In training, `drop_keys` (uint64
    [batch], `drop_path.example_keys`) key stochastic depth and dropout.
    """

    def __init__(self, config: ResNetConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        make = LayerFactory(config)
        # The stem's layers are the network's own attributes (`nets/stem.py`).
        self.stem_pool = self.stem_pool_conv = self.stem_pool_bn = None
        for attribute, layer in stem_lib.make_layers(config).items():
            setattr(self, attribute, layer)
        # Names, not layers: a list of layers would be tracked as a second path
        # to them, and checkpoints key each variable by its first path.
        self.stem_names = tuple(stem_lib.conv_names(config))
        if config.replace_stem_pool:  # ResNet-RS's strided conv, in place of the max-pool.
            self.stem_names += (("stem_pool_conv", "stem_pool_bn"),)

        # Units are attributes named stage2_unit0, ... (checkpoints follow
        # attributes, not lists); `stage_names` keeps the table's order.
        block = block_class(config)
        rates = drop_path.block_rates(config.drop_path_rate, sum(config.units))
        self.stage_names = tuple(
            tuple(f"stage{stage}_unit{unit}" for unit in range(units))
            for stage, units in enumerate(config.units, start=1)
        )
        in_channels = config.stem_filters
        index = 0
        for stage, (names, width, stride) in enumerate(
            zip(self.stage_names, config.widths, config.strides), start=1
        ):
            for unit, name in enumerate(names):
                layer = block(
                    config,
                    in_channels=in_channels,
                    width=width,
                    stride=stride if unit == 0 else 1,
                    first_in_network=stage == 1 and unit == 0,
                    first_in_stage=unit == 0,
                    drop_rate=rates[index],
                    block_index=index,
                    name=name,
                )
                setattr(self, name, layer)
                index += 1
                in_channels = width * config.expansion

        self.final_bn = make.batch_norm("final_bn") if config.version == "v2" else None
        pools = {"avg": keras.layers.GlobalAveragePooling2D, "max": keras.layers.GlobalMaxPooling2D}
        self.pool = pools[config.head_pool](name="pool")  # ResNet-9's is "max".
        # Logits stay float32 under a mixed-precision policy.
        self.logits = make.dense(config.num_classes, "logits", bias=config.head_bias)

    @property
    def uses_example_keys(self) -> bool:
        """Training draws per example (stochastic depth, dropout): the step passes `drop_keys`."""
        return bool(self.config.drop_path_rate or self.config.dropout)

    @property
    def stem_pairs(self) -> list[tuple[keras.layers.Layer, keras.layers.Layer]]:
        """The stem's (conv, BatchNorm) pairs, input to output (`replace_stem_pool`'s last)."""
        return [(getattr(self, conv), getattr(self, norm)) for conv, norm in self.stem_names]

    @property
    def stem_layers(self) -> list[keras.layers.Layer]:
        """The stem's layers with weights, input to output."""
        return [layer for pair in self.stem_pairs for layer in pair]

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
        # Shapes are walked through the table: faster than a symbolic call.
        shape = input_shape
        for conv, norm in self.stem_pairs:
            shape = build_layer(conv, shape)
            build_layer(norm, shape)
        if self.stem_pool is not None:
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
        # Without the step's keys (evaluation, serving) nothing is dropped.
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
