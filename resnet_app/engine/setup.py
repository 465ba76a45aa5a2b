"""A run before its loop: `build_run(config, model_dir) -> Run`.

`build_run` checks the settings against the machine and the data, plans the
run (`plan.py`), prepares the run directory (moving an old run aside on
--restart), compares the settings with those of the checkpoint it resumes
from (`resume.py`), and creates the run's state in `strategy.scope()`: the
model (with BatchNorm moving statistics), the optimizer (slots and
iterations), the global step, the data position (examples consumed since the
start of epoch 0, which gives the epoch and the position within it), the
learning-rate override state (`learning_rate.py`), the number of replicas and
of rollbacks; and the config (a string on the host, the one variable made
outside the scope: a string is not mirrored). All of them are in the run's
checkpoint. Training uses no stateful random numbers: the data order and
augmentation are functions of (seed, epoch, example), so the seed in the
config and the data position reproduce the data from any point.

Resuming: a run directory that holds a checkpoint continues from the newest
readable one (`checkpoint.find_latest`); `Run.restore` loads it and
`Run.train_dataset` enters the data stream at the saved position (see
`input_pipeline.py`), so no example is skipped or repeated across the restart;
with `train.deterministic` the resumed run is bitwise the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from resnet_app import config as config_lib
from resnet_app import pretrained
from resnet_app.common import (
    auto_precision,
    checkpoint,
    distribute,
    hardware,
    precision,
    run_dir,
    run_lock,
)
from resnet_app.common.errors import ConfigError
from resnet_app.config import Config, TrainSettings
from resnet_app.data import class_balance, input_pipeline, run_pipeline
from resnet_app.engine import averaging, optim, resume
from resnet_app.engine import teacher as teacher_lib
from resnet_app.engine.ema import SwaAverage, WeightEMA
from resnet_app.engine.learning_rate import LearningRate
from resnet_app.engine.plan import RunPlan, plan_run
from resnet_app.nets import factory, parts
from resnet_app.nets.presets import get_config
from resnet_app.pretrained import sources


@dataclasses.dataclass
class Run:
    """One run's settings, data and state, created by `build_run`.

    Attributes:
      config: the resolved config.
      model_dir: the run directory.
      strategy: the distribution strategy.
      chief: whether this worker writes the run's files.
      pipeline: the input pipeline.
      plan: the run's length and schedule.
      model: the model, built in `strategy.scope()`.
      optimizer: its optimizer, built there too.
      learning_rate: the schedule and the override state.
      global_step, data_position, num_replicas, rollback_count, saved_config:
        the run's counters and settings, saved in every checkpoint.
      checkpoints: the run's checkpoint of all of the above.
      averaging: the model averaging (`sync.mode: model_average` on more than
        one replica), or None.
      ema: the moving average of the weights (`train.ema_decay`), or None.
      resume_from: (step, prefix) of the checkpoint to resume from, or None.
      config_changes: settings that differ from the checkpoint's,
        "section.key" -> (saved, new).
      lock: the run directory's lock, held by the chief until `close`.
      class_weights: float32 [classes] loss weights (`train.class_weights`), or None.
      teacher: the network distilled from (`train.teacher`), or None.
    """

    config: Config
    model_dir: str
    strategy: tf.distribute.Strategy
    chief: bool
    pipeline: input_pipeline.InputPipeline
    plan: RunPlan
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    learning_rate: LearningRate
    global_step: tf.Variable
    data_position: tf.Variable
    num_replicas: tf.Variable
    rollback_count: tf.Variable
    saved_config: tf.Variable
    checkpoints: checkpoint.RunCheckpoint
    averaging: averaging.ModelAveraging | None
    ema: WeightEMA | None
    resume_from: tuple[int, str] | None
    config_changes: dict[str, tuple[Any, Any]]
    lock: run_lock.RunLock | None = None
    class_weights: np.ndarray | None = None
    teacher: teacher_lib.Teacher | None = None

    def close(self) -> None:
        """Removes the scratch checkpoints and lets another trainer have the directory."""
        self.checkpoints.close()
        if self.lock is not None:
            self.lock.release()

    @property
    def examples_per_epoch(self) -> int:
        return self.pipeline.epoch_examples(self.config.train.batch_size)

    def restore(self, prefix: str | None, verb: str = "Resumed from") -> int:
        """Restores a checkpoint (None: none, a fresh start); returns the step.

        Raises:
          ConfigError: when the checkpoint holds another model, or the workers
            resumed from different steps.
        """
        # A run that starts keeping the average on resume starts it there.
        new_average = bool(prefix) and self.ema is not None and not checkpoint.has_ema(prefix)
        if prefix:
            self.checkpoints.restore(prefix, without=(checkpoint.EMA,) if new_average else ())
            # What this run is: its next checkpoints are saved with these.
            self.num_replicas.assign(self.strategy.num_replicas_in_sync)
            self.saved_config.assign(config_lib.to_yaml(self.config))
        step = int(self.global_step.numpy())
        if new_average:
            self.ema.reset()
            logging.warning(
                "train.ema_decay is new on resume: the moving average of the weights starts "
                "from the weights of step %d",
                step,
            )
        steps = distribute.gather_from_workers(self.strategy, step)
        if min(steps) != max(steps):
            raise ConfigError(
                f"the workers resumed from different steps {sorted(set(steps))}: every "
                f"worker must see the chief's checkpoints, so put --model_dir on a shared "
                "filesystem"
            )
        if prefix:
            epoch, position = divmod(int(self.data_position.numpy()), self.examples_per_epoch)
            logging.info(
                "%s step %d (epoch %d, example %d of %d) from %s",
                verb,
                step,
                epoch,
                position,
                self.examples_per_epoch,
                prefix,
            )
        return step

    def train_dataset(
        self, image_size: int | None = None
    ) -> tf.data.Dataset | tf.distribute.DistributedDataset:
        """The training stream from the data position on, split over the replicas
        (on one CPU, the dataset itself: `distribute.distribute_datasets`), at
        `image_size` (default: the plan's size at the current step)."""
        global_batch = self.config.train.batch_size
        replicas = self.strategy.num_replicas_in_sync
        start_example = int(self.data_position.numpy())
        size = image_size or self.plan.sizes.size_at(int(self.global_step.numpy()))

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = self.pipeline.train_dataset(
                global_batch,
                start_example=start_example,
                num_shards=context.num_input_pipelines,
                shard_index=context.input_pipeline_id,
                image_size=size,
                replicas_per_shard=max(1, replicas // context.num_input_pipelines),
            )
            if replicas > context.num_input_pipelines:
                # Each local replica takes its consecutive slice of the worker's batch.
                dataset = dataset.rebatch(global_batch // replicas)
            # The next batches are ready (and sliced) before the step asks for them.
            return dataset.prefetch(tf.data.AUTOTUNE)

        return distribute.distribute_datasets(self.strategy, dataset_fn)


def build_run(
    config: Config, model_dir: str, restart: bool = False, allow_config_change: bool = False
) -> Run:
    """Checks the settings, plans the run and creates its state (not yet restored).

    Args:
      config: the resolved config.
      model_dir: the run directory (created if needed).
      restart: move the directory's contents aside and start over.
      allow_config_change: resume even if settings that change what the run
        computes differ from the checkpoint's.

    Returns:
      The `Run`; `Run.restore(run.resume_from[1])` loads the checkpoint.

    Raises:
      ConfigError: for settings that do not fit the data or machine, or a run
        directory holding other settings.
    """
    optim.check_optimizer_config(config.optimizer)  # Answered before anything is loaded.
    # The source's network and preprocessing, before the data is built with them.
    saved = _saved_config(model_dir, restart)
    config, source = pretrained.prepare(config, saved)
    if config.train.teacher and saved is None:  # Before the data: a resume reads its copy.
        sources.check_teacher(config.train.teacher, config.train.teacher_model)
    if config.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = distribute.create_strategy(config.train.num_towers, config.sync.timeout)
    _check_machine(config, strategy)
    chief = distribute.is_chief(strategy)
    # Before anything is written there; the job's chief holds it for the job.
    lock = run_lock.RunLock(model_dir).acquire() if chief else None
    try:
        return _build(config, model_dir, restart, allow_config_change, source, strategy, lock)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _build(
    config: Config,
    model_dir: str,
    restart: bool,
    allow_config_change: bool,
    source: Any,
    strategy: tf.distribute.Strategy,
    lock: run_lock.RunLock | None,
) -> Run:
    """`build_run` once the strategy is made and the run directory locked."""
    optimizer_config = optim.check_optimizer_config(config.optimizer)
    chief = distribute.is_chief(strategy)
    pipeline = run_pipeline.create_run_pipeline(config, model_dir=None if restart else model_dir)
    plan = plan_run(config, _epoch_examples(pipeline, config), pipeline.preprocessing.image_size)
    class_balance.check_single_label_options(config, pipeline.multi_label)
    train = pipeline.train_split
    counts = train.class_counts(pipeline.num_classes) if train is not None else None
    weights = class_balance.class_weights(config.train.class_weights, pipeline.class_names, counts)
    kind = optimizer_config["class"]
    if config.optimizer.decays_weights and (decay := _preset(config).weight_decay):
        logging.warning(
            "%s decays the weights itself, and model.weight_decay=%g adds an L2 "
            "penalty on top; set model.weight_decay=0 unless both are meant",
            kind,
            decay,
        )
    # Only now that the data and schedule are known to work.
    resume_from = _prepare_directory(model_dir, restart, chief)
    changes: dict[str, tuple[Any, Any]] = {}
    if resume_from:
        saved = _checkpoint_config(resume_from[1])
        kept = resume.keep_drops(saved, config, _epoch_examples(pipeline, config))
        if kept is not config:
            config = kept
            examples = _epoch_examples(pipeline, config)
            plan = plan_run(config, examples, pipeline.preprocessing.image_size)
        replicas = strategy.num_replicas_in_sync
        check = _check_resume(saved, config, resume_from, replicas, pipeline, plan)
        _refuse_or_log(check, model_dir, resume_from[0], allow_config_change)
        _check_swa_resume(saved, config, plan, resume_from[0], _epoch_examples(pipeline, saved))
        changes = check.changes
    state = _create_state(config, model_dir, strategy, chief, pipeline, plan, optimizer_config)
    if source is not None and resume_from is None:  # Once, when the run starts.
        pretrained.load(state["model"], source, config.model_name, config.train.init_head)
    if state["ema"] is not None:
        state["ema"].reset()  # From the weights the run starts with; a resume restores it.
    teacher = teacher_lib.create(
        config,
        model_dir,
        strategy,
        chief,
        list(pipeline.class_names),
        pipeline.preprocessing,
        resuming=resume_from is not None,
    )
    return Run(
        config=config,
        model_dir=model_dir,
        strategy=strategy,
        chief=chief,
        pipeline=pipeline,
        plan=plan,
        resume_from=resume_from,
        config_changes=changes,
        lock=lock,
        class_weights=weights,
        teacher=teacher,
        **state,
    )


def _create_state(
    config: Config,
    model_dir: str,
    strategy: tf.distribute.Strategy,
    chief: bool,
    pipeline: input_pipeline.InputPipeline,
    plan: RunPlan,
    optimizer_config: dict[str, Any],
) -> dict[str, Any]:
    """The run's variables, each created in `strategy.scope()`, and their checkpoint."""
    model, optimizer, averager = _create_model(config, strategy, pipeline, optimizer_config)
    ema = _create_ema(config, strategy, pipeline, model, averager, plan)
    with strategy.scope():
        learning_rate = LearningRate(plan.schedule, plan.steps_per_epoch)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        data_position = tf.Variable(0, dtype=tf.int64, trainable=False, name="data_position")
        num_replicas = tf.Variable(
            strategy.num_replicas_in_sync, dtype=tf.int64, trainable=False, name="num_replicas"
        )
        rollback_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="rollbacks")
    # The settings each checkpoint was trained with, for the resume guard.
    saved_config = tf.Variable(config_lib.to_yaml(config), trainable=False, name="config")
    checkpoints = checkpoint.RunCheckpoint(
        model_dir,
        chief=chief,
        max_to_keep=config.train.keep_checkpoints,
        keep_every_n_hours=config.train.keep_checkpoint_every_n_hours,
        worker=distribute.worker_index(strategy),
        model=model,
        optimizer=optimizer,
        global_step=global_step,
        data_position=data_position,
        num_replicas=num_replicas,
        rollbacks=rollback_count,
        config=saved_config,
        lr_value=learning_rate.value,
        lr_scale=learning_rate.scale,
        **({} if ema is None else {checkpoint.EMA: ema.model}),
    )
    return dict(
        model=model,
        optimizer=optimizer,
        averaging=averager,
        ema=ema,
        learning_rate=learning_rate,
        global_step=global_step,
        data_position=data_position,
        num_replicas=num_replicas,
        rollback_count=rollback_count,
        saved_config=saved_config,
        checkpoints=checkpoints,
    )


def _create_model(
    config: Config,
    strategy: tf.distribute.Strategy,
    pipeline: input_pipeline.InputPipeline,
    optimizer_config: dict[str, Any],
) -> tuple[keras.Model, keras.optimizers.Optimizer, averaging.ModelAveraging | None]:
    """The model and its built optimizer, in `strategy.scope()`, and the model averaging."""
    train = config.train
    # Model averaging with one replica would be the all-reduce run.
    average = config.sync.mode == "model_average" and strategy.num_replicas_in_sync > 1
    keras.utils.set_random_seed(train.seed)
    with strategy.scope(), averaging.local_variables() if average else contextlib.nullcontext():
        model = factory.create_run_model(
            config,
            pipeline.num_classes,
            pipeline.preprocessing.image_size,
            train.precision,
            pipeline.channels,
        )
        parts.freeze(model, train.freeze, train.freeze_batch_norm)
        optimizer = optim.create_optimizer(
            optimizer_config, parts.lr_multipliers(model, train.lr_multipliers or {})
        )
        if precision.get(train.precision).loss_scaling:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    if not average:
        return model, optimizer, None
    return (
        model,
        optimizer,
        averaging.ModelAveraging(model, optimizer, strategy, config.sync.interval),
    )


def _check_swa_resume(saved: Config, config: Config, plan: RunPlan, step: int, examples: int):
    """Refuses a resume that moves SWA's models once it has begun averaging them.

    SWA's start is a fraction of the run's length: a resume with another length
    (or other swa_ settings) places the models elsewhere, and the average already
    in the checkpoint would be weighted as if it held another number of them.
    """
    if not config.train.swa_start:
        return
    now = swa_updates(config.train, plan)
    before = swa_updates(saved.train, plan_run(saved, examples)) if saved.train.swa_start else None
    if before == now or step < min(now[0], before[0] if before else now[0]):
        return  # The same models, or nothing averaged yet.
    raise ConfigError(
        f"this run averages models for SWA from update {before[0] if before else '(none)'} "
        f"every {before[1] if before else '-'}; the settings given put them at {now[0]} every "
        f"{now[1]}, after step {step} it resumes from: keep the run's length and swa_ settings "
        "(or --restart)"
    )


def _epoch_examples(pipeline: input_pipeline.InputPipeline, config: Config) -> int:
    """Examples per training epoch (with repeated augmentation, the samplers' length)."""
    return pipeline.epoch_examples(config.train.batch_size)


def _create_ema(
    config: Config,
    strategy: tf.distribute.Strategy,
    pipeline: input_pipeline.InputPipeline,
    model: keras.Model,
    averager: averaging.ModelAveraging | None,
    plan: RunPlan,
) -> WeightEMA | None:
    """The average of the weights (moving, or SWA's), a mirrored copy of the network, or None."""
    train = config.train
    if not train.keeps_average:
        return None
    with strategy.scope():  # Mirrored, also under model averaging (`ema.py`).
        average_model = factory.create_run_model(
            config,
            pipeline.num_classes,
            pipeline.preprocessing.image_size,
            train.precision,
            pipeline.channels,
        )
    if train.swa_start:
        start, period = swa_updates(train, plan)
        return SwaAverage(model, average_model, start, period)
    every = 1 if averager is None else averager.interval
    return WeightEMA(model, average_model, train.ema_decay, train.ema_warmup, every)


def swa_updates(train: TrainSettings, plan: RunPlan) -> tuple[int, int]:
    """(the update of SWA's first model, the updates between models) for a run's plan."""
    start = min(max(1, round(train.swa_start * plan.total_steps)), plan.total_steps)
    return start, train.swa_every or max(1, plan.steps_per_epoch)


def _saved_config(model_dir: str, restart: bool) -> Config | None:
    """The config.yaml of a run that will be resumed, or None for one that starts."""
    path = run_dir.config_path(model_dir)
    if restart or not run_dir.has_checkpoints(model_dir) or not os.path.isfile(path):
        return None
    with open(path) as file:
        return config_lib.from_yaml(file.read(), path)


def _preset(config: Config):
    return get_config(config.model_name, **config.model_overrides)


def _check_machine(config: Config, strategy: tf.distribute.Strategy) -> None:
    """Refuses settings the strategy cannot run."""
    train, replicas = config.train, strategy.num_replicas_in_sync
    if train.batch_size % replicas:
        raise ConfigError(
            f"train.batch_size={train.batch_size} is not divisible by the {replicas} "
            f"towers; use a multiple of {replicas}"
        )
    if train.batch_size % (replicas * train.accumulate_steps):
        raise ConfigError(
            f"train.batch_size={train.batch_size} over {replicas} tower(s) does not "
            f"split into train.accumulate_steps={train.accumulate_steps} equal micro-batches; "
            f"use a multiple of {replicas * train.accumulate_steps}"
        )
    if config_lib.DERIVED_PRECISION in config.derived:
        _log_auto_precision(train.precision)
    elif precision.get(train.precision).compute_dtype == "bfloat16" and not (
        tf.config.list_logical_devices("GPU")
    ):
        warn_if_bf16_is_emulated(hardware.read_cpu_info())
    if (
        train.jit
        and _preset(config).bn_synchronized
        and not isinstance(strategy, tf.distribute.OneDeviceStrategy)
    ):
        raise ConfigError(
            "train.jit cannot compile model.bn_synchronized: its all-reduce across towers "
            "cannot run inside XLA; drop one of them"
        )


def _log_auto_precision(chosen: str) -> None:
    """The start-up line of `train.precision: auto`: what it chose, and why."""
    choice = auto_precision.auto_choice()
    logging.info("train.precision=auto: %s, as %s", chosen, choice.reason)
    # The choice was made before TensorFlow loaded; its view of the GPUs decides.
    seen = auto_precision.choose(hardware.read_cpu_info(), auto_precision.detect_gpus())
    if seen.precision != chosen:
        logging.warning(
            "train.precision=auto chose %s before TensorFlow loaded, but TensorFlow's devices "
            "call for %s (%s); set train.precision=%s",
            chosen,
            seen.precision,
            seen.reason,
            seen.precision,
        )


def warn_if_bf16_is_emulated(cpu: hardware.CpuInfo) -> None:
    """One warning when bfloat16 training on this CPU is emulated, and what it costs."""
    if cpu.native_bf16:
        return
    logging.warning(
        "train.precision=bf16 on a CPU without bfloat16 instructions in use (%s; needs "
        "AVX512_BF16 or AMX, and oneDNN on): TensorFlow emulates them, and ResNet-20 "
        "trained about 5x slower than in fp32 on a 2-core AVX2 CPU (23 against 113 "
        "images/s); use --precision=fp32 here",
        cpu.describe(),
    )


def _prepare_directory(model_dir: str, restart: bool, chief: bool) -> tuple[int, str] | None:
    """Moves an old run aside on --restart; returns the checkpoint to resume from."""
    if restart and chief:
        aside = run_dir.move_aside(model_dir)
        if aside:
            logging.warning("--restart: moved the previous run to %s", aside)
    run_dir.create(model_dir)
    # Every worker reads the chief's directory (a shared filesystem).
    return None if restart else checkpoint.find_latest(model_dir)


def _checkpoint_config(prefix: str) -> Config:
    """The config checkpoint `prefix` was trained with."""
    return config_lib.from_yaml(
        checkpoint.read_value(prefix, "config").decode(), f"the config saved in {prefix}"
    )


def _check_resume(
    saved: Config,
    config: Config,
    resume_from: tuple[int, str],
    replicas: int,
    pipeline: input_pipeline.InputPipeline,
    plan: RunPlan,
) -> resume.ResumeCheck:
    """Compares the settings with those the checkpoint was trained with (`resume.py`)."""
    step, prefix = resume_from
    saved_replicas = checkpoint.read_value(prefix, "num_replicas")
    return resume.check_resume(
        saved,
        config,
        step,
        None if saved_replicas is None else int(saved_replicas),
        replicas,
        _epoch_examples(pipeline, config),
        plan,
    )


def _refuse_or_log(check: resume.ResumeCheck, model_dir: str, step: int, allow: bool) -> None:
    """Refuses a resume that changes what the run computes, unless allowed; logs changes."""
    if check.refused and not allow:
        raise ConfigError(
            f"cannot resume {model_dir} from step {step}: these settings differ from "
            f"the run's: {'; '.join(check.refused)}. Rerun with the run's settings (give "
            "--model_dir alone to reuse them), or pass --restart to start over, or "
            "--allow_config_change"
        )
    if check.refused:
        logging.warning("--allow_config_change: resuming despite %s", "; ".join(check.refused))
    elif check.changes:
        logging.info(
            "Settings changed on resume: %s",
            "; ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in check.changes.items()),
        )
