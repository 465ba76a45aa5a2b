"""`python -m resnet_app.export`: a run's checkpoint as a SavedModel, TFLite and ONNX files.

    python -m resnet_app.export --model_dir=runs/cifar10 --export_dir=exported/cifar10/1
    python -m resnet_app.export --model_dir=runs/try --checkpoint=ckpt-4000 --export_dir=out
    python -m resnet_app.export --model_dir=runs/try --export_dir=out --format=tflite,onnx \
        --quantize=none,float16,dynamic,int8

Besides the SavedModel, `--format=tflite` writes one `.tflite` file per
`--quantize` and `--format=onnx` a `model.onnx` (requirements-export.txt);
both take uint8 images of one fixed size and return probabilities
(`model_info.json`). `--format=timm` and `--format=torchvision` write the
network as that library's safetensors state dict (`torch_weights.py`). Each
format is checked against the SavedModel on the run's evaluation split
(`--eval_examples=N` of it): top-1, agreement, largest probability difference,
size and latency, in `export_report.json`. The run's fitted temperature applies
to every format; `--tta=flip` averages each image with its mirror image.

The SavedModel holds the network, the run's evaluation preprocessing and its
class names, with signatures `serving_default` (uint8 images of any size),
`serving_bytes` (encoded image files) and `features`, and needs nothing from
resnet_app:

    import tensorflow as tf
    classify = tf.saved_model.load("out").signatures["serving_default"]
    classify(images=uint8_batch)["top_k_names"]

`assets.extra/` holds `labels.txt` and `export_info.json`. The export is
written beside its destination and renamed into place; an existing export is
replaced only with `--overwrite`, and nothing else ever is. On success one
JSON line goes to stdout; a mistake gets one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys

from absl import flags

from resnet_app.common import cli
from resnet_app.common.errors import ConfigError, first_line

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "The run directory written by `python -m resnet_app.train`."
)
_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "Where to write the SavedModel (for TF Serving, a version folder: out/1)."
)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    "latest",
    "Which checkpoint: latest (the newest readable one), best (the best evaluation, kept in "
    "MODEL_DIR/best/ by train.keep_best), averaged (resnet-app average's), ckpt-N or N.",
)
_TOP_K = flags.DEFINE_integer("top_k", 5, "Classes in the top-k outputs (at most the classes).")
_OVERWRITE = flags.DEFINE_boolean("overwrite", False, "Replace an existing export.")
_FORMAT = flags.DEFINE_list(
    "format",
    ["saved_model"],
    "Formats: saved_model (always written), tflite, onnx, timm, torchvision (PyTorch state "
    "dicts in that library's names; see docs/export.md); comma-separated.",
)
_QUANTIZE = flags.DEFINE_list(
    "quantize",
    ["none"],
    "TFLite variants, comma-separated: none (float32), float16, dynamic (int8 weights), "
    "int8 (weights and activations, calibrated on training images).",
)
_CALIBRATION_IMAGES = flags.DEFINE_integer(
    "calibration_images", 200, "Training images that calibrate --quantize=int8."
)
_EVAL_EXAMPLES = flags.DEFINE_integer(
    "eval_examples", None, "Evaluation images of the parity report (default: the whole split)."
)
_TTA = flags.DEFINE_string(
    "tta",
    "none",
    "Test-time augmentation in every format: none, or flip (each image and its mirror "
    "image, probabilities averaged: twice the latency).",
)

_WEIGHTS = cli.define_weights_flag()


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if not _EXPORT_DIR.value:
        raise ConfigError("--export_dir is not set; name the directory to write the SavedModel to")
    from resnet_app import config
    from resnet_app.export import deploy

    formats, quantizations = tuple(_FORMAT.value), tuple(_QUANTIZE.value)
    request = deploy.Request(
        formats, quantizations, _CALIBRATION_IMAGES.value, _EVAL_EXAMPLES.value
    )
    deploy.check_request(request, _TTA.value)
    # A wrong directory is named before TF loads.
    run_config = config.read_run_config(_MODEL_DIR.value)
    import tensorflow as tf

    from resnet_app.export import savedmodel

    # Before any work: nothing in the way is ever replaced but an old export.
    savedmodel.check_destination(_EXPORT_DIR.value, _OVERWRITE.value, _MODEL_DIR.value)
    served, source = savedmodel.load(
        _MODEL_DIR.value, _CHECKPOINT.value, _TOP_K.value, tta=_TTA.value, weights=_WEIGHTS.value
    )
    report = {}

    def more(staged: str) -> None:
        report.update(deploy.write_formats(staged, served, source, run_config, request))

    try:
        export_dir = savedmodel.save(served, source, _EXPORT_DIR.value, _OVERWRITE.value, more=more)
    except (OSError, tf.errors.OpError) as error:
        reason = getattr(error, "strerror", None) or first_line(error)
        raise ConfigError(
            f"--export_dir={_EXPORT_DIR.value}: writing the export failed ({reason}); "
            f"nothing was replaced"
        ) from None
    record = {
        "export_dir": export_dir,
        **source,
        "signatures": list(savedmodel.SIGNATURES),
        "formats": report.get("formats", []),
    }
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    cli.run(main)
