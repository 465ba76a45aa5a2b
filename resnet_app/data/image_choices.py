"""What a pipeline's images are made into, and why: their size, channels and statistics.

Each comes from the first of: the config (`data.image_size`, `data.channels`, `data.mean`
and `data.std`), what the run directory recorded (`Recorded`), the source itself, a
measurement of the training split (`image_facts`, only for what the others leave unsaid),
or a fallback (the preset's size, ImageNet's statistics). `choose` also gives the words
the start line prints for each.
"""

from __future__ import annotations

import dataclasses

from resnet_app.common.errors import ConfigError
from resnet_app.data import channels, image_facts, preprocessing
from resnet_app.data.image_size import ImageSize, choose_image_size
from resnet_app.data.settings import DataConfig


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What a run directory's data_info.json says: the size it trained at, the (mean, std)
    it normalized with, and the channels of a run recorded without statistics (older
    files: RGB); None where it says nothing."""

    image_size: int | None = None
    stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    channels: int | None = None

    @property
    def trained_channels(self) -> int | None:
        """The input channels the run trained with (None: nothing recorded)."""
        return len(self.stats[0]) if self.stats else self.channels


def _channels(config: DataConfig, recorded: Recorded, train) -> tuple[int | None, str]:
    """(input channels, why), without measuring (None: measure): data.channels, what the
    run recorded, the count data.mean or data.std give, the kind of images in memory."""
    given = config.mean or config.std
    if config.channels:
        return config.channels, "set by data.channels"
    if recorded.trained_channels:
        return recorded.trained_channels, "as this run was trained (data_info.json)"
    if given:
        return len(given), f"as data.{'mean' if config.mean else 'std'} gives"
    if train is None:
        return channels.RGB, "synthetic"
    if not train.encoded:
        return channels.native(train.images.shape[-1]), "the data's"
    return None, "the data's own, in the images measured"


def _stats(config: DataConfig, facts, recorded: Recorded, count: int) -> tuple[tuple, tuple, str]:
    """(mean, std, where they come from), `count` values each: set, recorded, measured, or
    ImageNet's (greyscale: their means)."""
    if config.mean is not None and config.std is not None:
        return config.mean, config.std, "set by data.mean and data.std"
    if recorded.stats is not None:
        found, origin = recorded.stats, "as this run recorded them (data_info.json)"
    elif facts is not None:
        found, origin = (facts.mean, facts.std), facts.describe()
    else:
        found = (preprocessing.IMAGENET_MEAN, preprocessing.IMAGENET_STD)
        if count == channels.GREY:
            found = tuple((sum(values) / len(values),) for values in found)
        origin = "ImageNet's (no training images to measure)"
    mean, std = config.mean or found[0], config.std or found[1]
    if config.mean is not None or config.std is not None:
        origin += ", one of them set by data." + ("mean" if config.mean is not None else "std")
    for name, values in (("mean", mean), ("std", std)):
        if len(values) != count:
            raise ConfigError(
                f"data.{name} has {len(values)} values but the images have {count} "
                f"channels ({channels.name(count)}); give {count}, or set data.channels"
            )
    return tuple(mean), tuple(std), origin


def _image_size(config, dataset_size, facts, recorded: Recorded, preset_size, model_name):
    """`choose_image_size` with what was measured or recorded, and why, in its reason."""
    chosen = choose_image_size(
        config,
        dataset_size or (facts.size if facts else None),
        preset_size,
        model_name,
        recorded.image_size,
    )
    if not dataset_size and recorded.stats and recorded.image_size and not config.image_size:
        return ImageSize(recorded.image_size, "as this run was trained (data_info.json)")
    if not dataset_size and facts and chosen.reason == "the dataset's size":
        reason = f"the dataset's size, in all {facts.measured:,} images measured"
        return ImageSize(chosen.size, reason)
    return chosen


@dataclasses.dataclass(frozen=True)
class Chosen:
    """A pipeline's image size, channels (1 or 3) and statistics (0-255 scale), with where
    each comes from, and the measurement when one was made."""

    image_size: ImageSize
    channels: int
    channels_origin: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    stats_origin: str
    facts: image_facts.Facts | None


def choose(
    config: DataConfig, source, train, recorded: Recorded, preset_size, model_name
) -> Chosen:
    """The `Chosen` of a pipeline (`source` and its `train` split None for synthetic data);
    the training split is measured only for what is unsaid."""
    dataset_size = source.image_size if source is not None else None
    needs_stats = (config.mean is None or config.std is None) and recorded.stats is None
    needs_size = not (dataset_size or config.image_size or recorded.image_size)
    known, why = _channels(config, recorded, train)
    facts = None
    if train is not None and (needs_stats or needs_size or not known):
        facts = image_facts.measure(train, preprocessing.decode_image, known)
    count = known or facts.channels
    size = _image_size(config, dataset_size, facts, recorded, preset_size, model_name)
    mean, std, stats_origin = _stats(config, facts, recorded, count)
    return Chosen(size, count, f"{channels.name(count)}, {why}", mean, std, stats_origin, facts)
