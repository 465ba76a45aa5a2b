"""TrivialAugment's ops here against torchvision's own code, op by op, bin by bin.

    .venv/bin/python scripts/trivialaugment_vs_torchvision.py --write=/tmp/ta.npz
    TORCH_VENV/bin/python scripts/trivialaugment_vs_torchvision.py --check=/tmp/ta.npz

(the second in a venv with `pip install torch==2.14.1 torchvision==0.29.1
absl-py pillow`).

torch and TensorFlow do not share a venv here, so the comparison runs in two
steps. `--write` makes test images (random, low-contrast, flat areas, smooth
waves) and stores
them with this code's output for every op, every one of the 31 bins and both
signs (`data/trivialaugment.py`). `--check` runs torchvision's
`TrivialAugmentWide` pieces on the same PIL images: its
`_augmentation_space(31, ...)` for the magnitudes and its `_apply_op` with
NEAREST interpolation and the same fill, and prints, per op, the largest
difference and the fraction of pixels that differ (the unit tests check the
same against a PIL reference written from torchvision's code; this checks
against the code itself).
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import app, flags

_WRITE = flags.DEFINE_string("write", None, "Write the images and this code's outputs here.")
_CHECK = flags.DEFINE_string("check", None, "Compare torchvision's outputs with this file.")

FILL = (120, 110, 100)
SIGNED = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
SIGNED += ("Brightness", "Color", "Contrast", "Sharpness")


def images() -> np.ndarray:
    """uint8 [n, 32, 40, 3]: random, low-contrast and flat-area images."""
    rng = np.random.default_rng(1)
    full = rng.integers(0, 256, (32, 40, 3), dtype=np.uint8)
    low = (rng.integers(0, 256, (32, 40, 3)) // 4 + 60).astype(np.uint8)
    flat = np.full((32, 40, 3), 77, np.uint8)
    flat[5:20, 8:30] = (10, 200, 90)
    smooth = np.stack(
        [np.clip(128 + 90 * np.sin(np.mgrid[0:32, 0:40][1] / (4 + c)), 0, 255) for c in range(3)],
        -1,
    ).astype(np.uint8)
    return np.stack([full, low, flat, smooth])


def write(path: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tensorflow as tf

    from resnet_app.data import randaugment, trivialaugment

    pictures = images()
    outputs = {}
    for name in randaugment.OPS:
        for index in range(trivialaugment.NUM_BINS):
            for sign in (-1, 1):
                batch = randaugment.apply_op(
                    name,
                    tf.constant(pictures),
                    tf.fill([len(pictures)], float(sign)),
                    tf.fill([len(pictures)], float(index)),
                    FILL,
                    trivialaugment.WIDE_RANGES,
                )
                outputs[f"{name}/{index}/{sign}"] = batch.numpy()
    np.savez_compressed(path, images=pictures, **outputs)
    print(f"wrote {len(outputs)} op x bin x sign outputs of {len(pictures)} images to {path}")


def check(path: str) -> None:
    import torch
    import torchvision
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import autoaugment as tv

    stored = np.load(path)
    pictures = stored["images"]
    space = tv.TrivialAugmentWide()._augmentation_space(31)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    print("op            bins  max |diff|  pixels differing (worst case, mean)")
    for name, (magnitudes, signed) in space.items():
        worst, fractions, largest = 0.0, [], 0
        for index in range(31):
            for sign in (-1, 1):
                magnitude = float(magnitudes[index]) if magnitudes.ndim > 0 else 0.0
                if signed and sign < 0:
                    magnitude *= -1.0
                ours = stored[f"{name}/{index}/{sign}"]
                for image, mine in zip(pictures, ours):
                    theirs = np.asarray(
                        tv._apply_op(
                            Image.fromarray(image),
                            name,
                            magnitude,
                            interpolation=InterpolationMode.NEAREST,
                            fill=list(FILL),
                        )
                    )
                    differ = np.any(theirs != mine, axis=-1)
                    fractions.append(differ.mean())
                    worst = max(worst, differ.mean())
                    largest = max(largest, int(np.abs(theirs.astype(int) - mine).max()))
        print(f"{name:<13} {31:>4}  {largest:>10}  {worst:.4f}, {np.mean(fractions):.5f}")


def main(argv: list[str]) -> None:
    del argv
    if bool(_WRITE.value) == bool(_CHECK.value):
        print("error: give --write=FILE (with TensorFlow) or --check=FILE (with torchvision)")
        sys.exit(2)
    if _WRITE.value:
        write(_WRITE.value)
    else:
        check(_CHECK.value)


if __name__ == "__main__":
    app.run(main)
