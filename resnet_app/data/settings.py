"""`DataConfig`: every setting of the input pipeline, validated without TensorFlow (so
command-line tools check flags before importing it).

The data section nests its groups: `data.augment` (`AugmentSettings`, which the
resolved `Preprocessing` holds), `data.mix`, `data.records` and
`data.progressive`. The flat keys before them (`data.flip`, `data.mix_mode`, ...)
are moved into their groups when read (`common/migration.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from resnet_app.common import fields, migration, precision
from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import Rule, setting
from resnet_app.data.class_balance import SAMPLINGS
from resnet_app.data.sources import image_files

FAMILIES = ("auto", "cifar", "imagenet")
# data.channels: unset (the data's own), greyscale or RGB.
CHANNELS = (None, 1, 3)
# RandAugment's ops per image; magnitudes above the 0-10 scale extrapolate, up to 30.
MAX_RANDAUGMENT_OPS = 14
MAX_RANDAUGMENT_MAGNITUDE = 30.0
MIX_MODES = ("batch", "example")
# data.augment.auto_augment: torchvision's names (its --auto-augment), each an
# augmentation of that name (`data/augmentations.py`). A dict, read when
# checking, so that a policy registered later (a test's) is a valid choice.
AUTO_AUGMENTS = dict.fromkeys(("none", "ta_wide", "imagenet", "cifar10", "svhn", "augmix"))
AUGMIX_MAX_SEVERITY = 10  # torchvision's _PARAMETER_MAX: its 10 magnitude bins.
AUGMIX_VIEWS = 3  # With AugMix's consistency loss: each example and two AugMix of it.


def dtypes() -> list[str]:
    """The images' dtypes: those the precisions compute in (`common/precision.py`)."""
    return list(dict.fromkeys(p.compute_dtype for p in precision.PRECISIONS.values()))


# What each setting's values may be (`common/fields.Rule`), declared with its field.
IMAGE_SIZE = fields.whole_at_least(8)
WHOLE_OR_0 = fields.whole_at_least(0)
CHANCE = fields.interval(0, 1, high_in=True)  # [0, 1]: from never to always.
AREA = fields.interval(0, 1, low_in=False, high_in=True)  # A share of the image, (0, 1].


def whole_between(low: int, high: int, wanted: str) -> Rule:
    """A whole number from `low` to `high`."""
    return Rule(lambda x: fields.is_whole(x) and low <= x <= high, wanted, int)


RANDAUGMENT_OPS = whole_between(
    0, MAX_RANDAUGMENT_OPS, f"0 (off) to {MAX_RANDAUGMENT_OPS} ops, e.g. 2"
)
RANDAUGMENT_MAGNITUDE = Rule(
    lambda x: fields.is_number(x) and 0 <= x <= MAX_RANDAUGMENT_MAGNITUDE,
    f"0 to {MAX_RANDAUGMENT_MAGNITUDE:g} (10 is the scale's top), e.g. 9",
    float,
)
MAGNITUDE_STD = Rule(
    fields.AT_LEAST_0.test,
    "0 (off) or a finite number above, e.g. 0.5 (timm's uniform magnitudes, an infinite "
    "std, are not implemented)",
    float,
)
AUGMIX_SEVERITY = whole_between(
    1, AUGMIX_MAX_SEVERITY, f"1 to {AUGMIX_MAX_SEVERITY} (the magnitude bins drawn from), e.g. 3"
)
AUGMIX_DEPTH = Rule(
    lambda x: fields.is_whole(x) and (x == -1 or x >= 1),
    "-1 (each chain 1 to 3 ops, drawn) or a whole number of ops, e.g. 2",
    int,
)
CHANNEL_COUNT = Rule(lambda x: x in CHANNELS, "1 (greyscale), 3 (RGB) or unset (the data's)")
DTYPE = Rule(lambda x: x in dtypes(), lambda: "one of: " + ", ".join(dtypes()))
DATASET = Rule(bool, "a dataset name, e.g. shapes")
SEPARATOR = Rule(
    bool,
    "one or more characters (YAML reads a bare | as empty: quote it, label_separator: "
    '"|" in a file, --set \'data.label_separator="|"\')',
)


def _require(*checks: tuple[bool, str]) -> None:
    """Raises the message of the first (condition, message) whose condition is false."""
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


AUGMIX_SETTINGS = tuple(f"augmix_{name}" for name in ("severity", "width", "depth", "alpha"))
AUGMIX_SETTINGS += ("augmix_all_ops", "augmix_jsd")


