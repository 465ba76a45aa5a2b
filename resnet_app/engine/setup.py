"""A run before its loop: `build_run(config, model_dir) -> Run`.

`build_run` checks the settings against the machine and the data, plans the run,
prepares its directory, checks a resume (`resume.py`) and creates the state in its
checkpoint. The data is a function of (seed, epoch, example), so the data position
(examples since epoch 0) resumes the stream with no example skipped or repeated.
"""

from __future__ import annotations

import contextlib
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
from resnet_app.config.sections import DERIVED_PRECISION
from resnet_app.data import class_balance, input_pipeline, run_pipeline
from resnet_app.engine import local_sgd, optim, resume
from resnet_app.engine import teacher as teacher_lib
from resnet_app.engine.ema import SwaAverage, WeightEMA
from resnet_app.engine.learning_rate import LearningRate
from resnet_app.engine.plan import RunPlan, plan_run
from resnet_app.nets import factory, parts
from resnet_app.nets.presets import get_config
from resnet_app.pretrained import sources


class Run:
    """One run's settings, data and state, made by `build_run`: its variables, each
    created in `strategy.scope()`, and `checkpoints`, their checkpoint. `resume_from`
    is the (step, prefix) to resume from, `config_changes` "section.key" -> (saved,
    new), `lock` held until `close`."""

    resume_from: tuple[int, str] | None = None
    config_changes: dict[str, tuple[Any, Any]]
    lock: run_lock.RunLock | None = None
    class_weights: np.ndarray | None = None
    teacher: teacher_lib.Teacher | None = None

    def __init__(
        self,
        config: Config,
        model_dir: str,
        strategy: tf.distribute.Strategy,
        chief: bool,
        pipeline: input_pipeline.InputPipeline,
        plan: RunPlan,
    ):
        self.config, self.model_dir, self.strategy, self.chief = config, model_dir, strategy, chief
        self.pipeline, self.plan, self.config_changes = pipeline, plan, {}
        train, size = config.train, pipeline.preprocessing.image_size

        def create_network() -> keras.Model:
            return factory.create_run_model(
                config, pipeline.num_classes, size, train.precision, pipeline.channels
            )

        # Model averaging with one replica would be the all-reduce run.
        average = config.sync.mode == "model_average" and strategy.num_replicas_in_sync > 1
        keras.utils.set_random_seed(train.seed)
        with strategy.scope(), local_sgd.local_variables() if average else contextlib.nullcontext():
            model = create_network()
            parts.freeze(model, train.freeze, train.freeze_batch_norm)
            multipliers = parts.lr_multipliers(model, train.lr_multipliers or {})
            optimizer = optim.create_optimizer(config.optimizer, multipliers)
            if precision.get(train.precision).loss_scaling:
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(model.trainable_variables)
        self.model, self.optimizer, self.local_sgd, self.ema = model, optimizer, None, None
        if average:
            self.local_sgd = local_sgd.LocalSGD(model, optimizer, strategy, config.sync.interval)
        if train.keeps_average:
            with strategy.scope():  # Mirrored, also under model averaging (`ema.py`).
                average_model = create_network()
            if train.swa_start:
                self.ema = SwaAverage(model, average_model, *swa_updates(train, plan))
            else:
                every = 1 if self.local_sgd is None else self.local_sgd.interval
                self.ema = WeightEMA(model, average_model, train.ema_decay, train.ema_warmup, every)

        def counter(name: str, value: int = 0) -> tf.Variable:
            return tf.Variable(value, dtype=tf.int64, trainable=False, name=name)

        with strategy.scope():
            self.learning_rate = LearningRate(plan.schedule, plan.steps_per_epoch)
            self.global_step, self.data_position = counter("global_step"), counter("data_position")
            self.num_replicas = counter("num_replicas", strategy.num_replicas_in_sync)
            self.rollback_count = counter("rollbacks")
        # The settings each checkpoint was trained with, for the resume guard.
        self.saved_config = tf.Variable(config_lib.to_yaml(config), trainable=False, name="config")
        self.checkpoints = checkpoint.RunCheckpoint(
            model_dir, chief=chief, max_to_keep=train.keep_checkpoints,
            keep_every_n_hours=train.keep_checkpoint_every_n_hours,
            worker=distribute.worker_index(strategy),
            model=model, optimizer=optimizer, global_step=self.global_step,
            data_position=self.data_position, num_replicas=self.num_replicas,
            rollbacks=self.rollback_count, config=self.saved_config,
            lr_value=self.learning_rate.value, lr_scale=self.learning_rate.scale,
            **({} if self.ema is None else {checkpoint.EMA: self.ema.model}),
        )  # fmt: skip

    def close(self) -> None:
        """Removes the scratch checkpoints and lets another trainer have the directory."""
        self.checkpoints.close()
        if self.lock is not None:
            self.lock.release()

    @property
    def examples_per_epoch(self) -> int:
        return self.pipeline.epoch_examples(self.config.train.batch_size)

    def restore(self, prefix: str | None, verb: str = "Resumed from") -> int:
        """Restores a checkpoint (None: a fresh start); returns the step (`ConfigError`
        when the workers resumed from different steps)."""
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
            examples = self.examples_per_epoch
            epoch, position = divmod(int(self.data_position.numpy()), examples)
            logging.info(
                "%s step %d (epoch %d, example %d of %d) from %s",
                verb, step, epoch, position, examples, prefix,
            )  # fmt: skip
        return step

    def train_dataset(self, size: int) -> tf.distribute.DistributedDataset:
        """The training stream from the data position on at `size` px, split over the replicas."""
        global_batch = self.config.train.batch_size
        replicas = self.strategy.num_replicas_in_sync
        start_example = int(self.data_position.numpy())

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
            return dataset.prefetch(tf.data.AUTOTUNE)

        return distribute.distribute_datasets(self.strategy, dataset_fn)


