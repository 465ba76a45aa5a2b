"""ONNX files of a run's classifier (`images` uint8 -> `probabilities`), through tf2onnx.

The converter and onnxruntime are optional dependencies
(requirements-export.txt); without them the export refuses in one line.
"""

from __future__ import annotations

import json

import numpy as np

from resnet_app.common.errors import ConfigError, first_line

OPSET = 17
_INSTALL = "pip install -r requirements-export.txt"


def convert(classifier, variant=None, calibration=None, metadata: dict | None = None) -> bytes:
    """The `.onnx` bytes of `classifier`, with `metadata` as the model's properties.

    `variant` and `calibration`, the registry's common arguments, are unused.
    """
    try:
        import onnx
        import tf2onnx
    except ImportError as error:
        raise ConfigError(
            f"--format=onnx needs the optional converter ({error.name} is not installed); "
            f"{_INSTALL}"
        ) from None
    function = classifier.classify
    try:
        model, _ = tf2onnx.convert.from_function(
            function, input_signature=function.input_signature, opset=OPSET
        )
    except Exception as error:  # noqa: BLE001 - the converter raises many kinds.
        raise ConfigError(f"ONNX conversion failed: {first_line(error)}") from None
    names = {tensor.name for tensor in model.graph.output}
    if names != {"probabilities"}:  # tf2onnx names outputs after the function's keys.
        raise ConfigError(f"ONNX conversion gave outputs {sorted(names)}, not probabilities")
    if metadata:
        onnx.helper.set_model_props(model, {"resnet_app": json.dumps(metadata)})
    return model.SerializeToString()


class Runner:
    """Runs an `.onnx` file written by `convert`: `runner(uint8 images) -> probabilities`."""

    def __init__(self, path: str):
        try:
            import onnxruntime
        except ImportError:
            raise ConfigError(f"running {path} needs onnxruntime; {_INSTALL}") from None
        try:
            self.session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        except Exception as error:  # noqa: BLE001 - a damaged file is one line.
            raise ConfigError(f"{path} is not a readable ONNX file ({first_line(error)})") from None
        [images] = self.session.get_inputs()
        if images.name != "images":
            raise ConfigError(f"{path} takes {images.name!r}, not images; export it again")

    def __call__(self, images: np.ndarray) -> np.ndarray:
        feed = {"images": np.asarray(images, np.uint8)}
        return np.asarray(self.session.run(["probabilities"], feed)[0])
