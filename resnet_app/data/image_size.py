"""The image size and preprocessing recipe of a pipeline: the one rule, and why.

Size (`choose_image_size`), the first that applies: `data.image_size`; the dataset's own
size when all its images have one (cifar10, shapes: 32); the model preset's input size;
224. A run whose data_info.json records another size (trained before this rule) keeps it.
The recipe (`choose_recipe`): "auto" is the CIFAR one up to 64 px, the ImageNet one above.
No TensorFlow.
"""

from __future__ import annotations

import dataclasses

from resnet_app.data.families import FAMILIES  # The titles; no TensorFlow.
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