def build_run(
    config: Config, model_dir: str, restart: bool = False, allow_config_change: bool = False
) -> Run:
    """Checks the settings, plans the run and creates its state in `model_dir` (not yet
    restored: `run.restore(run.resume_from[1])` does). `restart` moves an old run aside;
    `allow_config_change` resumes despite settings that change what the run computes.

    Raises:
      ConfigError: for settings that do not fit the data, the machine or the run.
    """
    # A run that will be resumed: its config.yaml (read before the data).
    path, saved = run_dir.config_path(model_dir), None
    if not restart and run_dir.has_checkpoints(model_dir) and os.path.isfile(path):
        with open(path) as file:
            saved = config_lib.from_yaml(file.read(), path)
    config, source = pretrained.prepare(config, saved)  # Its network, before the data.
    if config.train.teacher and saved is None:  # A resume reads its own copy.
        sources.check_teacher(config.train.teacher, config.train.teacher_model)
    if config.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = distribute.create_strategy(config.train.num_towers, config.sync.timeout)
    _check_machine(config, strategy)
    chief = distribute.is_chief(strategy)
    # Before anything is written there; the job's chief holds it for the job.
    lock = run_lock.RunLock(model_dir).acquire() if chief else None
    try:
        pipeline = run_pipeline.create_run_pipeline(
            config, model_dir=None if restart else model_dir
        )
        size = pipeline.preprocessing.image_size
        plan = plan_run(config, pipeline.epoch_examples(config.train.batch_size), size)
        class_balance.check_single_label_options(config, pipeline.multi_label)
        train = pipeline.train_split
        counts = train.class_counts(pipeline.num_classes) if train is not None else None
        weights = class_balance.class_weights(
            config.train.class_weights, pipeline.class_names, counts
        )
        if config.optimizer.decays_weights and (decay := _preset(config).weight_decay):
            logging.warning(
                "%s decays the weights itself, and model.weight_decay=%g adds an L2 "
                "penalty on top; set model.weight_decay=0 unless both are meant",
                config.optimizer.kind, decay,
            )  # fmt: skip
        # The data and the schedule work: on --restart, move the old run aside.
        if restart and chief and (aside := run_dir.move_aside(model_dir)):
            logging.warning("--restart: moved the previous run to %s", aside)
        run_dir.create(model_dir)
        # Every worker reads the chief's directory (a shared filesystem).
        resume_from = None if restart else checkpoint.find_latest(model_dir)
        changes: dict[str, tuple[Any, Any]] = {}
        if resume_from:
            config, plan, changes = _check_resume(
                config, plan, pipeline, strategy, resume_from, model_dir, allow_config_change
            )
        run = Run(config, model_dir, strategy, chief, pipeline, plan)
        run.lock, run.class_weights = lock, weights
        run.resume_from, run.config_changes = resume_from, changes
        if source is not None and resume_from is None:  # Once, when the run starts.
            pretrained.load(run.model, source, config.model_name, config.train.init_head)
        if run.ema is not None:
            run.ema.reset()  # From the weights the run starts with; a resume restores it.
        run.teacher = teacher_lib.create(
            config, model_dir, strategy, chief, list(pipeline.class_names),
            pipeline.preprocessing, resuming=resume_from is not None,
        )  # fmt: skip
        return run
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def _check_resume(
    config: Config,
    plan: RunPlan,
    pipeline: input_pipeline.InputPipeline,
    strategy: tf.distribute.Strategy,
    resume_from: tuple[int, str],
    model_dir: str,
    allow: bool,
) -> tuple[Config, RunPlan, dict[str, tuple[Any, Any]]]:
    """(config, plan, changes) to resume with, after the resume guard (`resume.py`):
    a change of what the run computes is refused unless allowed; changes are logged."""
    step, prefix = resume_from
    saved = config_lib.from_yaml(
        checkpoint.read_value(prefix, "config").decode(), f"the config saved in {prefix}"
    )
    examples = pipeline.epoch_examples(config.train.batch_size)  # keep_drops keeps it.
    kept = resume.keep_drops(saved, config, examples)
    if kept is not config:
        config, plan = kept, plan_run(kept, examples, pipeline.preprocessing.image_size)
    saved_replicas = checkpoint.read_value(prefix, "num_replicas")
    check = resume.check_resume(
        saved, config, step, None if saved_replicas is None else int(saved_replicas),
        strategy.num_replicas_in_sync, examples, plan,
    )  # fmt: skip
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
    _check_swa_resume(saved, config, plan, step, pipeline.epoch_examples(saved.train.batch_size))
    return config, plan, check.changes


