"""Image files for tests: minimal BMP and GIF writers (TF encodes only JPEG and PNG)."""

import struct

import numpy as np


def encode_bmp(image: np.ndarray) -> bytes:
    """A 24-bit uncompressed BMP: bottom-up rows of BGR, each padded to 4 bytes."""
    height, width, _ = image.shape
    row_bytes = (3 * width + 3) // 4 * 4
    rows = np.zeros((height, row_bytes), np.uint8)
    rows[:, : 3 * width] = image[::-1, :, ::-1].reshape(height, -1)
    pixels = rows.tobytes()
    header = struct.pack("<2sIHHI", b"BM", 54 + len(pixels), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return header + info + pixels


def encode_gif(image: np.ndarray) -> bytes:
    """A GIF of an image with at most 256 colours.

    LZW with 8-bit literals only: a clear code every 254 pixels keeps the code
    size at 9 bits, so the stream needs no dictionary logic.
    """
    height, width, _ = image.shape
    colours, indices = np.unique(image.reshape(-1, 3), axis=0, return_inverse=True)
    assert len(colours) <= 256
    palette = np.zeros((256, 3), np.uint8)
    palette[: len(colours)] = colours
    clear, end = 256, 257
    codes = []
    for start in range(0, len(indices), 254):
        codes.append(clear)
        codes.extend(int(i) for i in indices[start : start + 254])
    codes.append(end)
    bits = 0
    count = 0
    data = bytearray()
    for code in codes:
        bits |= code << count
        count += 9
        while count >= 8:
            data.append(bits & 0xFF)
            bits >>= 8
            count -= 8
    if count:
        data.append(bits & 0xFF)
    blocks = bytearray()
    for start in range(0, len(data), 255):
        chunk = data[start : start + 255]
        blocks += bytes([len(chunk)]) + chunk
    return (
        b"GIF89a"
        + struct.pack("<HHBBB", width, height, 0xF7, 0, 0)
        + palette.tobytes()
        + b","
        + struct.pack("<HHHHB", 0, 0, width, height, 0)
        + bytes([8])
        + bytes(blocks)
        + b"\x00;"
    )


def few_colour_image(height: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    palette = rng.integers(0, 256, (6, 3), dtype=np.uint8)
    return palette[rng.integers(0, 6, (height, width))]