@dataclasses.dataclass(frozen=True)
class AugmentSettings:
    """The training augmentation (`data.augment.` config keys).

    Attributes:
      crop_padding: CIFAR recipe: padding before the random crop.
      flip: random horizontal flips in training.
      area_range: ImageNet recipe: the crop's area fraction range.
      aspect_ratio_range: ImageNet recipe: the crop's aspect ratio range.
      randaugment_ops: RandAugment (Cubuk et al. 2020): ops per image, each
        drawn from 14 (0: off; 2 is usual).
      randaugment_magnitude: RandAugment's magnitude M on TF's and timm's 0-10
        scale (up to 30 extrapolates); 9 is the usual ImageNet value.
      randaugment_prob: the chance each RandAugment op applies (timm's p, 0.5
        in "ResNet strikes back"; 1, all of them, is the paper's).
      randaugment_magnitude_std: each op's magnitude drawn per image from
        N(M, std), clipped to [0, max(10, M)] (timm's "mstd", 0.5 in "ResNet
        strikes back"); 0: M for all.
      auto_augment: a policy instead of RandAugment, by torchvision's names:
        "ta_wide", TrivialAugment-wide (Müller & Hutter 2021): one op per
        image at one of 31 bins; "imagenet", "cifar10" or "svhn",
        AutoAugment's learned policies (Cubuk et al. 2019): one of 25 two-op
        sub-policies; "augmix", AugMix (Hendrycks et al. 2020): the image
        mixed with `augmix_width` chains of ops; "none": off.
      augmix_severity: AugMix's ops draw their magnitude from the first
        `severity` of 10 bins (torchvision's; default 3).
      augmix_width: AugMix's chains per image (3).
      augmix_depth: the ops in each chain; -1 draws 1 to 3 per chain.
      augmix_alpha: the Dirichlet and Beta parameter of AugMix's weights (1).
      augmix_all_ops: AugMix's op set with Brightness, Color, Contrast and
        Sharpness (torchvision's default; the paper leaves them out, as they
        overlap ImageNet-C's corruptions).
      augmix_jsd: the weight lambda of AugMix's Jensen-Shannon consistency
        loss (the paper's 12; 0: off): each example goes through the network
        as itself and two AugMix of it, and lambda times the divergence of
        the three predictions joins its loss (`engine/losses/consistency.py`).
        Three times the work; single-label data, without Mixup/CutMix or a
        teacher.
      erase_probability: random erasing (Zhong et al. 2020): the chance an
        image has a box replaced by normal noise (0: off; 0.25 in timm's
        recipes).
      erase_area_range: random erasing: the box's area fraction range.
      erase_aspect_range: random erasing: the box's height / width range.
      cutout_size: Cutout (DeVries & Taylor 2017; Page 2018's ResNet-9): a
        square of this side, wholly inside the image, set to the mean
        colour; 0: off.
      repeats: repeated augmentation (Hoffer et al. 2020; timm's
        `--aug-repeats`, torchvision's `RASampler`, 4 in its ResNet-50 V2
        recipe): each example k times in a row, each copy augmented apart,
        the copies spread over a step's replicas; an epoch keeps the
        examples rounded down to 256s and to the global batch
        (`data/repeats.py`). 1: off. Needs data read by index and uniform
        sampling.
    """

    crop_padding: int = setting(4, WHOLE_OR_0)
    flip: bool = True
    area_range: tuple[float, float] = setting((0.08, 1.0), AREA)
    aspect_ratio_range: tuple[float, float] = setting((3 / 4, 4 / 3), fields.MORE_THAN_0)
    randaugment_ops: int = setting(0, RANDAUGMENT_OPS)
    randaugment_magnitude: float = setting(9.0, RANDAUGMENT_MAGNITUDE)
    randaugment_prob: float = setting(1.0, CHANCE)
    randaugment_magnitude_std: float = setting(0.0, MAGNITUDE_STD)
    auto_augment: str = setting("none", fields.one_of(AUTO_AUGMENTS))
    augmix_severity: int = setting(3, AUGMIX_SEVERITY)
    augmix_width: int = setting(3, fields.AT_LEAST_1)
    augmix_depth: int = setting(-1, AUGMIX_DEPTH)
    augmix_alpha: float = setting(1.0, fields.MORE_THAN_0)
    augmix_all_ops: bool = True
    augmix_jsd: float = setting(0.0, fields.AT_LEAST_0)
    erase_probability: float = setting(0.0, CHANCE)
    erase_area_range: tuple[float, float] = setting((0.02, 1 / 3), AREA)
    erase_aspect_range: tuple[float, float] = setting((0.3, 1 / 0.3), fields.MORE_THAN_0)
    cutout_size: int = setting(0, WHOLE_OR_0)
    repeats: int = setting(1, fields.whole_at_least(1))

    def __post_init__(self):
        key = "data.augment."
        fields.check_declared(self, key + "{}")
        checks = []
        for name in ("area_range", "aspect_ratio_range", "erase_area_range", "erase_aspect_range"):
            value = getattr(self, name)  # A tuple of floats: printed as "(low, high)".
            checks += [
                (len(value) == 2, f"{key}{name} needs 2 values, low and high; got {len(value)}"),
                (len(value) != 2 or value[0] <= value[1], f"{key}{name}={value}; need low <= high"),
            ]
        changed = [*fields.changed_from_defaults(self, AUGMIX_SETTINGS), ""]
        _require(
            *checks,
            (
                self.auto_augment == "none" or not self.randaugment_ops,
                f"{key}auto_augment={self.auto_augment} replaces RandAugment, and "
                f"randaugment_ops={self.randaugment_ops}: set one of them (randaugment_ops=0)",
            ),
            (
                not changed[0] or self.auto_augment == "augmix",
                f"{key}{changed[0]} is AugMix's and auto_augment={self.auto_augment}: set "
                f"{key}auto_augment=augmix or drop it",
            ),
        )

    @property
    def views(self) -> int:
        """Views of each training example the network sees: 3 with AugMix's
        consistency loss (the image and two AugMix), else 1."""
        return AUGMIX_VIEWS if self.auto_augment == "augmix" and self.augmix_jsd > 0 else 1


