"""Image files classified by an export or a run's checkpoint, for `python -m resnet_app.predict`.

`load_classifier` gives a function from a batch of encoded images to the
serving outputs; `expand` turns the paths given into files; `classify_files`
classifies them in batches (a file that cannot be read or decoded gets its
reason, the others are still classified; a header of more than
`MAX_IMAGE_PIXELS` is refused before decoding); `write_results` writes each
file's line in what the stream's encoding can carry. The paths and the run
directory are checked before TensorFlow is imported.
"""

from __future__ import annotations

import os
import re
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO

from absl import logging

from resnet_app import config
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.export import formats

OUTPUTS = {"top_k_ids", "top_k_names", "top_k_probabilities"}  # What the lines show.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
# A decompression-bomb guard: 1 GiB as the float32 RGB that resizing casts to.
MAX_IMAGE_PIXELS = 1024**3 // 12
# Surrogate escapes: how Python holds a file name's bytes that are not valid in
# the file system's encoding (b"caf\xe9" read as UTF-8 is "caf\udce9").
_UNDECODABLE = re.compile("[\udc80-\udcff]")
# JPEG start-of-frame markers (they hold the size): C0-CF but DHT, JPG and DAC.
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}

# A batch of encoded images (`images=`, a string tensor) -> the serving outputs.
Classifier = Callable[..., dict[str, Any]]
# Per file, the model's outputs as NumPy values, or the reason it failed.
Result = dict[str, Any] | str


def load_classifier(
    export_dir: str | None,
    model_dir: str | None,
    which: str = "latest",
    top_k: int | None = None,
    weights: str = "auto",
) -> Classifier:
    """The model that classifies: an export (a SavedModel, or a .tflite or .onnx file it
    holds) or a run's checkpoint (`which`, `top_k` and `weights` apply to it).

    Returns:
      A function from `images=` (a string tensor [batch] of encoded images) to
      the serving outputs.

    Raises:
      ConfigError: for neither or both given, no such run or checkpoint, or a
        directory that holds no export.
    """
    if bool(export_dir) == bool(model_dir):
        both = ", not both" if export_dir else ""
        raise ConfigError(
            f"give --export_dir (an exported SavedModel) or --model_dir (a run directory){both}"
        )
    if not model_dir:
        return _load_export(export_dir)
    config.read_run_config(model_dir)  # A wrong directory is named before TF loads.
    from resnet_app.export import savedmodel

    served, _ = savedmodel.load(model_dir, which, top_k=top_k or savedmodel.TOP_K, weights=weights)

    def classify(images):
        return served.serve_bytes(images)  # The closure keeps the model alive.

    return classify


def _load_portable(path: str) -> Classifier:
    """A .tflite or .onnx file of an export, its images brought to its size as the parity
    report's were (`portable.fixed_size_image`)."""
    import json

    import numpy as np
    import tensorflow as tf

    from resnet_app.data import run_pipeline
    from resnet_app.data.preprocessing import decode_image
    from resnet_app.export import deploy, portable

    info_path = os.path.join(os.path.dirname(os.path.abspath(path)), deploy.MODEL_INFO)
    try:
        with open(info_path) as file:
            info = json.load(file)
            names, preprocessing = run_pipeline.parse_data_info(info)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path}: its {deploy.MODEL_INFO} is missing or damaged ({first_line(error)}); keep "
            "the file in the directory `python -m resnet_app.export` wrote"
        ) from None
    multi_label, threshold = bool(info.get("multi_label")), info.get("threshold")
    runner = formats.by_suffix(path).load().Runner(path)
    top_k = len(names) if multi_label else min(5, len(names))

    def classify(images):
        decoded = [decode_image(image, preprocessing.channels) for image in images]
        pixels = np.stack([portable.fixed_size_image(image, preprocessing) for image in decoded])
        probabilities = runner(pixels)
        ids = np.argsort(-probabilities, axis=1, kind="stable")[:, :top_k]
        outputs = {
            "top_k_ids": tf.constant(ids.astype(np.int32)),
            "top_k_names": tf.constant([[names[i] for i in row] for row in ids]),
            "top_k_probabilities": tf.constant(np.take_along_axis(probabilities, ids, axis=1)),
        }
        if multi_label:
            outputs["threshold"] = tf.fill([len(ids)], float(threshold))
        return outputs

    return classify


