"""The config tree: `Config` and its typed sections, where every default lives.

Six sections, each a YAML mapping: `model` (a preset `name` and any
`ResNetConfig` field), `data` (`DataConfig` but `seed`, which is `train.seed`),
`optimizer` (`optimizer_kinds.py`), `schedule` (`schedule_kinds.py`), `train`
and `sync`. The defaults are He et al.'s CIFAR recipe for ResNet-20 (batch 128,
momentum 0.9, LR 0.1 divided by 10 at 1/2 and 3/4 of 64k steps, weight decay
1e-4). A default derived from another setting stays derived: `Config.derived`
names such keys, which `config.yaml` records as given, so a resumed run derives
them again.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from resnet_app.common import auto_precision, migration
from resnet_app.common import precision as precision_names
from resnet_app.common.errors import ConfigError
from resnet_app.common.fields import (
    AT_LEAST_0,
    AT_LEAST_1,
    FRACTION,
    MORE_THAN_0,
    PROBABILITY,
    Rule,
    changed_from_defaults,
    check_declared,
    config_keys,
    interval,
    is_number,
    one_of,
    replace_from,
    resumable,
    setting,
    whole_at_least,
)
from resnet_app.config.oneof import Section, alternative, check_alternatives, plain
from resnet_app.config.optimizer_kinds import Momentum, OptimizerSection
from resnet_app.config.schedule_kinds import Piecewise, ScheduleSection
from resnet_app.data.settings import DataConfig
from resnet_app.nets import presets

# train.loss: the label term each name builds ("module:Class", imported by the engine).
LOSSES: dict[str, str | type] = {
    "cross_entropy": "resnet_app.engine.losses.cross_entropy:CrossEntropy",
    "bce": "resnet_app.engine.losses.bce:BinaryCrossEntropy",
}
# train.best_metric: a key of the evaluation record (the moving average's with ema_;
# imbalanced and multi-label data's), and the direction it improves in.
BEST_METRICS = {
    key: "min" if key.endswith("loss") else "max"
    for key in ("top1", "top5", "loss", "ema_top1", "ema_top5", "ema_loss", "balanced_accuracy")
    + ("map", "f1_micro", "f1_macro", "ema_balanced_accuracy", "ema_map")
}
# train.precision's names -> their `Precision` (the images' dtype, data.dtype, unless set).
PRECISIONS = precision_names.PRECISIONS
# train.precision: a registered precision (read when checking: one may be added) or "auto".
PRECISION = Rule(
    lambda x: x in PRECISIONS or x == auto_precision.AUTO,
    lambda: f"one of: {', '.join(PRECISIONS)}, {auto_precision.AUTO}",
)
MAX_ROLLBACKS = 3
DERIVED_DTYPE = "data.dtype"  # Follows train.precision when unset.
DERIVED_PRECISION = "train.precision"  # "auto", resolved for this machine.
# How `to_dict` writes a derived key: what makes it derived again when read back.
DERIVED_AS = {DERIVED_DTYPE: None, DERIVED_PRECISION: auto_precision.AUTO}


NOT_BLANK = Rule(
    lambda x: isinstance(x, str) and bool(x.strip()),
    "a source (keras:resnet50, a file or a run directory)",
)
CLASS_WEIGHTS = Rule(
    lambda x: is_number(x) and x >= 0 if not isinstance(x, str) else x == "balanced",
    "balanced, or class names mapped to weights >= 0 (e.g. {cat: 2.0})",
)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """How long and how to train; every field is a `train.` config key.

    Attributes:
      batch_size: the global batch: examples per step over all towers and
        workers.
      epochs: train this many epochs (may be fractional); or set train_steps.
      train_steps: train this many steps; or set epochs.
      eval_every: evaluate every this many steps (default: once per epoch),
        and always at the end (which replaces one due less than a quarter
        of the interval before it).
      log_every: log training metrics every this many steps.
      steps_per_loop: steps run per call of the compiled loop (default and
        at most: log_every; a call also stops at evaluation and checkpoint
        steps); the learning rate is still set for every step.
      profile_steps: profile this many steps after the first compiled call,
        into model_dir/profile for TensorBoard's Profile tab (0: none).
      checkpoint_every: save a checkpoint every this many steps (default: at
        every evaluation); also saved at every evaluation and at the end.
      num_towers: towers (GPUs, or logical CPU devices on a CPU-only machine);
        default all GPUs, or one CPU.
      seed: seeds the weights, the data order and the augmentation.
      label_smoothing: cross-entropy label smoothing (0 for none).
      eval_batch_size: global evaluation batch (default: batch_size).
      keep_checkpoints: the newest checkpoints kept (older ones are deleted).
      keep_checkpoint_every_n_hours: also keep one checkpoint per this many
        hours of training, forever (default: none).
      deterministic: TensorFlow's op determinism: a run, and a run resumed
        from any checkpoint, give bitwise the same weights (slower).
      on_nan: what a non-finite loss does: "stop" with an error, or
        "rollback" to the last good checkpoint, multiply the learning rate by
        nan_lr_factor and go on (at most MAX_ROLLBACKS times).
      nan_lr_factor: the learning-rate multiplier of a rollback.
      precision: "fp32", or mixed precision with float32 weights, logits, loss
        and BatchNorm statistics: "bf16" (CPUs with AVX512_BF16 or AMX, TPUs,
        Ampere+ GPUs) or "fp16" (dynamic loss scaling; GPUs); or "auto": bf16
        where the hardware has native bfloat16, else fp32 (the start-up line
        says which and why).
      jit: compile each tower's forward and backward pass with XLA.
      init_from: start from pretrained weights, once, when the run starts:
        "keras:resnet50" (from Keras's cache or downloaded), a Keras
        applications `.h5` file, a `.safetensors` file in torchvision's layout,
        or another run's directory or checkpoint (`resnet_app/pretrained/`).
      init_head: "auto" (load the classifier when its shape fits, else
        initialise it anew) or "new" (always initialise it anew).
      freeze: parts whose weights stay fixed: stem, stage1 ... stageN, head.
      freeze_batch_norm: frozen parts also run their BatchNorms in inference
        mode, with the moving statistics fixed (false: they normalize with
        batch statistics and update them; gamma and beta stay fixed).
      lr_multipliers: a learning-rate multiplier per part, e.g. {head: 10}
        (parts not named: 1).
      keep_best: also keep the checkpoint of the best evaluation so far in
        `model_dir/best/`, with `best.json` (never rotated away; a resumed
        run replaces it only when beaten); `--checkpoint=best` picks it.
      best_metric: the evaluation record's key that ranks evaluations: top1,
        top5 or loss, or with train.ema_decay the moving average's ema_top1,
        ema_top5 or ema_loss (default: ema_top1 with train.ema_decay, else
        top1; see `best_by`).
      best_mode: "max" (higher is better) or "min"; default: min for loss,
        else max (`best_direction`).
      loss: "cross_entropy" (softmax) or "bce" (binary cross-entropy of each
        class's sigmoid against the smoothed, possibly mixed, one-hot target,
        averaged over the classes: Wightman et al. 2021's recipes).
      bce_target_threshold: with loss bce, binarize the (smoothed, mixed)
        targets: above it 1, else 0 (timm's `target_threshold`, 0.2 in the A3
        recipe); default: soft targets.
      accumulate_steps: split each tower's batch into this many equal
        micro-batches whose gradients add up to one update: the same update
        (exactly, without BatchNorm) in the memory of one micro-batch.
      ema_decay: keep an exponential moving average of the weights and
        BatchNorm statistics, ema <- d * ema + (1 - d) * w after every update,
        with this d (0: none; e.g. 0.9999 on ImageNet). It is evaluated beside
        the weights (ema_top1 ...), checkpointed, and what evaluate, export and
        predict use by default (--weights). See `engine/ema.py`.
      ema_warmup: use the decay min(ema_decay, (1 + n) / (10 + n)) at update
        n (TensorFlow's `ExponentialMovingAverage` warm-up).
      swa_start: stochastic weight averaging (Izmailov et al. 2018): from this
        fraction of the run on (e.g. 0.75; 0: off), the average of the weights
        is the equal-weight mean of the models every `swa_every` updates, used
        as the moving average is (under the same ema_ names). At the end the
        run's averaged checkpoint (`--checkpoint=averaged`) gets BatchNorm's
        statistics measured on `swa_bn_batches` training batches. Combine it
        with a schedule that keeps the learning rate up then.
      swa_every: the updates between the models SWA averages (default: one
        epoch's, the paper's).
      swa_bn_batches: training batches BatchNorm's statistics of the SWA
        average are measured on at the end (0: the averaged statistics).
      class_weights: scale each example's loss by its class's weight:
        "balanced" (n / (classes * count), `data/class_balance.py`) or a
        mapping of class names to weights (others 1); single-label data.
      threshold: multi-label data: a class is predicted when its sigmoid
        probability is at least this (the F1 scores, predict's labels).
      teacher: knowledge distillation (Hinton et al. 2015) from this trained
        network, in inference mode on each training batch: another run's
        directory or checkpoint, an export of one, keras:resnet50, a Keras
        applications `.h5` or a torchvision/timm `.safetensors` file (these two
        need `teacher_model`), of the data's classes. The run keeps a copy of
        it (`model_dir/teacher/`) for its resumes. See `engine/teacher.py`.
      teacher_model: the preset of a weights-file teacher (e.g. resnet50).
      distill_alpha: with a teacher, the weight of the distillation loss;
        the usual loss weighs 1 - distill_alpha (`engine/losses/distillation.py`).
      distill_temperature: with a teacher, the temperature T both networks'
        logits are divided by in the distillation loss (times T^2).
    """

    batch_size: int = setting(128, AT_LEAST_1)
    epochs: float | None = alternative("train_steps", resumable=True, rule=MORE_THAN_0)
    train_steps: int | None = alternative("epochs", default=64_000, resumable=True, rule=AT_LEAST_1)
    eval_every: int | None = resumable(None, AT_LEAST_1)
    log_every: int = resumable(100, AT_LEAST_1)
    steps_per_loop: int | None = resumable(None, AT_LEAST_1)
    profile_steps: int = resumable(0, whole_at_least(0))
    checkpoint_every: int | None = resumable(None, AT_LEAST_1)
    num_towers: int | None = resumable(None, AT_LEAST_1)
    seed: int = 0
    label_smoothing: float = setting(0.0, FRACTION)
    eval_batch_size: int | None = resumable(None, AT_LEAST_1)
    keep_checkpoints: int = resumable(3, AT_LEAST_1)
    keep_checkpoint_every_n_hours: float | None = resumable(None, MORE_THAN_0)
    deterministic: bool = resumable(False)
    on_nan: str = resumable("stop", one_of(("stop", "rollback")))
    nan_lr_factor: float = resumable(0.5, PROBABILITY)
    precision: str = setting("fp32", PRECISION)
    jit: bool = resumable(False)
    init_from: str | None = setting(None, NOT_BLANK)
    init_head: str = setting("auto", one_of(("auto", "new")))
    freeze: tuple[str, ...] = ()
    freeze_batch_norm: bool = True
    lr_multipliers: dict[str, float] | None = setting(None, AT_LEAST_0)
    keep_best: bool = resumable(False)
    best_metric: str | None = resumable(None, one_of(BEST_METRICS))
    best_mode: str | None = resumable(None, one_of(("max", "min")))
    loss: str = setting("cross_entropy", one_of(LOSSES))
    bce_target_threshold: float | None = setting(None, FRACTION)
    accumulate_steps: int = setting(1, AT_LEAST_1)
    ema_decay: float = resumable(0.0, FRACTION)
    ema_warmup: bool = resumable(False)
    swa_start: float = setting(0.0, FRACTION)
    swa_every: int | None = setting(None, AT_LEAST_1)
    swa_bn_batches: int = resumable(100, whole_at_least(0))
    class_weights: str | dict[str, float] | None = setting(None, CLASS_WEIGHTS)
    threshold: float = resumable(0.5, PROBABILITY)
    teacher: str | None = setting(None, NOT_BLANK)
    teacher_model: str | None = setting(None, one_of(presets.PRESETS))
    distill_alpha: float = setting(0.5, interval(0, 1, high_in=True))
    distill_temperature: float = setting(4.0, MORE_THAN_0)

    @property
    def best_by(self) -> str:
        """The evaluation record's key keep-best ranks by: `best_metric`, or by
        default the moving average's top-1 when the run keeps one (what
        evaluate and export then use), else top-1."""
        return self.best_metric or ("ema_top1" if self.keeps_average else "top1")

    @property
    def keeps_average(self) -> bool:
        """Whether the run keeps an average of the weights: moving (EMA) or SWA's."""
        return self.ema_decay > 0 or self.swa_start > 0

    @property
    def best_direction(self) -> str:
        """`best_mode` ("max" or "min"), or else the direction `best_by` improves in."""
        return self.best_mode or BEST_METRICS[self.best_by]

    def __post_init__(self):
        check_declared(self, "train.{}")
        check_alternatives(self, "train.{}")
        _require(
            self.bce_target_threshold is None or self.loss == "bce",
            f"train.bce_target_threshold={self.bce_target_threshold} needs train.loss=bce; "
            "set train.loss=bce or drop it",
        )
        _require(
            not self.ema_warmup or self.ema_decay > 0,
            "train.ema_warmup needs train.ema_decay (e.g. 0.999); set it or drop ema_warmup",
        )
        _require(
            not self.best_by.startswith("ema_") or self.keeps_average,
            f"train.best_metric={self.best_metric} needs the moving average; set "
            "train.ema_decay (e.g. 0.999) or train.swa_start, or rank by top1",
        )
        _require(
            not (self.ema_decay and self.swa_start),
            "train.ema_decay and train.swa_start exclude each other (one average of the "
            "weights); keep one",
        )
        _require(
            self.teacher is not None
            or not changed_from_defaults(
                self, ("teacher_model", "distill_alpha", "distill_temperature")
            ),
            "train.teacher_model, distill_alpha and distill_temperature need train.teacher "
            "(a run directory, an export or a weights file); set it or drop them",
        )
        _require(
            self.swa_every is None or self.swa_start > 0,
            "train.swa_every needs train.swa_start (e.g. 0.75); set it or drop swa_every",
        )


@dataclasses.dataclass(frozen=True)
class SyncSettings:
    """How the replicas (towers and workers) keep one model; `sync.` config keys.

    Attributes:
      mode: "allreduce" (gradients summed across replicas at every step) or
        "model_average" (local SGD: each replica steps on its own share of
        the batch, and the replicas average their weights, BatchNorm moving
        statistics and optimizer slots every `interval` steps; see
        `engine/local_sgd.py`).
      interval: steps between averages with mode model_average (1 or more;
        1 is the all-reduce update).
      timeout: seconds a cross-worker collective may wait before its peer
        counts as stalled (multi-worker runs); None leaves it to TensorFlow's
        heartbeats. It must exceed the longest wait a healthy worker causes
        (its first step's tracing, its evaluation).
      keep_last_step: multi-worker runs keep a copy of the last step every
        worker completed (weights, slots, statistics, in the memory of each
        device), so that a lost or stalled worker costs no step: the
        survivors save it (`lost_worker.py`). One copy of the state per step.
    """

    mode: str = setting("allreduce", one_of(("allreduce", "model_average")))
    interval: int = setting(8, AT_LEAST_1)
    timeout: float | None = resumable(None, MORE_THAN_0)
    keep_last_step: bool = resumable(True)

    def __post_init__(self):
        check_declared(self, "sync.{}")


class _ModelBase(Section):
    """What `ModelSection` adds to its generated fields."""

    def __post_init__(self):
        presets.get_config(self.name, **self.overrides)  # Checks the name and the values.

    def __repr__(self) -> str:
        settings = {"name": self.name, **self.overrides}
        return f"ModelSection({', '.join(f'{k}={v!r}' for k, v in settings.items())})"

    @property
    def overrides(self) -> dict[str, Any]:
        """The `ResNetConfig` fields set here, in field order (None: "the preset's")."""
        return {
            key: value
            for key, value in self.field_values().items()
            if key != "name" and value is not None
        }

    @classmethod
    def from_mapping(cls, mapping: Any) -> ModelSection:
        """Reads `{name: preset, field: value, ...}`; a missing name is the default preset."""
        if isinstance(mapping, Mapping):
            mapping = migration.model_fields(mapping)  # Keys renamed since, too.
        return replace_from(cls(), "model", mapping)


def _model_fields() -> list[tuple[str, Any, Any]]:
    """`name`, then every `ResNetConfig` field as `T | None`, None meaning the preset's."""
    hints = typing.get_type_hints(presets.ResNetConfig)
    specs = [("name", str, dataclasses.field(default="resnet20"))]
    for field in dataclasses.fields(presets.ResNetConfig):
        specs.append((field.name, hints[field.name] | None, dataclasses.field(default=None)))
    return specs


# The `model:` section: a preset `name` plus any `ResNetConfig` field, each None
# (the preset's value) unless set. Generated, so a new ResNetConfig field is a
# config key at once; `nets/spec.py` documents the fields.
ModelSection = dataclasses.make_dataclass(
    "ModelSection", _model_fields(), bases=(_ModelBase,), frozen=True, eq=False, repr=False
)
ModelSection.__module__ = __name__
ModelSection.__doc__ = "The `model:` section: a preset `name` and the ResNetConfig fields it sets."


@dataclasses.dataclass(frozen=True)
class Config:
    """A resolved, validated training config: its six sections, and `derived`, the keys
    whose value was derived because the user left them unset or asked for it
    ("data.dtype" from train.precision, "train.precision" from "auto"), which
    `to_dict` writes as they were given (`DERIVED_AS`)."""

    model: ModelSection = ModelSection()
    data: DataConfig = DataConfig(dtype=None)
    optimizer: OptimizerSection = Momentum()
    schedule: ScheduleSection = Piecewise(
        boundaries=(0.5, 0.75),  # of the run: 32k and 48k of the default 64k steps
        unit="fraction",
        multipliers=(1.0, 0.1, 0.01),
    )
    train: TrainSettings = TrainSettings()
    sync: SyncSettings = SyncSettings()
    derived: frozenset[str] = frozenset()

    def __post_init__(self):
        if self.train.precision == auto_precision.AUTO or DERIVED_PRECISION in self.derived:
            chosen = auto_precision.auto_choice().precision
            object.__setattr__(self, "train", dataclasses.replace(self.train, precision=chosen))
            object.__setattr__(self, "derived", self.derived | {DERIVED_PRECISION})
        if self.data.dtype is None or DERIVED_DTYPE in self.derived:
            dtype = PRECISIONS[self.train.precision].compute_dtype
            object.__setattr__(self, "data", dataclasses.replace(self.data, dtype=dtype))
            object.__setattr__(self, "derived", self.derived | {DERIVED_DTYPE})
        if self.data.seed != self.train.seed:  # `data.seed` is set by train.seed.
            object.__setattr__(self, "data", dataclasses.replace(self.data, seed=self.train.seed))
        self._check_parts()
        _require(
            not (self.sync.mode == "model_average" and self.train.swa_start),
            "train.swa_start needs sync.mode=allreduce: with model averaging the replicas' "
            "weights differ between averages; use train.ema_decay",
        )
        _require(
            not (self.train.swa_start and self._loss_scaling()),
            f"train.swa_start cannot use train.precision={self.train.precision}: a step its loss "
            "scale skips does not count as an update, and the model would be averaged twice; "
            "use bf16 or fp32",
        )
        jsd = self.data.augment.augmix_jsd
        _require(
            not (jsd and self.train.teacher),
            f"data.augment.augmix_jsd={jsd} and train.teacher are two extra losses on one "
            "batch, not supported together: keep one",
        )
        _require(
            not (self.sync.mode == "model_average" and self._loss_scaling()),
            f"sync.mode=model_average cannot use train.precision={self.train.precision}: its "
            "loss scale is not kept per replica; use bf16 or fp32",
        )

    def _loss_scaling(self) -> bool:
        precision = PRECISIONS.get(self.train.precision)
        return precision is not None and precision.loss_scaling

    def _check_parts(self) -> None:
        """Refuses part names (train.freeze, train.lr_multipliers) the model does not have."""
        train, name = self.train, self.model_name
        stages = len(presets.get_config(name, **self.model_overrides).units)
        presets.check_parts("train.freeze", train.freeze, stages, name)
        presets.check_parts("train.lr_multipliers", train.lr_multipliers or {}, stages, name)
        _require(
            not set(presets.part_names(stages)) <= set(train.freeze),
            "train.freeze names every part, so nothing would train; leave at least the head out",
        )

    @property
    def model_name(self) -> str:
        """The model preset's name."""
        return self.model.name

    @property
    def model_overrides(self) -> dict[str, Any]:
        """The `ResNetConfig` fields the user set, as the preset's keyword arguments."""
        return self.model.overrides

    def to_dict(self, with_derived: bool = False) -> dict[str, dict[str, Any]]:
        """The config as plain YAML-ready data, every field spelled out (`with_derived`:
        derived values as used, not as given)."""
        keys = config_keys(DataConfig)
        data = {key: value for key, value in dataclasses.asdict(self.data).items() if key in keys}
        tree = {
            "model": self.model.to_dict(),
            "data": data,
            "optimizer": self.optimizer.to_dict(),
            "schedule": self.schedule.to_dict(),
            "train": dataclasses.asdict(self.train),
            "sync": dataclasses.asdict(self.sync),
        }
        if not with_derived:
            for key in self.derived:
                section, name = key.split(".")
                tree[section][name] = DERIVED_AS[key]
        return plain(tree)


SECTIONS = tuple(field.name for field in dataclasses.fields(Config) if field.name != "derived")
