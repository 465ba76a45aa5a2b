"""`DataConfig`: every setting of the input pipeline, validated, without TensorFlow.

Kept apart from `data/input_pipeline.py` so that command-line tools can check a user's flags
before paying for the TensorFlow import.
"""

from __future__ import annotations

import dataclasses
import math

from resnet_app.common import checks
from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import SET_BY, resumable
from resnet_app.data.class_balance import SAMPLINGS

FAMILIES = ("auto", "cifar", "imagenet")
DTYPES = ("float32", "bfloat16", "float16")
# RandAugment's op list has 14 ops (data/randaugment.py); magnitudes above the
# 0-10 scale extrapolate, up to 30.
MAX_RANDAUGMENT_OPS = 14
MAX_RANDAUGMENT_MAGNITUDE = 30.0


MIX_MODES = ("batch", "example")


@dataclasses.dataclass(frozen=True)
class MixSettings:
    """Mixup and CutMix settings (`data.` config keys).

    Attributes:
      mixup_alpha: Beta(alpha, alpha) of Mixup's share; 0 for no Mixup.
      cutmix_alpha: Beta(alpha, alpha) of CutMix's share; 0 for no CutMix.
      switch_prob: with both on, the probability of CutMix for a draw.
      mode: "batch" (one draw per batch) or "example" (one per example).
    """

    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    switch_prob: float = 0.5
    mode: str = "batch"

    def __post_init__(self):
        for name in ("mixup_alpha", "cutmix_alpha"):
            if getattr(self, name) < 0:
                raise ConfigError(f"data.{name}={getattr(self, name)}; use 0 (off) or more")
        if not 0 <= self.switch_prob <= 1:
            raise ConfigError(f"data.mix_switch_prob={self.switch_prob}; use a value in [0, 1]")
        if self.mode not in MIX_MODES:
            raise ConfigError(f"data.mix_mode={self.mode!r}; use one of {', '.join(MIX_MODES)}")

    @property
    def enabled(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Everything about the input; every field is a config key and a flag.

    Attributes:
      dataset: "shapes", "synthetic", "folder:PATH" or a tfds name.
      data_dir: tfds data directory, and where `shapes` is cached (default:
        tfds's ~/tensorflow_datasets and ~/.cache/resnet_app).
      image_size: output size (default: the dataset's own size when all its
        images have one, e.g. 32 for cifar10 and shapes; else the model
        preset's input size, 224 for the ImageNet-stem presets and 32 for
        the CIFAR ones; a run trained with another size keeps it).
      preprocessing: "cifar", "imagenet" or "auto" (CIFAR up to 64 pixels).
      mean: per-channel mean, 0-255 scale (default: measured on the training
        split of in-memory data, else ImageNet's).
      std: per-channel standard deviation, 0-255 scale (default: as `mean`).
      crop_padding: CIFAR recipe: padding before the random crop.
      flip: random horizontal flips in training.
      area_range: ImageNet recipe: the crop's area fraction range.
      aspect_ratio_range: ImageNet recipe: the crop's aspect ratio range.
      eval_resize: ImageNet recipe: shorter side before the central crop
        (default: the evaluation size / 0.875, so 256 for 224).
      eval_image_size: ImageNet recipe: the evaluation's central crop, when
        it differs from the training size (default: image_size). Testing at
        a larger size than training corrects the apparent objects' size
        (Touvron et al. 2019); Wightman et al. 2021's A3 trains at 160 and
        tests at 224. Export and predict use it too.
      randaugment_ops: RandAugment (Cubuk et al. 2020) in training: ops applied
        to each image, drawn from 14 (0: off; 2 is the usual choice).
      randaugment_magnitude: RandAugment's magnitude M, on the 0-10 scale of
        TF and timm (up to 30 extrapolates); 9 is the usual ImageNet value.
      randaugment_prob: the chance each of an image's RandAugment ops is
        applied (else skipped); 1 applies them all (the paper), timm's
        default is 0.5 ("ResNet strikes back" used it).
      randaugment_magnitude_std: each op's magnitude drawn per image from
        N(M, std), clipped to [0, max(10, M)] (timm's "mstd"; 0.5 in "ResNet
        strikes back"); 0 uses M for all.
      erase_probability: random erasing (Zhong et al. 2020) in training: the
        chance an image has a box replaced by normal noise (0: off; 0.25 in
        timm's recipes).
      erase_area_range: random erasing: the box's area fraction range.
      erase_aspect_range: random erasing: the box's height / width range.
      mixup_alpha: Mixup (Zhang et al. 2018) in training: each image blended
        with its partner in the global batch by a Beta(alpha, alpha) share;
        0 for none (`data/mixing.py`).
      cutmix_alpha: CutMix (Yun et al. 2019): a box of the partner pasted in,
        its area from Beta(alpha, alpha); 0 for none.
      mix_switch_prob: with both on, the probability of CutMix for a draw.
      mix_mode: "batch" (one draw per batch) or "example" (one per example).
      validation_split: training examples held out as the "holdout" split for
        model selection (after `train_examples`); evaluation then uses it
        instead of the test set.
      eval_split: the split to evaluate on (default: "holdout" when held out,
        else the dataset's validation or test split).
      train_examples: use only the first N training examples (all if None).
      eval_examples: use only the first N evaluation examples (all if None).
      shuffle_buffer: streamed datasets: examples in the shuffle buffer.
      seed: the data order and augmentation seed (in a training config:
        train.seed).
      dtype: the images' dtype: float32, bfloat16 or float16. In a training
        config it defaults to None, meaning train.precision's (see
        `config.Config`); the pipeline needs it set.
      num_classes: `synthetic` only: the number of labels.
      class_names: `csv:` and `tfrecord:` sources: the classes, in label order,
        when the labels are integer ids (default: the class texts of TFRecords;
        a table's label names, sorted; else the ids themselves).
      multi_label: `csv:` sources: several labels per image (default: when a
        label cell holds several space-separated names); true or false forces it.
      label_offset: `tfrecord:` sources: subtracted from every stored label
        (1 for ImageNet's files, whose labels start at 1).
      image_key: `tfrecord:` sources: the feature with the encoded image.
      label_key: `tfrecord:` sources: the int64 label feature.
      text_key: `tfrecord:` sources: the class-name feature, read when present.
      sampling: "natural" (each epoch visits every example once) or
        "balanced" (each draw picks a class uniformly, then one of its
        examples: `data/class_balance.py`); sources read by index.
    """

    dataset: str = "shapes"
    data_dir: str | None = resumable(None)
    image_size: int | None = None
    preprocessing: str = "auto"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    crop_padding: int = 4
    flip: bool = True
    area_range: tuple[float, float] = (0.08, 1.0)
    aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3)
    eval_resize: int | None = resumable(None)
    eval_image_size: int | None = resumable(None)
    randaugment_ops: int = 0
    randaugment_magnitude: float = 9.0
    randaugment_prob: float = 1.0
    randaugment_magnitude_std: float = 0.0
    erase_probability: float = 0.0
    erase_area_range: tuple[float, float] = (0.02, 1 / 3)
    erase_aspect_range: tuple[float, float] = (0.3, 1 / 0.3)
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    mix_switch_prob: float = 0.5
    mix_mode: str = "batch"
    validation_split: int = 0
    eval_split: str | None = resumable(None)
    train_examples: int | None = None
    eval_examples: int | None = resumable(None)
    shuffle_buffer: int = 10_000
    # Not a `data.` config key of its own.
    seed: int = dataclasses.field(default=0, metadata={SET_BY: "train.seed"})
    dtype: str | None = "float32"
    num_classes: int = 10
    class_names: tuple[str, ...] | None = None
    multi_label: bool | None = None
    label_offset: int = 0
    image_key: str = "image/encoded"
    label_key: str = "image/class/label"
    text_key: str = "image/class/text"
    sampling: str = "natural"

    def __post_init__(self):
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ConfigError(message)

        check(bool(self.dataset), "dataset must not be empty; try --dataset=shapes")
        check(
            self.sampling in SAMPLINGS,
            f"sampling={self.sampling!r}; use one of {', '.join(SAMPLINGS)}",
        )
        check(
            self.class_names is None or len(set(self.class_names)) == len(self.class_names) > 0,
            f"class_names={list(self.class_names or ())} must be distinct names, at least one",
        )
        check(
            self.preprocessing in FAMILIES,
            f"preprocessing={self.preprocessing!r}; use one of {', '.join(FAMILIES)}",
        )
        check(
            self.dtype is None or self.dtype in DTYPES,
            f"dtype={self.dtype!r}; use one of {', '.join(DTYPES)}",
        )
        check(
            self.image_size is None or self.image_size >= 8,
            f"image_size={self.image_size}; use at least 8",
        )
        check(
            self.eval_image_size is None or self.eval_image_size >= 8,
            f"eval_image_size={self.eval_image_size}; use at least 8",
        )
        check(
            self.eval_resize is None or self.eval_resize >= 8,
            f"eval_resize={self.eval_resize}; use at least the image size",
        )
        checks.at_least("crop_padding", self.crop_padding, 0)
        checks.at_least("validation_split", self.validation_split, 0)
        for name in ("shuffle_buffer", "num_classes", "train_examples", "eval_examples"):
            checks.at_least(name, getattr(self, name))
        for name in ("area_range", "aspect_ratio_range", "erase_area_range", "erase_aspect_range"):
            value = getattr(self, name)
            check(len(value) == 2, f"{name} needs 2 values, low and high; got {len(value)}")
            low, high = value
            check(0 < low <= high, f"{name}=({low}, {high}); need 0 < low <= high")
        for name in ("area_range", "erase_area_range"):
            value = getattr(self, name)
            check(value[1] <= 1, f"{name}={value}; the area is at most 1")
        for name in ("mean", "std"):
            value = getattr(self, name)
            check(value is None or len(value) == 3, f"{name} needs 3 values, one per channel")
        check(self.std is None or min(self.std) > 0, f"std={self.std}; must be positive")
        self.mix_settings()  # Checks the Mixup and CutMix values.
        self._check_augmentation()

    def _check_augmentation(self) -> None:
        ops, magnitude = self.randaugment_ops, self.randaugment_magnitude
        if not 0 <= ops <= MAX_RANDAUGMENT_OPS:
            raise ConfigError(
                f"randaugment_ops={ops}; use 0 (off) to {MAX_RANDAUGMENT_OPS}, e.g. 2"
            )
        if not 0 <= magnitude <= MAX_RANDAUGMENT_MAGNITUDE:
            raise ConfigError(
                f"randaugment_magnitude={magnitude}; use 0 to {MAX_RANDAUGMENT_MAGNITUDE:g} "
                "(10 is the scale's top), e.g. 9"
            )
        if not 0 <= self.randaugment_prob <= 1:
            raise ConfigError(
                f"randaugment_prob={self.randaugment_prob}; use 0 to 1 (1: every op applies), "
                "e.g. 0.5"
            )
        std = self.randaugment_magnitude_std
        if not 0 <= std < math.inf:  # Also refuses NaN.
            raise ConfigError(
                f"randaugment_magnitude_std={std}; use 0 (off) or a finite value above, e.g. 0.5 "
                "(timm's uniform magnitudes, an infinite std, are not implemented)"
            )
        if not 0 <= self.erase_probability <= 1:
            raise ConfigError(
                f"erase_probability={self.erase_probability}; use 0 (off) to 1, e.g. 0.25"
            )

    def mix_settings(self) -> MixSettings:
        """The Mixup and CutMix settings (`data/mixing.py`)."""
        return MixSettings(self.mixup_alpha, self.cutmix_alpha, self.mix_switch_prob, self.mix_mode)
