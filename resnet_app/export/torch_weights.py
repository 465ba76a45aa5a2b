"""A run's network as a PyTorch state dict in timm's or torchvision's own names and layouts.

The exact inverse of `pretrained/torch_files.py`: each layer's state-dict name
is the one the model declares (`parts.source_names(model, TORCH)`); HWIO
kernels become OIHW, a dense [in, out] matrix [out, in] (timm's SE layers are
1x1 convolutions: [out, in, 1, 1]), ECA's [k, 1, 1] kernel a Conv1d's
[1, 1, k]; each BatchNorm gets its `num_batches_tracked`. Only a network the
library builds the same way is exported: its preset under the library's
name, with torchvision's padding and strides (`sources.TORCHVISION_FIELDS`).
The file's metadata holds what `Runner` needs to read it back (the parity
check) and what to pass to `timm.create_model` or the torchvision constructor.
"""

from __future__ import annotations

import dataclasses
import difflib
import json

import numpy as np

from resnet_app.common.errors import ConfigError
from resnet_app.nets import blocks, parts, presets
from resnet_app.pretrained import sources, torch_files

TORCHVISION_PRESETS = (
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d",
    "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2",
)  # fmt: skip
# timm has every ImageNet v1 preset of ours, under the same name.
TIMM_PRESETS = (
    *TORCHVISION_PRESETS, "resnet200", "resnext101_32x4d", "resnext50d_32x4d", "resnet50c",
    "resnet50s", "seresnet50", "seresnet101", "seresnet152", "seresnext50_32x4d",
    "seresnext101_32x8d", "ecaresnet50d", "ecaresnet101d",
    *(f"resnet{depth}d" for depth in (18, 34, 50, 101, 152, 200)),
    *(f"resnetrs{depth}" for depth in (50, 101, 152, 200, 270, 350, 420)),
)  # fmt: skip
# Settings that change training, not the network the weights belong to.
TRAINING_ONLY = frozenset(
    {"num_classes", "weight_decay", "bn_momentum", "bn_synchronized", "zero_init_residual",
     "drop_path_rate", "dropout"}
)  # fmt: skip
METADATA_KEY = "resnet_app"


def _constructor_check(library: str, model) -> None:
    """Refuses (ConfigError) a network the library does not build as the run does."""
    name, presets_of = model.name, {"timm": TIMM_PRESETS, "torchvision": TORCHVISION_PRESETS}
    if name not in presets_of[library]:
        nearest = difflib.get_close_matches(name, presets_of[library], n=1, cutoff=0)
        raise ConfigError(
            f"{library} has no {name}; its nearest is {nearest[0]}: train that --model to "
            f"export to {library}"
        )
    expected = presets.get_config(name, **sources.TORCHVISION_FIELDS)
    for field in dataclasses.fields(expected):
        ours, theirs = getattr(model.config, field.name), getattr(expected, field.name)
        if field.name not in TRAINING_ONLY and ours != theirs:
            raise ConfigError(
                f"this {name} has model.{field.name}={ours!r} but {library}'s has {theirs!r}, "
                f"so its weights would compute another function there; train with "
                f"--set model.{field.name}={theirs} (as --init_from a {library} file does)"
            )


def _layout(key: str, value: np.ndarray) -> np.ndarray:
    """Our variable's value in the state dict's layout for tensor `key`."""
    if value.ndim == 4:  # A convolution: HWIO -> OIHW.
        return value.transpose(3, 2, 0, 1)
    if value.ndim == 3:  # ECA's Conv1d: [k, in, out] -> [out, in, k].
        return value.transpose(2, 1, 0)
    if value.ndim == 2:  # Dense [in, out] -> [out, in]; timm's SE: a 1x1 convolution.
        matrix = value.T
        return matrix[:, :, None, None] if ".se." in key else matrix
    return value


def state_dict(model) -> dict[str, np.ndarray]:
    """{state-dict name: float32 tensor} of the model, with int64 `num_batches_tracked`."""
    tensors: dict[str, np.ndarray] = {}
    layers = parts.named_layers(model)
    for ours, theirs in parts.source_names(model, blocks.TORCH).items():
        for variable in layers[ours].weights:
            key = f"{theirs}.{torch_files.STATE_DICT_KINDS[parts.short_name(variable)]}"
            value = np.asarray(variable.numpy(), np.float32)
            tensors[key] = np.ascontiguousarray(_layout(key, value))
            if parts.short_name(variable) == "moving_variance":
                tensors[f"{theirs}.num_batches_tracked"] = np.zeros((), np.int64)
    return tensors


@dataclasses.dataclass(frozen=True)
class Library:
    """An export format for one library: `convert` writes its safetensors file, `constructor`
    says how to build the network there, `Runner` reads the file back into ours."""

    name: str

    def constructor(self, classifier, info: dict) -> dict:
        """What to pass to the library's constructor, and the inputs the weights expect."""
        model, prep = classifier.model, classifier.preprocessing
        _constructor_check(self.name, model)
        found = {
            "architecture": model.name,
            "num_classes": int(model.logits.units),
            "in_chans": prep.channels,
            "input_size": [prep.channels, info["input_size"], info["input_size"]],
            "mean": [m / 255 for m in prep.mean],
            "std": [s / 255 for s in prep.std],
            "class_names": info["class_names"],
        }
        if self.name == "timm":
            found["create_model"] = {
                "model_name": model.name,
                "num_classes": found["num_classes"],
                "in_chans": prep.channels,
            }
        return found

    def convert(self, classifier, variant=None, calibration=None, info: dict | None = None):
        """The `.safetensors` bytes of the classifier's network; `info[self.name]` holds
        `constructor`'s entry (`deploy.write_formats`)."""
        from safetensors.numpy import save

        keys = ("class_names", "preprocessing", "temperature", "tta", "multi_label")
        metadata = {key: info[key] for key in keys}
        metadata["constructor"] = info[self.name]
        tensors = state_dict(classifier.model)
        return save(tensors, metadata={METADATA_KEY: json.dumps(metadata)})

    @staticmethod
    def Runner(path: str):  # noqa: N802 - the registry's name for a format's reader.
        return RoundTrip(path)


class RoundTrip:
    """Reads an exported file back into our network: `runner(uint8 images) -> probabilities`,
    as the SavedModel computes them (the export's parity check)."""

    def __init__(self, path: str):
        from safetensors import safe_open

        from resnet_app.data.run_pipeline import parse_data_info
        from resnet_app.export.portable import PortableClassifier
        from resnet_app.nets.resnet import create_model
        from resnet_app.pretrained.weights import assign

        with safe_open(path, "np") as f:
            metadata = json.loads(f.metadata()[METADATA_KEY])
        built = metadata["constructor"]
        name, classes = built["architecture"], built["num_classes"]
        model = create_model(name, num_classes=classes, **sources.TORCHVISION_FIELDS)
        size = built["input_size"]
        model.build((None, size[1], size[2], size[0]))
        assign(model, torch_files.read(path, model, name), path, name)
        _, preprocessing = parse_data_info(metadata)
        self.classifier = PortableClassifier(
            model, preprocessing, metadata["temperature"], metadata["tta"],
            multi_label=metadata["multi_label"],
        )  # fmt: skip

    def __call__(self, images: np.ndarray) -> np.ndarray:
        return self.classifier.classify(np.asarray(images, np.uint8))["probabilities"].numpy()


TIMM, TORCHVISION = Library("timm"), Library("torchvision")
