"""Inputs that cost gigabytes or crashed (issue 38): long strips, image bombs, odd file names.

Evaluation's ImageNet transform computes only the crops of a strip longer than
4:1 (`preprocessing.resized_crops`); checked here against the whole resize
done with tf.image ops and a NumPy closed form, and by the allocator's peak.
Predict refuses a file whose header gives too many pixels before decoding it
(`classify.image_shape`), and writes file names any stdout can carry
(`classify.write_results`).
"""

import dataclasses
import gc
import io
import json
import os
import struct

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.data import preprocessing
from resnet_app.data.preprocessing import Preprocessing
from resnet_app.export import classify
from tests.image_files import encode_bmp, encode_gif

MEAN, STD = (120.0, 110.0, 100.0), (60.0, 50.0, 40.0)
IMAGENET = Preprocessing("imagenet", 224, MEAN, STD)


def random_image(height, width, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def old_crops(image, config, corners):
    """The evaluation crops as computed before: the whole image resized, then sliced.

    Written out with tf.image ops, independent of the code under test.
    """
    height, width = image.shape[:2]
    scale = np.float32(config.eval_resize) / np.float32(min(height, width))
    new_height, new_width = (int(round(np.float32(side) * scale)) for side in (height, width))
    resized = tf.image.resize(tf.cast(image, tf.float32), [new_height, new_width])
    size = config.eval_size
    bottom, right = new_height - size, new_width - size
    origins = [(bottom // 2, right // 2)]
    if corners:
        origins += [(0, 0), (0, right), (bottom, 0), (bottom, right)]
    mean, std = tf.constant(config.mean, tf.float32), tf.constant(config.std, tf.float32)
    crops = [(resized[t : t + size, s : s + size] - mean) / std for t, s in origins]
    return tf.stack(crops).numpy()


def evaluation_crops(image, config, corners, encoded=False):
    if corners:
        return preprocessing.imagenet_eval_crops(image, config, encoded=encoded).numpy()
    return preprocessing.imagenet_eval(image, config, encoded=encoded).numpy()[None]


# (height, width, eval_resize, eval_size): odd sizes, upscaled and downscaled,
# up to the 4:1 bound (64 x 256 at 64), where the whole image is still resized.
ORDINARY = [
    (300, 400, 256, 224),
    (260, 300, 256, 224),
    (45, 37, 37, 32),
    (64, 256, 64, 56),
    (700, 175, 64, 48),
    (19, 23, 40, 40),
]


@pytest.mark.parametrize("corners", [False, True])
@pytest.mark.parametrize("height,width,resize,size", ORDINARY)
def test_ordinary_images_are_cropped_bit_for_bit_as_before(height, width, resize, size, corners):
    """Pins the unchanged part: images up to 4:1 give exactly the old transform's pixels."""
    config = dataclasses.replace(IMAGENET, image_size=size, eval_resize=resize)
    image = random_image(height, width, seed=height)
    expected = old_crops(image, config, corners)
    np.testing.assert_array_equal(evaluation_crops(tf.constant(image), config, corners), expected)
    encoded = tf.io.encode_png(image)  # Lossless: the same pixels through the decoder.
    got = evaluation_crops(encoded, config, corners, encoded=True)
    np.testing.assert_array_equal(got, expected)


# Beyond 4:1, small enough to resize whole here for the reference.
STRIPS = [(5, 700, 64, 56), (300, 17, 256, 224), (33, 400, 37, 32), (1, 300, 40, 40)]


@pytest.mark.parametrize("height,width,resize,size", STRIPS)
def test_long_strips_give_the_crops_of_the_whole_resize(height, width, resize, size):
    """Only the crops are computed, and they are the whole resize's, bit for bit,
    in eager code and in a tf.data map (graph code, as evaluation runs it)."""
    config = dataclasses.replace(IMAGENET, image_size=size, eval_resize=resize)
    image = random_image(height, width, seed=width)
    assert max(height, width) > preprocessing.MAX_WHOLE_RESIZE_ASPECT * min(height, width)
    for corners in (False, True):
        expected = old_crops(image, config, corners)
        np.testing.assert_array_equal(
            evaluation_crops(tf.constant(image), config, corners), expected
        )
        dataset = tf.data.Dataset.from_tensors(tf.io.encode_png(image)).map(
            lambda encoded, corners=corners: evaluation_crops_graph(encoded, config, corners)
        )
        np.testing.assert_array_equal(next(iter(dataset)).numpy(), expected)


def evaluation_crops_graph(encoded, config, corners):
    if corners:
        return preprocessing.imagenet_eval_crops(encoded, config, encoded=True)
    return preprocessing.imagenet_eval(encoded, config, encoded=True)[None]


def peak_bytes(function):
    """The CPU allocator's peak while `function` runs, less what the process already
    held when it began (resnet_app turns on TF's BFC allocator, which counts both:
    an earlier test's cached networks in the same process held 1.9 GB once)."""
    gc.collect()
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except ValueError:
        pytest.skip("the CPU allocator keeps no statistics (TF_CPU_ALLOCATOR_USE_BFC=false)")
    held = tf.config.experimental.get_memory_info("CPU:0")["current"]
    function()
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - held


def test_a_one_pixel_strip_costs_its_crops_and_matches_the_closed_form():
    """1x4000 at eval_resize 64: resized whole it is 64 x 256,000 float32 RGB (197 MB);
    the five crops of 56 x 56 take 188 KB."""
    config = Preprocessing("imagenet", 56, (0.0,) * 3, (1.0,) * 3, eval_resize=64)
    width = 4000
    values = np.round(np.arange(width) * 255 / (width - 1))  # A ramp, 0 to 255.
    image = np.broadcast_to(values[None, :, None], (1, width, 3)).astype(np.uint8)
    outputs = {}

    def run():
        outputs["centre"] = preprocessing.imagenet_eval(tf.constant(image), config).numpy()
        dataset = tf.data.Dataset.from_tensors(tf.io.encode_png(image)).map(
            lambda encoded: preprocessing.imagenet_eval_crops(encoded, config, encoded=True)
        )
        outputs["crops"] = next(iter(dataset)).numpy()

    peak = peak_bytes(run)
    assert peak < 16 * 2**20, f"peak {peak:,} bytes"
    # Bilinear with half-pixel centres interpolates linearly between source
    # pixels (np.interp); the one row is every row. Resized width: 4000 * 64 = 256,000.
    resized_width, size = width * 64, 56
    for crop, left in [
        (outputs["centre"], (resized_width - size) // 2),
        (outputs["crops"][0], (resized_width - size) // 2),
        (outputs["crops"][1], 0),
        (outputs["crops"][2], resized_width - size),
    ]:
        source = (np.arange(size) + left + 0.5) * width / resized_width - 0.5
        expected = np.interp(source, np.arange(width), values)
        assert crop.shape == (size, size, 3)
        np.testing.assert_allclose(
            crop, np.broadcast_to(expected[None, :, None], crop.shape), atol=1e-3
        )


def test_a_strip_too_long_for_int32_sizes_is_still_evaluated():
    """1 x 10,000,000 resizes to 256 x 2,560,000,000, past int32: its long side is
    capped, and a constant image still gives its colour everywhere."""
    image = tf.fill([1, 10_000_000, 3], tf.constant(7, tf.uint8))
    config = Preprocessing("imagenet", 224, (0.0,) * 3, (1.0,) * 3)
    crops = preprocessing.imagenet_eval_crops(image, config).numpy()
    np.testing.assert_array_equal(crops, np.full((5, 224, 224, 3), 7, np.float32))


# -- predict: image headers and the pixel limit --------------------------------------------


def webp_encoder():
    """WebP bytes from Pillow (installed with matplotlib), or None without its WebP codec."""
    try:
        from PIL import Image, features
    except ImportError:
        return None
    if not features.check("webp"):
        return None

    def encode(image, lossless):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, "WEBP", lossless=lossless)
        return buffer.getvalue()

    return encode


@pytest.mark.parametrize("height,width", [(37, 53), (1, 300), (256, 3)])
def test_image_shape_reads_what_the_decoder_allocates(height, width):
    image = random_image(height, width)
    few_colours = image // 128 * 255  # GIF: at most 256 colours.
    files = {
        "png": tf.io.encode_png(image).numpy(),
        "jpeg": tf.io.encode_jpeg(image).numpy(),
        "progressive jpeg": tf.io.encode_jpeg(image, progressive=True).numpy(),
        "bmp": encode_bmp(image),
        "gif": encode_gif(few_colours),
    }
    encode_webp = webp_encoder()
    if encode_webp:
        files["lossy webp"] = encode_webp(image, lossless=False)
        files["lossless webp"] = encode_webp(image, lossless=True)
    for kind, content in files.items():
        decoded = preprocessing.decode_image(tf.constant(content))
        assert classify.image_shape(content) == tuple(decoded.shape[:2]) == (height, width), kind
    top_down = bytearray(files["bmp"])
    top_down[22:26] = struct.pack("<i", -height)
    assert classify.image_shape(bytes(top_down)) == (height, width)
    for content in (b"not an image", files["png"][:20], files["jpeg"][:30], b"GIF89a\x01"):
        assert classify.image_shape(content) is None


def png_header(width, height):
    """The first bytes of a PNG of this size: enough for its size, nothing to decode."""
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sII", 13, b"IHDR", width, height) + b"\x08\x02"


def jpeg_header(width, height):
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + bytes(9)
    return b"\xff\xd8" + app0 + b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3)


BOMBS = {
    "bomb.png": (png_header(10_000, 10_000), "10000x10000 pixels (100,000,000)"),
    "bomb.jpg": (jpeg_header(20_000, 5_000), "20000x5000 pixels (100,000,000)"),
    "bomb.gif": (
        b"GIF89a" + struct.pack("<HH", 65535, 65535),
        "65535x65535 pixels (4,294,836,225)",
    ),
    "bomb.bmp": (
        b"BM" + bytes(12) + struct.pack("<Iii", 40, 30_000, -30_000),
        "30000x30000 pixels (900,000,000)",
    ),
}


def test_predict_refuses_an_image_whose_header_gives_too_many_pixels(tmp_path):
    """Refused by its header, never handed to the decoder; the others still classified."""
    good = tmp_path / "good.png"
    good.write_bytes(tf.io.encode_png(random_image(40, 40)).numpy())
    paths = [str(good)]
    for name, (content, _) in BOMBS.items():
        (tmp_path / name).write_bytes(content)
        paths.append(str(tmp_path / name))
    given = []

    def fake_classifier(images):
        given.extend(images.numpy())
        count = len(images)
        return {
            "top_k_ids": tf.zeros([count, 1], tf.int32),
            "top_k_names": tf.fill([count, 1], "cat"),
            "top_k_probabilities": tf.ones([count, 1]),
        }

    results = dict(
        pair for batch in classify.classify_files(fake_classifier, paths, 8) for pair in batch
    )
    assert given == [good.read_bytes()]
    assert not isinstance(results[str(good)], str)
    for name, (_, size) in BOMBS.items():
        reason = results[str(tmp_path / name)]
        assert reason.startswith(size + ", more than the limit of 89,478,485"), reason
        assert "--max_image_pixels" in reason
    # The limit is a setting: 1,600 pixels pass 1,600 and are refused at 1,599.
    kept = list(classify.classify_files(fake_classifier, [str(good)], 8, max_pixels=1600))
    refused = list(classify.classify_files(fake_classifier, [str(good)], 8, max_pixels=1599))
    assert not isinstance(kept[0][0][1], str)
    assert refused[0][0][1].startswith("40x40 pixels (1,600), more than the limit of 1,599")


# -- predict: file names on any stdout -----------------------------------------------------

# A name with a UTF-8 character (é) and a byte that is no UTF-8 (\xe9 alone),
# as os.listdir and sys.argv give it: the byte as the surrogate escape \udce9.
NAME = os.fsdecode(b"photos/caf\xc3\xa9-\xe9.png")
RESULT = {
    "top_k_ids": np.array([3, 1]),
    "top_k_names": np.array([b"cat", b"dog"]),
    "top_k_probabilities": np.array([0.75, 0.25], np.float32),
}


def stream(encoding):
    """A stdout that refuses what its encoding lacks, as PYTHONIOENCODING=ascii gives."""
    return io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict", newline="\n")


def written(text_stream):
    text_stream.flush()
    return text_stream.buffer.getvalue()


@pytest.mark.parametrize(
    "encoding,shown",
    [("ascii", "photos/caf\\xe9-\\xe9.png"), ("utf-8", "photos/café-\\xe9.png")],
)
def test_predict_names_odd_files_on_a_strict_stdout(encoding, shown):
    assert os.fsencode(NAME) == b"photos/caf\xc3\xa9-\xe9.png"  # A UTF-8 file system encoding.
    stdout, stderr = stream(encoding), stream(encoding)
    batches = [[(NAME, RESULT), (NAME + ".missing", "No such file or directory")]]
    assert classify.write_results(batches, None, False, stdout, stderr)  # A file failed.
    assert written(stdout).decode(encoding) == f"{shown}: cat 0.7500, dog 0.2500\n"
    assert (
        written(stderr).decode(encoding) == f"error: {shown}.missing: No such file or directory\n"
    )
    # JSON stays valid JSON, and the name reads back to the file's bytes.
    stdout = stream(encoding)
    assert not classify.write_results([[(NAME, RESULT)]], 1, True, stdout, stream(encoding))
    record = json.loads(written(stdout).decode(encoding))
    assert os.fsencode(record["image"]) == os.fsencode(NAME)
    assert record["top_k"] == [{"id": 3, "name": "cat", "probability": 0.75}]
