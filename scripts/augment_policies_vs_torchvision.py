"""TrivialAugment's, AutoAugment's and AugMix's ops here against torchvision's own code, bin by bin.

    .venv/bin/python scripts/augment_policies_vs_torchvision.py --write=/tmp/ta.npz
    TORCH_VENV/bin/python scripts/augment_policies_vs_torchvision.py --check=/tmp/ta.npz

(the second in a venv with `pip install torch==2.14.1 torchvision==0.29.1
absl-py pillow`).

torch and TensorFlow do not share a venv here, so the comparison runs in two
steps. `--write` makes test images (random, low-contrast, flat areas, smooth
waves) and stores
them with this code's output for every op, every bin and both signs: the 31
of TrivialAugment-wide (`data/trivialaugment.py`), the 10 of AutoAugment
(`data/autoaugment.py`, whose translations depend on the image's size) and
the 10 of AugMix (`data/augmix.py`), and AutoAugment's policy tables.
`--check` runs torchvision's pieces on the same PIL images:
`TrivialAugmentWide._augmentation_space(31, ...)`,
`AutoAugment._augmentation_space(10, (height, width))` and
`AugMix._augmentation_space(10, (height, width))` for the magnitudes,
`_apply_op` with the same fill and each policy's interpolation (NEAREST;
AugMix's BILINEAR), and `AutoAugment._get_policies`, and prints, per policy
and op, the largest difference and the fraction of pixels that differ, and
the pixels that differ where they should not: off a tie (NEAREST), or by more
than 1 where all four sampled neighbours are inside the image (BILINEAR;
along the edge PIL repeats the edge pixel where we blend with the fill). The
unit tests check the same against a PIL reference written from
torchvision's code; this checks against the code itself.
"""

from __future__ import annotations

import json
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

    from resnet_app.data import augmix, autoaugment, randaugment, trivialaugment

    pictures = images()
    outputs = {}
    policies = (
        ("ta_wide", trivialaugment.WIDE_RANGES, trivialaugment.NUM_BINS),
        ("autoaugment", autoaugment.RANGES, autoaugment.NUM_BINS),
        ("augmix", augmix.RANGES, augmix.NUM_BINS),
    )
    for policy, ranges, bins in policies:
        for name in ranges.ops:
            for index in range(bins):
                for sign in (-1, 1):
                    batch = randaugment.apply_op(
                        name,
                        tf.constant(pictures),
                        tf.fill([len(pictures)], float(sign)),
                        tf.fill([len(pictures)], float(index)),
                        FILL,
                        ranges,
                    )
                    outputs[f"{policy}/{name}/{index}/{sign}"] = batch.numpy()
    tables = json.dumps(autoaugment.POLICIES)
    np.savez_compressed(path, images=pictures, policies=np.array(tables), **outputs)
    print(f"wrote {len(outputs)} policy x op x bin x sign outputs of {len(pictures)} images")


def check(path: str) -> None:
    import torch
    import torchvision
    from torchvision.transforms import autoaugment as tv

    stored = np.load(path)
    pictures = stored["images"]
    height, width = pictures.shape[1:3]
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}")
    ours = json.loads(str(stored["policies"]))
    for policy in ("imagenet", "cifar10", "svhn"):
        theirs = tv.AutoAugment(tv.AutoAugmentPolicy(policy)).policies
        same = [[list(op) for op in pair] for pair in theirs] == ours[policy]
        print(f"AutoAugment {policy} policy: {'the same' if same else 'DIFFERS'}")
    spaces = {
        "ta_wide": tv.TrivialAugmentWide()._augmentation_space(31),
        "autoaugment": tv.AutoAugment()._augmentation_space(10, (height, width)),
        "augmix": tv.AugMix()._augmentation_space(10, (height, width)),
    }
    print(
        "policy         op            bins  max |diff|  pixels differing (worst, mean)  unexplained"
    )
    for policy, space in spaces.items():
        compare(stored, pictures, policy, space)
    # What torchvision's AugMix itself runs: its tensor ops on the image as a tensor.
    compare(stored, pictures, "augmix", spaces["augmix"], tensor=True)