def _check_swa_resume(saved: Config, config: Config, plan: RunPlan, step: int, examples: int):
    """Refuses a resume that moves SWA's models once it has begun averaging them: the
    average in the checkpoint would be weighted as if it held another number of them."""
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


def swa_updates(train: TrainSettings, plan: RunPlan) -> tuple[int, int]:
    """(the update of SWA's first model, the updates between models) for a run's plan."""
    start = min(max(1, round(train.swa_start * plan.total_steps)), plan.total_steps)
    return start, train.swa_every or max(1, plan.steps_per_epoch)


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
    if DERIVED_PRECISION in config.derived:
        chosen = train.precision
        logging.info("train.precision=auto: %s, as %s", chosen, auto_precision.auto_choice().reason)
        # TensorFlow's devices, seen only now, may call for another choice.
        seen = auto_precision.choose(hardware.read_cpu_info(), auto_precision.detect_gpus())
        if seen.precision != chosen:
            logging.warning(
                "train.precision=auto chose %s before TensorFlow loaded, but TensorFlow's "
                "devices call for %s (%s); set train.precision=%s",
                chosen, seen.precision, seen.reason, seen.precision,
            )  # fmt: skip
    elif precision.get(train.precision).compute_dtype == "bfloat16" and not (
        tf.config.list_logical_devices("GPU")
    ):
        warn_if_bf16_is_emulated(hardware.read_cpu_info())
    one_device = isinstance(strategy, tf.distribute.OneDeviceStrategy)
    if train.jit and _preset(config).bn_synchronized and not one_device:
        raise ConfigError(
            "train.jit cannot compile model.bn_synchronized: its all-reduce across towers "
            "cannot run inside XLA; drop one of them"
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
