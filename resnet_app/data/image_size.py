"""The image size and preprocessing recipe of a pipeline: the one rule, and why.

Size (`choose_image_size`): `data.image_size` if set; else the dataset's own
size when all its images have one (cifar10, shapes: 32); else the model
preset's input size (224 for the ImageNet-stem presets, 32 for the CIFAR ones).
A run directory whose `data_info.json` records another size (a run trained
before this rule) keeps its size. The recipe follows (`choose_recipe`): "auto"
is the CIFAR recipe up to 64 px, the ImageNet one above. `describe_choice`
says which size and recipe were chosen, and why, for the start-up log line.

No TensorFlow: pure functions of the config and the sizes.
"""

from __future__ import annotations

import dataclasses

from resnet_app.data.families import FAMILIES  # The titles; no TensorFlow.
from resnet_app.data.settings import DataConfig

# Images up to this size use the CIFAR recipe when the family is "auto".
CIFAR_MAX_SIZE = 64
# The size of data that has none, when no model says otherwise.
FALLBACK_IMAGE_SIZE = 224


@dataclasses.dataclass(frozen=True)
class ImageSize:
    """The size a pipeline produces, and why (see `choose_image_size`).

    Attributes:
      size: height and width in pixels.
      reason: why this size, e.g. "the dataset's size".
    """

    size: int
    reason: str


def choose_image_size(
    config: DataConfig,
    dataset_size: int | None,
    model_size: int | None = None,
    model_name: str | None = None,
    recorded_size: int | None = None,
) -> ImageSize:
    """The one rule for the image size; the first that applies wins.

    1. `data.image_size`, when set;
    2. the dataset's own size, when every image has it (cifar10, shapes: 32);
    3. the model preset's input size (224 for ImageNet stems, 32 for CIFAR
       stems), else 224.

    A run whose data_info.json records another size (trained before this
    rule, when the model's preset won over the dataset) keeps that size.

    Args:
      config: the data config.
      dataset_size: the source's fixed image size, or None when it varies
        (folders, imagenet2012) or there is no source (synthetic).
      model_size: the model preset's `default_image_size`.
      model_name: the preset's name, for the reason.
      recorded_size: the image size in the run's data_info.json, if any.

    Returns:
      The size, and why.
    """
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
    """The preprocessing family: `data.preprocessing`, or by size when "auto".

    Args:
      requested: `data.preprocessing` ("auto", "cifar" or "imagenet").
      size: the chosen image size.

    Returns:
      "cifar" or "imagenet".
    """
    if requested == "auto":
        return "cifar" if size <= CIFAR_MAX_SIZE else "imagenet"
    return requested


def describe_choice(image_size: ImageSize, requested: str, family: str) -> str:
    """The image size and recipe, and why, for the start-up log line.

    Args:
      image_size: the chosen size and its reason.
      requested: `data.preprocessing`.
      family: the chosen recipe (`choose_recipe`).

    Returns:
      E.g. "32 px, the dataset's size; CIFAR recipe (auto: up to 64 px)".
    """
    if requested == "auto":
        bound = "up to" if family == "cifar" else "above"
        why = f"auto: {bound} {CIFAR_MAX_SIZE} px"
    else:
        why = "set by data.preprocessing"
    return f"{image_size.size} px, {image_size.reason}; {FAMILIES[family].title} ({why})"
