"""`python -m resnet_app.predict`: the top classes of image files.

    python -m resnet_app.predict --export_dir=exported/cifar10/1 cat.jpg dog.png
    python -m resnet_app.predict --model_dir=runs/cifar10 --top_k=3 --json photos/

An export of `python -m resnet_app.export`, or a run's checkpoint, with the run's
evaluation preprocessing. A directory stands for the images under it. Each image
gets one line ("cat.jpg: cat 0.9123, dog 0.0520, ...") or, with `--json`, one
object; an unreadable one gets an `error:` line on stderr, and status 1.
"""

from __future__ import annotations

import sys

from absl import flags

from resnet_app.common import checks, cli
from resnet_app.common.errors import ConfigError
from resnet_app.export import classify

_EXPORT_DIR = flags.DEFINE_string(
    "export_dir",
    None,
    "A SavedModel written by `python -m resnet_app.export`, or a .tflite or .onnx file it wrote.",
)
_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Or a run directory written by `python -m resnet_app.train`."
)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint",
    "latest",
    "With --model_dir: latest (the newest readable one), best (the best evaluation, kept by "
    "train.keep_best), averaged (resnet-app average's), ckpt-N or N.",
)
_WEIGHTS = cli.define_weights_flag()  # With --model_dir.
_TOP_K = flags.DEFINE_integer(
    "top_k", None, "Classes to show per image (default: all the model gives, usually 5)."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Images classified per call.")
_JSON = flags.DEFINE_boolean("json", False, "One JSON object per image instead of text.")
_MAX_IMAGE_PIXELS = flags.DEFINE_integer(
    "max_image_pixels",
    classify.MAX_IMAGE_PIXELS,
    "Refuse image files whose header gives more pixels than this (a guard against "
    "decompression bombs: a small file that decodes to gigabytes).",
)


def _unreadable_folder(error: OSError) -> None:
    classify.write_line(
        sys.stderr, f"error: {error.filename}: {error.strerror}; its images are skipped"
    )


def main(argv: list[str]) -> None:
    if not argv[1:]:
        raise ConfigError("no images given; name the image files after the flags")
    checks.at_least("--batch_size", _BATCH_SIZE.value)
    checks.at_least("--top_k", _TOP_K.value)
    checks.at_least("--max_image_pixels", _MAX_IMAGE_PIXELS.value)
    paths = classify.expand(argv[1:], on_unreadable=_unreadable_folder)
    classifier = classify.load_classifier(
        _EXPORT_DIR.value, _MODEL_DIR.value, _CHECKPOINT.value, _TOP_K.value, _WEIGHTS.value
    )
    batches = classify.classify_files(
        classifier, paths, _BATCH_SIZE.value, max_pixels=_MAX_IMAGE_PIXELS.value
    )
    if classify.write_results(batches, _TOP_K.value, _JSON.value):
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
