"""The registry of export formats besides the SavedModel: {name: Format}.

A format is one module and one line here. Its module (imported only when
used: converters are optional dependencies) provides

    convert(classifier, variant, calibration, info) -> bytes
        a `portable.PortableClassifier`'s file; `variant` a --quantize value
        (None without variants), `calibration` uint8 training images or None,
        `info` what model_info.json says about the file;
    Runner(path)(images) -> probabilities, on uint8 images of the file's size;
    constructor(classifier, info), optionally: how to build the file's network
    elsewhere (timm, torchvision), put in `info[name]` before `convert` runs.

`module` may name an object in the module: "package.module:NAME".
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from types import ModuleType

SAVED_MODEL = "saved_model"  # Always written; not in the registry.
NO_VARIANT = "none"


@dataclasses.dataclass(frozen=True)
class Format:
    """An export format: its --format name, file suffix, module, and the --quantize
    values it is written in (a file each; () for one file)."""

    name: str
    suffix: str
    module: str
    variants: tuple[str, ...] = ()

    def file_name(self, variant: str | None) -> str:
        """model.tflite, model_float16.tflite, model.onnx, ..."""
        tail = "" if variant in (None, NO_VARIANT) else f"_{variant}"
        return f"model{tail}{self.suffix}"

    def output_name(self, variant: str | None) -> str:
        """The file's name in the parity report: tflite_none, tflite_int8, onnx, ..."""
        return self.name if variant is None else f"{self.name}_{variant}"

    def load(self) -> ModuleType:
        """The format's module or object (its converter's dependencies load with it)."""
        module, _, name = self.module.partition(":")
        loaded = importlib.import_module(module)
        return getattr(loaded, name) if name else loaded


FORMATS = {
    "tflite": Format(
        "tflite", ".tflite", "resnet_app.export.tflite", (NO_VARIANT, "float16", "dynamic", "int8")
    ),
    "onnx": Format("onnx", ".onnx", "resnet_app.export.onnx_export"),
    # PyTorch state dicts (safetensors) in each library's names: `torch_weights.py`.
    "timm": Format("timm", "_timm.safetensors", "resnet_app.export.torch_weights:TIMM"),
    "torchvision": Format(
        "torchvision", "_torchvision.safetensors", "resnet_app.export.torch_weights:TORCHVISION"
    ),
}


def names() -> tuple[str, ...]:
    """Every --format value, the SavedModel first."""
    return (SAVED_MODEL, *FORMATS)


def quantizations() -> tuple[str, ...]:
    """Every --quantize value, of the formats that have variants."""
    return tuple(dict.fromkeys(v for f in FORMATS.values() for v in f.variants))


def by_suffix(path: str) -> Format | None:
    """The format of a file by its extension, or None (a SavedModel directory)."""
    extension = os.path.splitext(path)[1].lower()
    return next((f for f in FORMATS.values() if f.suffix == extension), None)