def _load_export(export_dir: str) -> Classifier:
    """A SavedModel's `serving_bytes` signature, checked to give the outputs shown."""
    if formats.by_suffix(export_dir) is not None:
        if not os.path.isfile(export_dir):
            raise ConfigError(f"--export_dir={export_dir}: no such file; check the path")
        return _load_portable(export_dir)
    import tensorflow as tf

    from resnet_app.export import savedmodel

    export_dir = savedmodel.readable(export_dir)
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


def expand(paths: Sequence[str], on_unreadable: Callable[[OSError], None]) -> list[str]:
    """The files to classify, in the order given.

    Each file as given, each directory's image files (by extension, recursively
    but not into hidden folders or links to folders, sorted); a directory
    without any stays, to be reported. `on_unreadable` gets the error of a
    folder that cannot be listed.
    """
    files = []
    for path in paths:
        if not os.path.isdir(path):
            files.append(path)
            continue
        found = []
        for folder, folders, names in os.walk(path, onerror=on_unreadable):
            folders[:] = [d for d in folders if not d.startswith(".")]  # .thumbnails etc.
            found += [
                os.path.join(folder, name)
                for name in names
                if name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")
            ]
        files.extend(sorted(found) or [path])
    return files


def classify_files(
    classify: Classifier,
    paths: Sequence[str],
    batch_size: int,
    max_pixels: int | None = MAX_IMAGE_PIXELS,
) -> Iterator[list[tuple[str, Result]]]:
    """Per batch of `batch_size`, (path, its outputs as NumPy or the reason it failed) pairs.

    A file whose header gives more than `max_pixels` is refused, not decoded.
    """
    for start in range(0, len(paths), batch_size):
        batch = paths[start : start + batch_size]
        results: dict[str, Result] = {}
        readable, contents = [], []
        for path in batch:
            try:
                contents.append(_read(path, max_pixels))
                readable.append(path)
            except OSError as error:
                results[path] = error.strerror or str(error)
        if contents:
            results.update(zip(readable, _classify(classify, contents)))
        yield [(path, results[path]) for path in batch]


def _read(path: str, max_pixels: int | None) -> bytes:
    """The file's bytes; raises OSError with a short reason, also for a header of more than
    `max_pixels` (refused before it is decoded)."""
    if os.path.isdir(path):
        raise OSError(f"a directory without image files ({', '.join(IMAGE_EXTENSIONS)})")
    with open(path, "rb") as f:
        content = f.read()
    if not content:
        raise OSError("is empty")
    shape = image_shape(content) if max_pixels else None
    if shape is not None and shape[0] * shape[1] > max_pixels:
        height, width = shape
        raise OSError(
            f"{width}x{height} pixels ({height * width:,}), more than the limit of "
            f"{max_pixels:,} (a guard against decompression bombs); pass a larger "
            "--max_image_pixels if the image is meant to be this large"
        )
    return content


def image_shape(content: bytes) -> tuple[int, int] | None:
    """(height, width) from an encoded image's header (what the decoder allocates), or
    None for another format or a header cut short (the decoder then says what is wrong)."""
    try:
        # (width, height) in the header, reversed.
        if content.startswith(b"\x89PNG\r\n\x1a\n") and content[12:16] == b"IHDR":
            return struct.unpack(">II", content[16:24])[::-1]
        if content.startswith((b"GIF87a", b"GIF89a")):
            return struct.unpack("<HH", content[6:10])[::-1]
        if content.startswith(b"BM"):
            (header_size,) = struct.unpack("<I", content[14:18])
            if header_size == 12:  # OS/2 1.x: 16-bit sizes.
                width, height = struct.unpack("<HH", content[18:22])
            else:  # A negative height means rows stored top-down.
                width, height = struct.unpack("<ii", content[18:26])
            return abs(height), abs(width)
        if content.startswith(b"RIFF") and content[8:12] == b"WEBP":
            return _webp_shape(content)
        if content.startswith(b"\xff\xd8"):
            return _jpeg_shape(content)
    except struct.error:
        return None
    return None