def source_points(name: str, magnitude: float, width: int, height: int):
    """(u, v) [H, W]: where each output pixel reads, pixel centres at integers + 0.5
    (torchvision's matrix for PIL, in doubles), or None for a pointwise op."""
    import math

    from torchvision.transforms.functional import _get_inverse_affine_matrix

    if name == "Rotate":  # PIL's rotate about the centre.
        angle = -math.radians(magnitude)
        cos, sin = math.cos(angle), math.sin(angle)
        cx, cy = width / 2, height / 2
        matrix = (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)
    elif name.startswith("Shear"):
        degrees = math.degrees(math.atan(magnitude))
        shear = [degrees, 0.0] if name == "ShearX" else [0.0, degrees]
        matrix = _get_inverse_affine_matrix([0, 0], 0.0, [0, 0], 1.0, shear)
    elif name.startswith("Translate"):
        move = [int(magnitude), 0] if name == "TranslateX" else [0, int(magnitude)]
        matrix = _get_inverse_affine_matrix([width * 0.5, height * 0.5], 0.0, move, 1.0, [0.0, 0.0])
    else:
        return None
    y, x = np.mgrid[0:height, 0:width] + 0.5
    a, b, c, d, e, f = matrix
    return a * x + b * y + c, d * x + e * y + f


def unexplained(name, magnitude, ours, theirs, bilinear: bool) -> int:
    """Pixels that differ where the two arithmetics should agree: off a tie (a source
    point within 1e-3 of a pixel boundary) for NEAREST; by more than 1 where all
    four sampled neighbours are inside the image for BILINEAR."""
    height, width = ours.shape[:2]
    points = source_points(name, magnitude, width, height)
    difference = np.abs(theirs.astype(int) - ours.astype(int)).max(axis=-1)
    if points is None:
        return int(np.sum(difference > 0))
    u, v = points
    if bilinear:
        inside = (u >= 0.5) & (u <= width - 0.5) & (v >= 0.5) & (v <= height - 0.5)
        return int(np.sum((difference > 1) & inside))
    tie = np.minimum(np.abs(u - np.round(u)), np.abs(v - np.round(v))) < 1e-3
    return int(np.sum((difference > 0) & ~tie))


def compare(stored, pictures, policy: str, space: dict, tensor: bool = False) -> None:
    """One line per op of `policy`: torchvision's `_apply_op` against the stored outputs,
    on PIL images (its functional ops' PIL path), or with `tensor` on uint8 tensors
    (the path `AugMix.forward` takes: it converts a PIL image to a tensor first)."""
    from PIL import Image
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import autoaugment as tv
    from torchvision.transforms import functional as tv_functional

    def apply(image, name, magnitude, interpolation):
        if not tensor:
            pil = Image.fromarray(image)
            return np.asarray(tv._apply_op(pil, name, magnitude, interpolation, list(FILL)))
        fill = [float(value) for value in FILL]
        out = tv._apply_op(
            tv_functional.pil_to_tensor(Image.fromarray(image)),
            name,
            magnitude,
            interpolation,
            fill,
        )
        return out.permute(1, 2, 0).numpy()

    bilinear = policy == "augmix"
    interpolation = InterpolationMode.BILINEAR if bilinear else InterpolationMode.NEAREST
    for name, (magnitudes, signed) in space.items():
        bins = len(magnitudes) if magnitudes.ndim > 0 else (31 if policy == "ta_wide" else 10)
        worst, fractions, largest, off_ties = 0.0, [], 0, 0
        for index in range(bins):
            for sign in (-1, 1):
                magnitude = float(magnitudes[index]) if magnitudes.ndim > 0 else 0.0
                if signed and sign < 0:
                    magnitude *= -1.0
                ours = stored[f"{policy}/{name}/{index}/{sign}"]
                for image, mine in zip(pictures, ours):
                    if name == "Posterize" and magnitude == 0 and not tensor:
                        theirs = np.zeros_like(
                            image
                        )  # PIL 11 refuses 0 bits; the tensor op: black.
                    else:
                        theirs = apply(image, name, magnitude, interpolation)
                    differ = np.any(theirs != mine, axis=-1)
                    off_ties += unexplained(name, magnitude, mine, theirs, bilinear)
                    fractions.append(differ.mean())
                    worst = max(worst, differ.mean())
                    largest = max(largest, int(np.abs(theirs.astype(int) - mine).max()))
        mean = np.mean(fractions)
        label = f"{policy}/tensor" if tensor else policy
        print(
            f"{label:<14} {name:<13} {bins:>4}  {largest:>10}  {worst:.4f}, {mean:.5f}"
            f"  {off_ties:>8}"
        )


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