@dataclasses.dataclass(frozen=True)
class MixSettings:
    """Mixup and CutMix (`data.mix.` config keys; `data/mixing.py`).

    Attributes:
      mixup_alpha: Mixup (Zhang et al. 2018) in training: each image blended
        with its partner in the global batch by a Beta(alpha, alpha) share;
        0 for none.
      cutmix_alpha: CutMix (Yun et al. 2019): a box of the partner pasted in,
        its area from Beta(alpha, alpha); 0 for none.
      switch_prob: with both on, the probability of CutMix for a draw.
      mode: "batch" (one draw per batch) or "example" (one per example).
    """

    mixup_alpha: float = setting(0.0, fields.AT_LEAST_0)
    cutmix_alpha: float = setting(0.0, fields.AT_LEAST_0)
    switch_prob: float = setting(0.5, CHANCE)
    mode: str = setting("batch", fields.one_of(MIX_MODES))

    def __post_init__(self):
        fields.check_declared(self, "data.mix.{}")

    @property
    def enabled(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0


@dataclasses.dataclass(frozen=True)
class RecordSettings:
    """How `tfrecord:` shards are read (`data.records.` config keys; `sources/tfrecord.py`).

    Attributes:
      image_key: the feature with the encoded image.
      label_key: the int64 label feature.
      text_key: the class-name feature, read when present.
      label_offset: subtracted from every stored label (1 for ImageNet's
        files, whose labels start at 1).
    """

    image_key: str = "image/encoded"
    label_key: str = "image/class/label"
    text_key: str = "image/class/text"
    label_offset: int = 0


@dataclasses.dataclass(frozen=True)
class ProgressiveSettings:
    """Progressive resizing: the training image size by epoch (`data.progressive.` keys).

    A ramp (FFCV's): `start_size` until `start_epoch`, then linear to
    `end_size` at `end_epoch`, rounded to a multiple of `multiple`; or a list:
    `sizes[i]` from epoch `epochs[i]` on (fast.ai's 128, 224, 288)
    (`data/progressive.py`). Evaluation, export and predict keep the
    evaluation size.

    Attributes:
      start_size: the ramp's first size (None: no ramp).
      end_size: the ramp's last size (default: the run's image size).
      start_epoch: the epoch the ramp leaves `start_size`.
      end_epoch: the epoch it reaches `end_size` (needed for a ramp).
      multiple: the ramp's sizes are rounded to the nearest multiple of this
        (default: 32, or 8 for images of at most 64 px).
      sizes: the list form's sizes.
      epochs: the list form's first epoch of each size; the first is 0.
    """

    start_size: int | None = setting(None, IMAGE_SIZE)
    end_size: int | None = setting(None, IMAGE_SIZE)
    start_epoch: float = setting(0.0, fields.AT_LEAST_0)
    end_epoch: float | None = setting(None, fields.AT_LEAST_0)
    multiple: int | None = setting(None, fields.AT_LEAST_1)
    sizes: tuple[int, ...] = setting((), IMAGE_SIZE)
    epochs: tuple[float, ...] = setting((), fields.AT_LEAST_0)

    @property
    def enabled(self) -> bool:
        return self.start_size is not None or bool(self.sizes)

    def __post_init__(self):
        key = "data.progressive."
        fields.check_declared(self, key + "{}")
        ramp, listed = self.start_size is not None, bool(self.sizes or self.epochs)
        epochs = list(self.epochs)
        _require(
            (
                not (ramp and listed),
                f"{key}start_size and {key}sizes are two forms of one schedule; give one",
            ),
            (
                not ramp or self.end_epoch is not None and self.end_epoch > self.start_epoch,
                f"{key}end_epoch={self.end_epoch}: a ramp needs 0 <= start_epoch < end_epoch "
                f"(start_epoch={self.start_epoch})",
            ),
            (
                not listed or len(self.sizes) == len(epochs),
                f"{key}sizes has {len(self.sizes)} values and {key}epochs {len(epochs)}; "
                "give one first epoch per size",
            ),
            (
                not listed or epochs[:1] == [0] and epochs == sorted(set(epochs)),
                f"{key}epochs={epochs}; start at 0 and increase, e.g. [0, 10, 14]",
            ),
            (
                listed or ramp or self.multiple is None,
                f"{key}multiple rounds a ramp's sizes; set {key}start_size too",
            ),
        )


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Everything about the input; every field is a config key.

    Attributes:
      dataset: "shapes", "synthetic", "folder:PATH", "csv:FILE",
        "tfrecord:DIR", "idx:DIR", "cifar:PATH", "hf:DIR" or a tfds name (`data/sources/`).
      data_dir: tfds data directory, and where `shapes` and the TFRecord
        indexes are cached (default: tfds's ~/tensorflow_datasets and
        ~/.cache/resnet_app).
      image_size: output size (default: the dataset's own when all its images
        have one, e.g. 32 for cifar10; else the model preset's input size; a
        run trained with another size keeps it).
      preprocessing: "cifar", "imagenet" or "auto" (CIFAR up to 64 pixels).
      channels: the network's input channels, 1 (greyscale) or 3 (RGB)
        (default: 1 when every training image is greyscale, else 3); images
        of the other kind are converted (grey repeated; RGB to luma). Export
        and predict take the trained number.
      mean: per-channel mean, 0-255 scale, one value per channel (default:
        measured on the training split, or a fixed sample of it).
      std: per-channel standard deviation, 0-255 scale (default: as `mean`).
      eval_resize: ImageNet recipe: shorter side before the central crop
        (default: the evaluation size / 0.875, so 256 for 224).
      eval_image_size: ImageNet recipe: the evaluation's central crop, when
        it differs from the training size (default: image_size), as testing
        larger than training does (Touvron et al. 2019; A3 trains at 160,
        tests at 224). Export and predict use it too.
      augment: the training augmentation (`AugmentSettings`).
      mix: Mixup and CutMix (`MixSettings`).
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
      dtype: the images' dtype: float32, bfloat16 or float16 (in a training
        config None: train.precision's).
      num_classes: `synthetic`: the number of labels. `csv:`: confirms integer
        ids far sparser than the classes they imply (ids 0 to num_classes - 1).
        `idx:`: the classes, ids 0 to num_classes - 1 (EMNIST's sets have more
        than 10).
      class_names: `csv:`, `tfrecord:` and `idx:` sources: the classes in label
        order, for integer labels (default: TFRecords' class texts, a table's
        sorted names, Fashion-MNIST's for IDX files in a "fashion" directory,
        else the ids).
      coarse_labels: CIFAR-100 (`cifar:PATH`, or `cifar100`): the 20 coarse
        classes instead of the 100 fine ones.
      multi_label: `csv:` sources: several labels per image (default: when a
        label cell holds several names); true or false forces it.
      label_separator: `csv:` sources: what separates a cell's labels; the
        default, a space, is any run of whitespace (Kaggle's convention).
      records: how `tfrecord:` shards are read (`RecordSettings`).
      in_memory_mb: `folder:`, `csv:` and `hf:` sources: a split whose files
        fit in this many MB is read into memory once; a larger one is read
        from disk as it is used (`hf:`: streamed by row group).
      image_column: `hf:` sources: the image column, when there are several
        (default: the only `Image` feature).
      label_column: `hf:` sources: the label column, when there are several
        (default: the only `ClassLabel`, or list of them for multi-label).
      progressive: the training size by epoch (`ProgressiveSettings`).
      sampling: "natural" (each epoch visits every example once) or
        "balanced" (each draw picks a class uniformly, then one of its
        examples: `data/class_balance.py`); sources read by index.
    """

    dataset: str = setting("shapes", DATASET)
    data_dir: str | None = fields.resumable(None)
    image_size: int | None = setting(None, IMAGE_SIZE)
    preprocessing: str = setting("auto", fields.one_of(FAMILIES))
    channels: int | None = setting(None, CHANNEL_COUNT)
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = setting(None, fields.MORE_THAN_0)
    eval_resize: int | None = fields.resumable(None, IMAGE_SIZE)
    eval_image_size: int | None = fields.resumable(None, IMAGE_SIZE)
    augment: AugmentSettings = AugmentSettings()
    mix: MixSettings = MixSettings()
    validation_split: int = setting(0, WHOLE_OR_0)
    eval_split: str | None = fields.resumable(None)
    train_examples: int | None = setting(None, fields.AT_LEAST_1)
    eval_examples: int | None = fields.resumable(None, fields.AT_LEAST_1)
    shuffle_buffer: int = setting(10_000, fields.AT_LEAST_1)
    # Not a `data.` config key of its own.
    seed: int = dataclasses.field(default=0, metadata={fields.SET_BY: "train.seed"})
    dtype: str | None = setting("float32", DTYPE)
    num_classes: int = setting(10, fields.AT_LEAST_1)
    class_names: tuple[str, ...] | None = None
    coarse_labels: bool = False
    multi_label: bool | None = None
    label_separator: str = setting(" ", SEPARATOR)
    records: RecordSettings = RecordSettings()
    in_memory_mb: int = setting(image_files.IN_MEMORY_MB, WHOLE_OR_0)
    image_column: str | None = None
    label_column: str | None = None
    sampling: str = setting("natural", fields.one_of(SAMPLINGS))
    progressive: ProgressiveSettings = ProgressiveSettings()

    def __post_init__(self):
        fields.check_declared(self, "data.{}")
        names, jsd = list(self.class_names or ()), self.augment.augmix_jsd
        counts = (self.channels,) if self.channels else CHANNELS[1:]
        per_channel = [
            (
                value is None or len(value) in counts,
                f"{name} has {len(value or ())} values; give one per channel: "
                + " or ".join(str(c) for c in counts),
            )
            for name, value in (("mean", self.mean), ("std", self.std))
        ]
        _require(
            (
                self.class_names is None or len(set(names)) == len(names) > 0,
                f"class_names={names} must be distinct names, at least one",
            ),
            (
                not self.coarse_labels or self.dataset.startswith(("cifar:", "cifar100")),
                f"data.coarse_labels is for CIFAR-100 (--dataset=cifar:PATH of its archive, or "
                f"cifar100); --dataset={self.dataset} has no coarse labels: drop it",
            ),
            *per_channel,
            (
                self.mean is None or self.std is None or len(self.mean) == len(self.std),
                f"mean has {len(self.mean or ())} values and std {len(self.std or ())}; "
                "give both one per channel",
            ),
            (
                not (jsd and self.mix.enabled),
                f"data.augment.augmix_jsd={jsd} (AugMix's consistency loss) compares an example's "
                "views and data.mix blends examples: keep one (drop data.mix or augmix_jsd)",
            ),
            (
                self.augment.repeats == 1 or self.sampling != "balanced",
                f"data.augment.repeats={self.augment.repeats} repeats each example of a uniform "
                "order; data.sampling=balanced draws its own: keep one",
            ),
        )


def data_config(**keys: Any) -> DataConfig:
    """A `DataConfig` from keys as a config file's data section gives them (groups as
    mappings, `augment={"flip": False}`, or the old flat names), checked as a config's;
    `seed` (a training config's train.seed) too."""
    seed = keys.pop("seed", 0)
    return dataclasses.replace(
        fields.replace_from(DataConfig(), "data", migration.config_section("data", keys)), seed=seed
    )
