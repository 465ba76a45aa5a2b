"""`python -m resnet_app.predict`: the top classes of image files.

    python -m resnet_app.predict --export_dir=exported/cifar10/1 cat.jpg dog.png
    python -m resnet_app.predict --model_dir=runs/cifar10 --checkpoint=ckpt-4000 photos/*.jpg
    python -m resnet_app.predict --export_dir=out --top_k=3 --json images/*.png
    python -m resnet_app.predict --export_dir=out photos/   # every image file under it

The model is an export of `python -m resnet_app.export` (its `serving_bytes`
signature), or a run's checkpoint (`--model_dir`, latest by default), with the
run's own evaluation preprocessing either way. JPEG, PNG, BMP and GIF files of
any size are read; a directory stands for the image files under it (by
extension, recursively, in sorted order). For each image one line goes to stdout,

    cat.jpg: cat 0.9123, dog 0.0520, deer 0.0134, frog 0.0101, bird 0.0050

or, with `--json`, one object: {"image": ..., "top_k": [{"id", "name",
"probability"}, ...]}. A file that cannot be read or decoded gets one
`error: FILE: ...` line on stderr and the others are still classified; the
exit status is then 1. A mistake in the command gets one line and status 2.
"""

from __future__ import annotations

import os
import sys

from absl import flags, logging

from resnet_app.common import checks, cli
from resnet_app.common.errors import ConfigError, first_line

_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "A SavedModel written by `python -m resnet_app.export`."
)
_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Or a run directory written by `python -m resnet_app.train`."
)
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", "latest", "With --model_dir: latest (the newest readable one), ckpt-N or N."
)
_TOP_K = flags.DEFINE_integer(
    "top_k", None, "Classes to show per image (default: all the model gives, usually 5)."
)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 32, "Images classified per call.")
_JSON = flags.DEFINE_boolean("json", False, "One JSON object per image instead of text.")

OUTPUTS = {"top_k_ids", "top_k_names", "top_k_probabilities"}  # What the lines show.


def _load_classifier(export_dir: str | None, model_dir: str | None, which: str, top_k: int | None):
    """A function from a string tensor of encoded images to the serving outputs."""
    if bool(export_dir) == bool(model_dir):
        raise ConfigError(
            "give either --export_dir (an exported SavedModel) or --model_dir (a run "
            "directory), not both"
            if export_dir
            else "give --export_dir (an exported SavedModel) or --model_dir (a run directory)"
        )
    if model_dir:
        from resnet_app import config

        config.read_run_config(model_dir)  # A wrong directory is named before TF loads.
        from resnet_app.serving import exports

        served, _ = exports.load(model_dir, which, top_k=top_k or exports.TOP_K)

        def classify(images):
            return served.serve_bytes(images)  # The closure keeps the model alive.

        return classify

    import tensorflow as tf

    if not tf.saved_model.contains_saved_model(export_dir):
        raise ConfigError(
            f"--export_dir={export_dir} holds no SavedModel; write one with "
            f"`python -m resnet_app.export`"
        )
    try:
        loaded = tf.saved_model.load(export_dir)
    except (OSError, ValueError, tf.errors.OpError) as error:
        raise ConfigError(
            f"--export_dir={export_dir}: the SavedModel cannot be loaded ({first_line(error)}); "
            f"export it again with `python -m resnet_app.export`"
        ) from None
    signature = loaded.signatures.get("serving_bytes")
    if signature is None or not OUTPUTS.issubset(signature.structured_outputs):
        raise ConfigError(
            f"--export_dir={export_dir} has no serving_bytes signature with "
            f"{', '.join(sorted(OUTPUTS))}; it was not written by `python -m resnet_app.export`"
        )

    def classify(images):
        return signature(images=images)  # The closure keeps the SavedModel alive.

    return classify


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def _unreadable_folder(error: OSError) -> None:
    sys.stderr.write(f"error: {error.filename}: {error.strerror}; its images are skipped\n")


