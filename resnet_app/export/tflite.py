"""TFLite (LiteRT) files of a run's classifier: float32, float16, dynamic-range and full int8.

`convert` writes a `portable.PortableClassifier` with one signature,
`serving_default`: uint8 `images` -> float32 `probabilities`. Quantizations
are TFLite's post-training ones: `float16` weights, `dynamic` (int8 weights),
`int8` (weights and activations, calibrated on training images; uint8 in,
float32 out). A converted Keras 3 model can silently lose its weights (NaN
outputs): `convert` refuses such a file. `Runner` runs a file with
`ai-edge-litert` (requirements-export.txt), or TensorFlow's interpreter.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from absl import logging

from resnet_app.common.errors import ConfigError, first_line


def convert(
    classifier,
    quantize: str = "none",
    representative: np.ndarray | None = None,
    info: dict | None = None,
) -> bytes:
    """The `.tflite` bytes of a `PortableClassifier` (`info`, model_info.json's, is not stored).

    Raises:
      ConfigError: for int8 without `representative` images, or a conversion
        that fails or loses the weights.
    """
    function = classifier.classify.get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], classifier)
    if quantize != "none":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if quantize == "float16":
        converter.target_spec.supported_types = [tf.float16]
    if quantize == "int8":
        if representative is None or not len(representative):
            raise ConfigError(
                "--quantize=int8 needs calibration images from the run's training split, and "
                "the run's dataset has none here; check --data_dir or use --quantize=dynamic"
            )
        converter.representative_dataset = lambda: ([image[None]] for image in representative)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    try:
        content = bytes(converter.convert())
    except Exception as error:  # noqa: BLE001 - the converter raises many kinds.
        raise ConfigError(f"TFLite conversion ({quantize}) failed: {first_line(error)}") from None
    _check_weights(content)
    return content


def _check_weights(content: bytes) -> None:
    """Refuses a file whose weights stayed variables (the converter could not freeze them)."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(content))
    if flatbuffer_utils.count_resource_variables(model):
        raise ConfigError(
            "TFLite conversion kept the weights as variables (the file would compute NaN); "
            "this is a bug in resnet_app's export, please report it"
        )


def _interpreter(path: str):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        logging.info("ai-edge-litert is not installed: running %s with tf.lite", path)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tf.lite.Interpreter's deprecation notice.
            return tf.lite.Interpreter(model_path=path)
    return Interpreter(model_path=path)


class Runner:
    """Runs a `.tflite` file written by `convert`: `runner(uint8 images) -> probabilities`."""

    def __init__(self, path: str):
        try:
            self.interpreter = _interpreter(path)
            self.signature = self.interpreter.get_signature_runner("serving_default")
        except (ValueError, RuntimeError) as error:
            raise ConfigError(
                f"{path} is not a TFLite file of this app ({first_line(error)})"
            ) from None
        details = self.interpreter.get_signature_list()["serving_default"]
        if details["inputs"] != ["images"] or "probabilities" not in details["outputs"]:
            raise ConfigError(f"{path} has no images -> probabilities signature; export it again")

    def __call__(self, images: np.ndarray) -> np.ndarray:
        return np.asarray(self.signature(images=np.asarray(images, np.uint8))["probabilities"])
