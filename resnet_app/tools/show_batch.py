"""Saves a grid of augmented training images with their label names.

  resnet-app show-batch --dataset=shapes --out=batch.png
  resnet-app show-batch --dataset=cifar10 --split=test --out=test.png

Exactly what the model is fed (AugMix's views in a row), un-normalized for
display; every data flag of training is accepted. Needs requirements-plot.txt.
"""

import math
import os

from absl import flags, logging

from resnet_app.common import checks, cli, files
from resnet_app.common.errors import ConfigError
from resnet_app.data.settings import DataConfig
from resnet_app.data.sources import registry

_OUT = flags.DEFINE_string("out", "batch.png", "Where to write the PNG.")
_COUNT = flags.DEFINE_integer("count", 32, "How many images.")
_SPLIT = flags.DEFINE_string(
    "split", None, "Show this evaluation split instead of augmented training images."
)
cli.define_config_flags(DataConfig)


def label_text(label, class_names) -> str:
    """A title: the class name, or a multi-label image's names joined (its multi-hot row)."""
    import numpy as np

    label = np.asarray(label)
    if label.ndim == 0:
        return class_names[int(label)]
    return " ".join(class_names[i] for i in np.flatnonzero(label > 0)) or "(no label)"


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    config = cli.config_from_flags(DataConfig)
    registry.check_source(config)  # Before TensorFlow loads.
    checks.at_least("--count", _COUNT.value)
    out_dir = os.path.dirname(os.path.abspath(_OUT.value))
    if not os.path.isdir(out_dir):
        raise ConfigError(f"--out={_OUT.value}: directory {out_dir} does not exist")
    cli.use_matplotlib("show-batch")
    import matplotlib.pyplot as plt
    import numpy as np

    from resnet_app.data import input_pipeline

    pipeline = input_pipeline.create_pipeline(config)
    count = _COUNT.value
    if _SPLIT.value:
        dataset = pipeline.eval_dataset(count, split=_SPLIT.value)
    else:
        dataset = pipeline.train_dataset(count)
    batch = next(iter(dataset))
    mask = batch["mask"].numpy() > 0
    images = batch["image"].numpy().astype(np.float32)
    labels = batch["label"].numpy()
    views = 1
    if "augmix_views" in batch:  # Each example's plain image, then its two AugMix, in a row.
        stacked = [images[:, None], batch["augmix_views"].numpy().astype(np.float32)]
        views = 1 + stacked[1].shape[1]
        images = np.concatenate(stacked, axis=1).reshape(-1, *images.shape[1:])
        mask, labels = np.repeat(mask, views), np.repeat(labels, views)
    images, labels = images[mask], labels[mask]
    mean = np.array(pipeline.preprocessing.mean, np.float32)
    std = np.array(pipeline.preprocessing.std, np.float32)
    pixels = np.clip((images * std + mean) / 255, 0, 1)

    columns = min(8 if views == 1 else 2 * views, len(pixels))
    rows = math.ceil(len(pixels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(1.6 * columns, 1.8 * rows), squeeze=False)
    for axis in axes.flat:
        axis.axis("off")
    for axis, image, label in zip(axes.flat, pixels, labels):
        if image.shape[-1] == 1:  # Greyscale: drawn in grey, not a colour map.
            axis.imshow(image[..., 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        else:
            axis.imshow(image, interpolation="nearest")
        axis.set_title(label_text(label, pipeline.class_names), fontsize=8)
    figure.suptitle(f"{config.dataset}: {pipeline.preprocessing.family} preprocessing", fontsize=9)
    figure.tight_layout()
    files.save_figure(figure, _OUT.value)
    logging.info("Wrote %d images to %s", len(pixels), _OUT.value)


if __name__ == "__main__":
    cli.run(main)