def _webp_shape(content: bytes) -> tuple[int, int] | None:
    chunk = content[12:16]
    if chunk == b"VP8X":  # The canvas, 24-bit sizes minus one.
        width = int.from_bytes(content[24:27], "little") + 1
        return int.from_bytes(content[27:30], "little") + 1, width
    if chunk == b"VP8 " and content[23:26] == b"\x9d\x01\x2a":  # Lossy: 14-bit sizes.
        width, height = struct.unpack("<HH", content[26:30])
        return height & 0x3FFF, width & 0x3FFF
    if chunk == b"VP8L" and content[20:21] == b"\x2f":  # Lossless: 14-bit sizes minus one.
        bits = int.from_bytes(content[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    return None


def _jpeg_shape(content: bytes) -> tuple[int, int] | None:
    position = 2
    while position + 4 <= len(content):
        if content[position] != 0xFF:
            return None
        marker = content[position + 1]
        if marker == 0xFF:  # A fill byte.
            position += 1
        elif marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # No length.
            position += 2
        elif marker in _JPEG_FRAMES:
            height, width = struct.unpack(">HH", content[position + 5 : position + 9])
            return (height, width) if height else None  # 0: given later (DNL).
        elif marker in (0xD9, 0xDA):  # The end, or the scan: no frame before it.
            return None
        else:
            (length,) = struct.unpack(">H", content[position + 2 : position + 4])
            position += 2 + length
    return None


def _reason(message: str) -> str:
    """The op's own words from a TensorFlow error: the line before its `[[node]]` mark."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "[[" in line:
            before = line.split("[[")[0].strip()
            return before or (lines[i - 1] if i else "cannot be decoded")
    return lines[-1] if lines else "cannot be decoded"


def _classify(classify: Classifier, contents: list[bytes]) -> list[Result]:
    """Per file, the outputs as NumPy or the reason it failed (one by one if one fails)."""
    import tensorflow as tf

    try:
        outputs = classify(images=tf.constant(contents, tf.string))
    except tf.errors.InvalidArgumentError as error:
        if len(contents) > 1:
            return [result for one in contents for result in _classify(classify, [one])]
        return [f"not a readable image ({_reason(error.message)})"]
    outputs = {key: value.numpy() for key, value in outputs.items()}
    return [{key: value[i] for key, value in outputs.items()} for i in range(len(contents))]


def format_result(path: str, result: dict[str, Any], top_k: int | None, as_json: bool) -> str:
    """One file's line, without its newline: `path: name probability, ...` (the first
    `top_k`; multi-label: those at or above the threshold), or a JSON object."""
    ids = result["top_k_ids"][:top_k]
    names = [name.decode("utf-8") for name in result["top_k_names"][:top_k]]
    probabilities = result["top_k_probabilities"][:top_k]
    threshold = float(result["threshold"]) if "threshold" in result else None
    if threshold is not None:
        kept = [k for k, p in enumerate(probabilities) if p >= threshold]
        ids, names, probabilities = ([row[k] for k in kept] for row in (ids, names, probabilities))
    if as_json:
        from resnet_app.common.metrics import json_text  # TensorFlow is loaded by now.

        top = [
            {"id": int(i), "name": n, "probability": float(p)}
            for i, n, p in zip(ids, names, probabilities)
        ]
        if threshold is None:
            return json_text({"image": path, "top_k": top})
        return json_text({"image": path, "threshold": threshold, "labels": top})
    shown = ", ".join(f"{n} {p:.4f}" for n, p in zip(names, probabilities))
    return f"{path}: " + (shown or ("" if threshold is None else f"no class reaches {threshold:g}"))


def printable(text: str, encoding: str | None) -> str:
    """`text` as a stream in `encoding` (None: any) can carry it, escaped where it cannot.

    A file name's undecodable byte becomes `\\xNN`, a character the encoding
    lacks Python's backslash escape, so a line names its file on any stdout
    instead of ending in UnicodeEncodeError.
    """
    text = _UNDECODABLE.sub(lambda match: f"\\x{ord(match.group()) - 0xDC00:02x}", text)
    if encoding:
        text = text.encode(encoding, "backslashreplace").decode(encoding)
    return text


def write_line(stream: TextIO, line: str) -> None:
    """Writes `line` and a newline to `stream`, `printable` in its encoding."""
    stream.write(printable(line, getattr(stream, "encoding", None)) + "\n")


def write_results(
    batches: Iterable[list[tuple[str, Result]]],
    top_k: int | None,
    as_json: bool,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> bool:
    """Writes each file's line to stdout, or its `error: FILE: reason` line to stderr.

    Returns:
      Whether some file failed.
    """
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    warned = failed = False
    for batch in batches:
        for path, result in batch:  # In the order given.
            if isinstance(result, str):
                failed = True
                write_line(stderr, f"error: {path}: {result}")
                continue
            given = len(result["top_k_ids"])
            if top_k and top_k > given and not warned:
                logging.warning("--top_k=%d: the model gives its top %d", top_k, given)
                warned = True
            write_line(stdout, format_result(path, result, top_k, as_json))
        stdout.flush()
        stderr.flush()
    return failed
