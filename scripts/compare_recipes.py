"""Do the modern training pieces help? The shapes recipe against a modern one, on little data.

  python scripts/compare_recipes.py [--work_dir=DIR] [--epochs=100] [--seeds=0,1]
      [--train_examples=2000] [--recipes=plain,modern]

Trains ResNet-20 on the first `--train_examples` of the built-in offline
`shapes` training images with each recipe of `--recipes`, at the same budget
(`--epochs`, batch 128, SGD with momentum 0.9, cosine from LR 0.1 after a
0.2-epoch warmup: `configs/shapes_resnet20.yaml`), once per seed:

- plain: the shapes recipe as it is (pad 4, crop, flip);
- modern: the same plus the pieces of `configs/cifar10_resnet18_modern.yaml`,
  scaled for a network of 0.27M parameters and a run of about 1,600 steps:
  Mixup 0.2 or CutMix 1.0 (one of the two per batch), RandAugment N=2, M=5,
  random erasing p=0.25, label smoothing 0.1, stochastic depth 0.05 and an EMA
  of the weights with decay 0.99 (a horizon of about 100 steps, 6 epochs);
- mild: a gentler modern recipe: Mixup 0.1 without CutMix, RandAugment N=1,
  M=3, and the rest as in modern.

Each run is evaluated once, at its end, on all 10,000 `shapes` test images
(top-1; with an EMA also the average's, `ema_top1`). The runs go under
--work_dir (default: a temp dir), one directory per recipe and seed; a run
whose directory already holds its end resumes there and only evaluates.
Slow (several minutes per run on 2 cores): not part of the test suite. Prints
one JSON line per run and a markdown table.
"""

import json
import os
import sys
import tempfile
import time

from absl import flags, logging

from resnet_app.common import cli
from resnet_app.common.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES_RECIPE = os.path.join(REPO, "configs", "shapes_resnet20.yaml")
_MODERN_SHARED = [
    "data.augment.erase_probability=0.25",
    "train.label_smoothing=0.1",
    "model.drop_path_rate=0.05",
    "train.ema_decay=0.99",
]
# Each recipe: the --set strings it adds to the shapes recipe.
RECIPES = {
    "plain": [],
    "modern": [
        "data.mix.mixup_alpha=0.2",
        "data.mix.cutmix_alpha=1.0",
        "data.augment.randaugment_ops=2",
        "data.augment.randaugment_magnitude=5",
        *_MODERN_SHARED,
    ],
    "mild": [
        "data.mix.mixup_alpha=0.1",
        "data.augment.randaugment_ops=1",
        "data.augment.randaugment_magnitude=3",
        *_MODERN_SHARED,
    ],
}

_WORK_DIR = flags.DEFINE_string("work_dir", None, "Where the runs go (default: a temp dir).")
_EPOCHS = flags.DEFINE_float("epochs", 100, "Epochs of every run.")
_TRAIN_EXAMPLES = flags.DEFINE_integer(
    "train_examples", 2000, "Training images: the first N of shapes's 50,000."
)
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds (train.seed) of each recipe's runs.")
_RECIPES = flags.DEFINE_list(
    "recipes", ["plain", "modern"], f"Recipes to run, in order: {', '.join(RECIPES)}."
)


def run(config_sets: list[str], model_dir: str) -> dict:
    """Trains the shapes recipe with `config_sets` into `model_dir`; returns its last evaluation."""
    from resnet_app import config
    from resnet_app.engine import loop

    resolved = config.resolve(SHAPES_RECIPE, sets=config_sets)
    started = time.monotonic()
    summary = loop.train_and_evaluate(resolved, model_dir).summary
    result = {
        key: summary[key]
        for key in ("step", "top1", "ema_top1", "num_examples", "train_loss")
        if key in summary
    }
    return {**result, "seconds": round(time.monotonic() - started, 1)}


def markdown_table(results: list[dict], recipes: list[str]) -> str:
    """One row per seed: each recipe's top-1, and its EMA's where it has one."""
    columns = []
    for recipe in recipes:
        has_ema = any("ema_top1" in r for r in results if r["recipe"] == recipe)
        columns.append((recipe, "top1", f"{recipe} top-1" + (" (raw)" if has_ema else "")))
        if has_ema:
            columns.append((recipe, "ema_top1", f"{recipe} top-1 (EMA)"))
    by_key = {(r["seed"], r["recipe"]): r for r in results}
    lines = [
        "| seed | " + " | ".join(title for _, _, title in columns) + " |",
        "|-----:|" + "|".join("-" * (len(title) + 1) + ":" for _, _, title in columns) + "|",
    ]
    for seed in sorted({r["seed"] for r in results}):
        cells = []
        for recipe, key, _ in columns:
            value = by_key.get((seed, recipe), {}).get(key)
            cells.append("-" if value is None else f"{100 * value:.1f}%")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    unknown = [name for name in _RECIPES.value if name not in RECIPES]
    if unknown:
        raise ConfigError(f"--recipes: unknown recipe {unknown[0]!r}; use {', '.join(RECIPES)}")
    if _EPOCHS.value <= 0 or _TRAIN_EXAMPLES.value < 128:
        raise ConfigError("--epochs must be more than 0 and --train_examples at least 128")
    work = _WORK_DIR.value or tempfile.mkdtemp(prefix="compare_recipes_")
    common = [
        f"data.train_examples={_TRAIN_EXAMPLES.value}",
        f"train.epochs={_EPOCHS.value}",
        "train.eval_every=1000000000",  # Only at the end, which always evaluates.
    ]
    results = []
    for seed in (int(seed) for seed in _SEEDS.value):
        for recipe in _RECIPES.value:
            model_dir = os.path.join(work, f"{recipe}_{seed}")
            sets = [*common, f"train.seed={seed}", *RECIPES[recipe]]
            logging.info("Recipe %s, seed %d: --set %s", recipe, seed, " ".join(sets))
            record = {"seed": seed, "recipe": recipe, **run(sets, model_dir)}
            record.update(model_dir=model_dir, epochs=_EPOCHS.value)
            results.append(record)
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()
    sys.stdout.write(markdown_table(results, _RECIPES.value))


if __name__ == "__main__":
    cli.run(main)
