"""The export's other formats and its parity report: what `python -m resnet_app.export` adds.

`check_request` validates the request before TensorFlow loads;
`write_formats` runs inside `savedmodel.save`, on the staged export, so that
an export is all or nothing:

    EXPORT_DIR/saved_model.pb, variables/, assets.extra/   the SavedModel (always)
    EXPORT_DIR/model.tflite, model_float16.tflite, ...      one per --quantize
    EXPORT_DIR/model.onnx
    EXPORT_DIR/model_info.json    what the .tflite and .onnx files take and give
    EXPORT_DIR/export_report.json the parity report (`parity.py`)
"""

from __future__ import annotations

import dataclasses
import json
import os

from absl import logging

from resnet_app.common.errors import ConfigError
from resnet_app.data import channels as image_channels
from resnet_app.data import families
from resnet_app.export import formats

TTA_CHOICES = ("none", "flip")
MODEL_INFO, REPORT = "model_info.json", "export_report.json"


@dataclasses.dataclass(frozen=True)
class Request:
    """What to export besides the SavedModel (`formats.names()`, `formats.quantizations()`),
    the training images that calibrate int8, and the parity report's images (None: all)."""

    formats: tuple[str, ...] = ("saved_model",)
    quantizations: tuple[str, ...] = ("none",)
    calibration_images: int = 200
    eval_examples: int | None = None


def check_request(request: Request, tta: str = "none") -> None:
    """Refuses (ConfigError) unknown formats or quantizations, or a quantization without TFLite."""
    for name in request.formats:
        if name not in formats.names():
            raise ConfigError(f"--format={name}: use one of {', '.join(formats.names())}")
    for name in request.quantizations:
        if name not in formats.quantizations():
            choices = ", ".join(formats.quantizations())
            raise ConfigError(f"--quantize={name}: use one of {choices}")
    quantized = any(formats.FORMATS[n].variants for n in request.formats if n in formats.FORMATS)
    if set(request.quantizations) != {formats.NO_VARIANT} and not quantized:
        raise ConfigError("--quantize applies to TFLite files; add --format=tflite")
    if tta not in TTA_CHOICES:
        raise ConfigError(f"--tta={tta}: use one of {', '.join(TTA_CHOICES)}")
    if request.calibration_images < 1:
        raise ConfigError("--calibration_images must be 1 or more")
    if request.eval_examples is not None and request.eval_examples < 1:
        raise ConfigError("--eval_examples must be 1 or more")


def _images(run_config, model_dir: str, preprocessing, request: Request):
    """(eval images, labels, calibration images) at the portable size, or Nones without data."""
    from resnet_app.data import run_pipeline
    from resnet_app.export import portable

    try:
        pipeline = run_pipeline.create_run_pipeline(run_config, model_dir=model_dir)
        split = pipeline.eval_split()
        if split is None:  # Synthetic data: no images to compare on.
            raise ConfigError(f"{run_config.data.dataset} data has no images")
        images, labels = portable.split_images(split, preprocessing, request.eval_examples)
        calibration = None
        if "int8" in request.quantizations and pipeline.train_split is not None:
            calibration, _ = portable.split_images(
                pipeline.train_split, preprocessing, request.calibration_images
            )
        return images, labels, calibration, pipeline.eval_split_name
    except ConfigError as error:
        if "int8" in request.quantizations:
            raise ConfigError(
                f"--quantize=int8 needs the run's training split to calibrate, and its data "
                f"cannot be read ({error}); fix the data or use --quantize=dynamic"
            ) from None
        logging.warning("No parity report: the run's data cannot be read (%s)", error)
        return None, None, None, None


def write_formats(staged: str, served, source: dict, run_config, request: Request) -> dict:
    """Writes the requested formats and the parity report into the staged export; the report."""
    import tensorflow as tf

    from resnet_app.export import parity, portable

    prep = served.preprocessing
    images, labels, calibration, split = _images(run_config, source["model_dir"], prep, request)
    signature = tf.saved_model.load(staged).signatures["serving_default"]

    def saved_model(batch):
        return signature(images=tf.constant(batch))["probabilities"].numpy()

    rows, reference = [], None
    if images is not None:
        row, reference = parity.measure("saved_model", staged, saved_model, images, labels, None)
        rows.append(row)
    classifier = portable.PortableClassifier(
        served.model, prep, served.temperature, served.tta, multi_label=served.multi_label
    )
    info = _model_info(served, prep, source)
    outputs = []
    for kind in [formats.FORMATS[name] for name in request.formats if name in formats.FORMATS]:
        module = kind.load()
        if hasattr(module, "constructor"):  # How to build the network where the file goes.
            built = module.constructor(classifier, info)
            info[kind.name] = {"file": kind.file_name(None), **built}
        for variant in [v for v in request.quantizations if v in kind.variants] or [None]:
            path = os.path.join(staged, kind.file_name(variant))
            _write(path, module.convert(classifier, variant, calibration, info))
            outputs.append((kind.output_name(variant), path, module.Runner))
    for name, path, runner in outputs:
        if images is None:  # No parity: the file's size only.
            size = parity.path_size(path)
            rows.append({"format": name, "file": os.path.basename(path), "size_bytes": size})
        else:
            rows.append(parity.measure(name, path, runner(path), images, labels, reference)[0])
    if outputs:
        _write(os.path.join(staged, MODEL_INFO), json.dumps(info, indent=1).encode())
    report = {
        **source,
        "split": split,
        "num_examples": None if images is None else len(images),
        "input_size": info["input_size"],
        "formats": rows,
    }
    _write(os.path.join(staged, REPORT), json.dumps(report, indent=1).encode())
    logging.info("Parity on %s:\n  %s", split, "\n  ".join(parity.table_lines(rows)))
    return report


def _model_info(served, preprocessing, source: dict) -> dict:
    """What a .tflite or .onnx file takes and gives, for callers without resnet_app."""
    from resnet_app.export import portable

    output = "probabilities: float32 [batch, classes], in class_names order"
    if served.multi_label:
        output += f" (multi-label: each class's sigmoid; predicted from {served.threshold:g})"
    return {
        "class_names": served.class_names,
        "input": f"images: uint8 [batch, input_size, input_size, {preprocessing.channels}], "
        + image_channels.name(preprocessing.channels),
        "channels": preprocessing.channels,
        "output": output,
        "multi_label": served.multi_label,
        "threshold": served.threshold if served.multi_label else None,
        "input_size": portable.input_size(preprocessing),
        "preprocessing": dataclasses.asdict(preprocessing),
        "resize": families.of(preprocessing).resize_text,
        "temperature": served.temperature,
        "tta": served.tta,
        "source": {key: source[key] for key in ("model", "dataset", "checkpoint", "step")},
    }


def _write(path: str, content: bytes) -> None:
    with open(path, "wb") as file:
        file.write(content)
