"""What a pipeline's images are made into, and why: their size, channels, statistics and recipe.

Each comes from the first of: the config (`data.image_size`, `data.channels`, `data.mean`
and `data.std`), what the run directory recorded (`Recorded`), the source itself, a
measurement of the training split (`image_facts`, only for what the others leave unsaid),
or a fallback (the preset's size, ImageNet's statistics). `choose` also gives the words
the start line prints for each.

Size (`choose_image_size`), the first that applies: `data.image_size`; the dataset's own
size when all its images have one (cifar10, shapes: 32); the model preset's input size;
224. A run whose data_info.json records another size (trained before this rule) keeps it.
The recipe (`choose_recipe`): "auto" is the CIFAR one up to 64 px, the ImageNet one above.
"""

from __future__ import annotations

import dataclasses

from resnet_app.common.errors import ConfigError
from resnet_app.data import channels, image_facts, preprocessing
from resnet_app.data.families import FAMILIES
from resnet_app.data.settings import DataConfig

CIFAR_MAX_SIZE = 64  # "auto": the CIFAR recipe up to this size.
FALLBACK_IMAGE_SIZE = 224  # Data without a size, when no model says otherwise.


@dataclasses.dataclass(frozen=True)
class ImageSize:
    """The size a pipeline produces, in pixels, and why ("the dataset's size")."""

    size: int
    reason: str


def choose_image_size(
    config: DataConfig,
    dataset_size: int | None,
    model_size: int | None = None,
    model_name: str | None = None,
    recorded_size: int | None = None,
) -> ImageSize:
    """The size (see the module doc) and why; `dataset_size` is None when the images vary
    or there is no source, `recorded_size` the one in the run's data_info.json."""
    if config.image_size:
        return ImageSize(config.image_size, "set by data.image_size")
    if dataset_size:
        chosen = ImageSize(dataset_size, "the dataset's size")
    else:
        why = "synthetic images have none" if config.dataset == "synthetic" else "images vary"
        if model_size:
            name = f"the {model_name} preset's" if model_name else "the model's"
            chosen = ImageSize(model_size, f"{name} input size ({why})")
        else:
            chosen = ImageSize(FALLBACK_IMAGE_SIZE, f"the default ({why})")
    if recorded_size and recorded_size != chosen.size:
        return ImageSize(
            recorded_size,
            f"as this run was trained (its run directory says), not {chosen.size} px "
            f"({chosen.reason}); set data.image_size to change it",
        )
    return chosen


def choose_recipe(requested: str, size: int) -> str:
    """The family, "cifar" or "imagenet": `data.preprocessing`, or by `size` when "auto"."""
    if requested == "auto":
        return "cifar" if size <= CIFAR_MAX_SIZE else "imagenet"
    return requested


def describe_choice(image_size: ImageSize, requested: str, family: str) -> str:
    """E.g. "32 px, the dataset's size; CIFAR recipe (auto: up to 64 px)", for the start line."""
    if requested == "auto":
        bound = "up to" if family == "cifar" else "above"
        why = f"auto: {bound} {CIFAR_MAX_SIZE} px"
    else:
        why = "set by data.preprocessing"
    return f"{image_size.size} px, {image_size.reason}; {FAMILIES[family].title} ({why})"


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
    # The size, with what was measured or recorded, and why, in its reason.
    measured = dataset_size or (facts.size if facts else None)
    size = choose_image_size(config, measured, preset_size, model_name, recorded.image_size)
    if not dataset_size and recorded.stats and recorded.image_size and not config.image_size:
        size = ImageSize(recorded.image_size, "as this run was trained (data_info.json)")
    elif not dataset_size and facts and size.reason == "the dataset's size":
        reason = f"the dataset's size, in all {facts.measured:,} images measured"
        size = ImageSize(size.size, reason)
    mean, std, stats_origin = _stats(config, facts, recorded, count)
    return Chosen(size, count, f"{channels.name(count)}, {why}", mean, std, stats_origin, facts)