def expand(paths: list[str]) -> list[str]:
    """The files to classify: each file as given, each directory's image files
    (by extension, recursively but not into hidden folders or links to folders,
    sorted). A directory without any stays, to be reported."""
    files = []
    for path in paths:
        if not os.path.isdir(path):
            files.append(path)
            continue
        found = []
        for folder, folders, names in os.walk(path, onerror=_unreadable_folder):
            folders[:] = [d for d in folders if not d.startswith(".")]  # .thumbnails etc.
            found += [
                os.path.join(folder, name)
                for name in names
                if name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")
            ]
        files.extend(sorted(found) or [path])
    return files


def _read(path: str) -> bytes:
    """The file's bytes; raises OSError with a short reason."""
    if os.path.isdir(path):
        raise OSError(f"a directory without image files ({', '.join(IMAGE_EXTENSIONS)})")
    with open(path, "rb") as f:
        content = f.read()
    if not content:
        raise OSError("is empty")
    return content


def _reason(message: str) -> str:
    """The op's own words from a TensorFlow error: the line before its `[[node]]` mark."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "[[" in line:
            before = line.split("[[")[0].strip()
            return before or (lines[i - 1] if i else "cannot be decoded")
    return lines[-1] if lines else "cannot be decoded"


def _classify(classify, contents: list[bytes]) -> list[dict | str]:
    """Classifies a batch; if one file fails to decode, classifies them one by one.

    Returns:
      Per file, the model's outputs as NumPy values, or the reason it failed.
    """
    import tensorflow as tf

    try:
        outputs = classify(images=tf.constant(contents, tf.string))
    except tf.errors.InvalidArgumentError as error:
        if len(contents) > 1:
            return [result for one in contents for result in _classify(classify, [one])]
        return [f"not a readable image ({_reason(error.message)})"]
    outputs = {key: value.numpy() for key, value in outputs.items()}
    return [{key: value[i] for key, value in outputs.items()} for i in range(len(contents))]


def _format(path: str, result: dict, top_k: int | None, as_json: bool) -> str:
    ids = result["top_k_ids"][:top_k]
    names = [name.decode("utf-8") for name in result["top_k_names"][:top_k]]
    probabilities = result["top_k_probabilities"][:top_k]
    if as_json:
        from resnet_app.common.metrics import json_text  # TensorFlow is loaded by now.

        top = [
            {"id": int(i), "name": n, "probability": float(p)}
            for i, n, p in zip(ids, names, probabilities)
        ]
        return json_text({"image": path, "top_k": top})
    return f"{path}: " + ", ".join(f"{n} {p:.4f}" for n, p in zip(names, probabilities))


def main(argv: list[str]) -> None:
    if not argv[1:]:
        raise ConfigError("no images given; name the image files after the flags")
    checks.at_least("--batch_size", _BATCH_SIZE.value)
    checks.at_least("--top_k", _TOP_K.value)
    paths = expand(argv[1:])
    classify = _load_classifier(
        _EXPORT_DIR.value, _MODEL_DIR.value, _CHECKPOINT.value, _TOP_K.value
    )
    warned = False

    failed = 0
    for start in range(0, len(paths), _BATCH_SIZE.value):
        chunk = paths[start : start + _BATCH_SIZE.value]
        results: dict[str, dict | str] = {}
        readable, contents = [], []
        for path in chunk:
            try:
                contents.append(_read(path))
                readable.append(path)
            except OSError as error:
                results[path] = error.strerror or str(error)
        if contents:
            results.update(zip(readable, _classify(classify, contents)))
        for path in chunk:  # In the order given.
            result = results[path]
            if isinstance(result, str):
                failed += 1
                sys.stderr.write(f"error: {path}: {result}\n")
            else:
                given = len(result["top_k_ids"])
                if _TOP_K.value and _TOP_K.value > given and not warned:
                    logging.warning("--top_k=%d: the model gives its top %d", _TOP_K.value, given)
                    warned = True
                sys.stdout.write(_format(path, result, _TOP_K.value, _JSON.value) + "\n")
        sys.stdout.flush()
        sys.stderr.flush()
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    cli.run(main)
