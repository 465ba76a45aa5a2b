"""bf16 against fp32: the same recipe and seeds, trained in both precisions, accuracy side by side.

    python scripts/precision_parity.py                       # shapes and digits, seeds 0-2
    python scripts/precision_parity.py --datasets=digits --seeds=0,1,2,3,4

Each (dataset, seed, precision) is one `python -m resnet_app.train` process
with `configs/shapes_quickstart.yaml` (ResNet-14, 24 px, one cosine epoch at
batch 32) and `--precision=fp32` or `bf16`. The datasets:
- `shapes`: the built-in offline dataset (50,000 training images);
- `digits`: an image folder written here, the digits 0-9 drawn with Pillow's
  FreeType font at random sizes, positions and angles, in bold strokes of the
  opposite colour (jittered) to their noisy backgrounds, 32x32 PNGs, 1,000
  training and 200 test images per digit, trained for 4 epochs (about
  shapes' number of steps): a digits-style folder read through `folder:`
  like a user's own.

Printed: each run's test top-1 and training time, then per dataset the mean
and spread of each precision, the mean per-seed difference (bf16 - fp32), and
the time ratio fp32 / bf16. On a CPU without native bfloat16 the bf16 runs are
emulated and slow; the CPU line says which kind this is.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags, logging

from resnet_app.common import metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DATASETS = flags.DEFINE_list("datasets", ["shapes", "digits"], "shapes and/or digits.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Training seeds.")
_PRECISIONS = flags.DEFINE_list("precisions", ["fp32", "bf16"], "Precisions to compare.")
_CONFIG = flags.DEFINE_string("config", "configs/shapes_quickstart.yaml", "The recipe.")
_PER_DIGIT = flags.DEFINE_integer("per_digit", 1000, "Training images per digit.")
_DIGITS_EPOCHS = flags.DEFINE_float(
    "digits_epochs", 4, "Epochs on digits (10,000 images: 4 epochs are about the steps of shapes')."
)
_WORK = flags.DEFINE_string("work_dir", None, "Where runs and the digits go (default: a temp dir).")


def write_digits(root: str, per_digit: int, test_per_digit: int, seed: int = 0) -> str:
    """Writes the digits folder (train/ and test/, one folder per digit); returns its path."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    for split, count in (("train", per_digit), ("test", test_per_digit)):
        for digit in range(10):
            folder = os.path.join(root, split, str(digit))
            os.makedirs(folder, exist_ok=True)
            for index in range(count):
                background = rng.integers(0, 256, 3)
                # The opposite colour, jittered: a digit always stands out of its ground.
                ink = np.clip(255 - background + rng.integers(-40, 41, 3), 0, 255)
                noise = rng.normal(0, 12, (32, 32, 3))
                pixels = np.clip(background + noise, 0, 255).astype(np.uint8)
                image = Image.fromarray(pixels).resize((64, 64))
                font = ImageFont.load_default(size=int(rng.integers(28, 48)))
                draw = ImageDraw.Draw(image)
                x, y = rng.integers(8, 28), rng.integers(4, 24)
                colour = tuple(int(v) for v in ink)
                # Strokes 2 px wider each side: they survive the halving to 32 px.
                draw.text(
                    (x, y), str(digit), fill=colour, font=font, stroke_width=2, stroke_fill=colour
                )
                angle = float(rng.uniform(-25, 25))
                image = image.rotate(angle, fillcolor=tuple(int(v) for v in background))
                image.resize((32, 32), Image.BILINEAR).save(os.path.join(folder, f"{index}.png"))
    return root


def train(dataset: str, seed: str, precision: str, model_dir: str) -> tuple[float, float]:
    """One training run: (its test top-1, its wall time in seconds)."""
    command = [sys.executable, "-m", "resnet_app.train", f"--config={_CONFIG.value}"]
    command += [f"--dataset={dataset}", f"--seed={seed}", f"--precision={precision}"]
    command += [f"--model_dir={model_dir}"]
    if dataset.startswith("folder:"):
        command.append(f"--epochs={_DIGITS_EPOCHS.value}")
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    records = metrics.read_records(os.path.join(model_dir, metrics.METRICS_FILE))
    return [r for r in records if "top1" in r][-1]["top1"], elapsed


def main(argv: list[str]) -> None:
    del argv
    from resnet_app.common import hardware

    work = _WORK.value or tempfile.mkdtemp(prefix="precision_parity_")
    names = {"shapes": "shapes"}
    if "digits" in _DATASETS.value:
        root = os.path.join(work, "digits")
        if not os.path.isdir(root):
            write_digits(root, _PER_DIGIT.value, max(1, _PER_DIGIT.value // 5))
        names["digits"] = f"folder:{root}"
    lines = [f"CPU: {hardware.read_cpu_info().describe()}", f"recipe: {_CONFIG.value}"]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for name in _DATASETS.value:
        for seed in _SEEDS.value:
            for precision in _PRECISIONS.value:
                model_dir = os.path.join(work, f"{name}_{precision}_{seed}")
                top1, seconds = train(names[name], seed, precision, model_dir)
                results.setdefault((name, precision), []).append((top1, seconds))
                logging.info(
                    "%s seed %s %s: top-1 %.4f in %.0f s", name, seed, precision, top1, seconds
                )
    lines.append(
        f"{'dataset':<8} {'precision':<9} {'top-1 per seed':<32} {'mean':>7} {'sd':>6} {'s/run':>6}"
    )
    for (name, precision), runs in results.items():
        accuracies = [top1 for top1, _ in runs]
        spread = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
        shown = ", ".join(f"{100 * a:.2f}" for a in accuracies)
        seconds = statistics.mean(s for _, s in runs)
        lines.append(
            f"{name:<8} {precision:<9} {shown:<32} {100 * statistics.mean(accuracies):>6.2f}% "
            f"{100 * spread:>5.2f} {seconds:>6.0f}"
        )
    if len(_PRECISIONS.value) == 2:
        base, other = _PRECISIONS.value
        for name in _DATASETS.value:
            a, b = results[(name, base)], results[(name, other)]
            differences = [100 * (y[0] - x[0]) for x, y in zip(a, b)]
            ratio = statistics.mean(s for _, s in a) / statistics.mean(s for _, s in b)
            lines.append(
                f"{name}: {other} - {base} per seed {', '.join(f'{d:+.2f}' for d in differences)} "
                f"points (mean {statistics.mean(differences):+.2f}); time {base}/{other} "
                f"{ratio:.2f}x"
            )
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    app.run(main)
