"""Training a run: `train_and_evaluate(config, model_dir) -> RunResult`.

`setup.build_run` builds the run; `train` restores it, writes its `config.yaml`
and `data_info.json`, and runs the `controller.Controller`: compiled calls up
to the next boundary (`cadence.py`), then the actions (`actions.py`) that log,
evaluate and save. A `DivergedError` is rolled back (`train.on_nan=rollback`)
or becomes a one-line error; a lost peer, a full disk or an exhausted memory
end the run in one line. SIGTERM or SIGINT stop it after the step in progress
with a checkpoint; SIGUSR1 does too, then raises `PreemptedError` (exit status
3: requeue the job; `preemption.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from resnet_app import config as config_lib
from resnet_app.common import averaged_checkpoint, disk_space, distribute, run_dir
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.common.metrics import MetricsWriter, format_duration, hparam_values
from resnet_app.config import Config, script_permission
from resnet_app.data import run_pipeline
from resnet_app.engine import cadence, divergence, lost_worker, preemption, setup, sync
from resnet_app.engine import teacher as teacher_lib
from resnet_app.engine.actions import Action, Evaluator, create_actions
from resnet_app.engine.controller import Controller
from resnet_app.engine.last_step import LastStep
from resnet_app.engine.losses import create_loss
from resnet_app.engine.plan import describe_schedule
from resnet_app.engine.profiler import Profiler
from resnet_app.engine.step import Tower, TrainStep

# (model_dir, bn_batches) -> its record: SWA's last average with BatchNorm measured on
# that many training batches, evaluated and written as the run's averaged checkpoint
# (the train command passes `evaluation/soup.py`'s).
SwaCheckpoint = Callable[[str, int], dict[str, Any]]


@dataclasses.dataclass
class RunResult:
    """What `train_and_evaluate` returns.

    Attributes:
      summary: the final evaluation record plus "train_loss" (the last logged) and
        "examples_per_sec"; for a stopped run, {"step", "stopped": the signal's name}.
      model: the trained model (moving statistics averaged over towers).
      stopped: the signal that stopped the run before its end, or None.
    """

    summary: dict[str, Any]
    model: keras.Model
    stopped: str | None = None


def train_and_evaluate(
    config: Config,
    model_dir: str,
    restart: bool = False,
    allow_config_change: bool = False,
    actions: Sequence[Action] = (),
    swa_checkpoint: SwaCheckpoint | None = None,
) -> RunResult:
    """Trains and evaluates `config` in `model_dir`, resumed when it holds a checkpoint
    (`restart`: moved aside first; `allow_config_change`: even with settings that change
    what the run computes), with `train`'s `actions` and `swa_checkpoint`.

    Raises:
      ConfigError: for settings that do not fit the data or machine, a run directory
        of another model or settings, unreadable checkpoints, or a diverged run.
    """
    run = setup.build_run(config, model_dir, restart, allow_config_change)
    return train(run, actions, swa_checkpoint)


def train(
    run: setup.Run, actions: Sequence[Action] = (), swa_checkpoint: SwaCheckpoint | None = None
) -> RunResult:
    """Trains a run built by `setup.build_run` (not yet restored) to its end or a stop.

    Args:
      run: the run.
      actions: more actions, after the evaluator and before the checkpointer: they
        see the record and the evaluation and may ask for a save or a stop.
      swa_checkpoint: with `train.swa_start`, writes the averaged checkpoint at the
        end; None: the log names the command that does.

    Raises:
      ConfigError: for unreadable checkpoints, or a diverged run.
    """
    writer = MetricsWriter(run.model_dir, enabled=run.chief)
    # On the way out: the writer closed, then the run, then the signal handlers restored.
    with preemption.StopRequest() as stop, contextlib.closing(run), contextlib.closing(writer):
        settings = run.config.train
        policy = sync.create_policy(run)
        intervals = cadence.create_intervals(
            run.plan.total_steps,
            run.plan.steps_per_epoch,
            settings.log_every,
            settings.eval_every,
            settings.checkpoint_every,
            settings.steps_per_loop,
            align=policy.align,
        )
        start = run.restore(run.resume_from[1] if run.resume_from else None)
        _record_settings(run, writer, start)
        last = _last_step(run)
        global_model = sync.GlobalModel(policy, run.checkpoints, run.strategy)
        actions, evaluator = create_actions(run, writer, policy, global_model, start, actions)
        actions = [Profiler(run), *actions]
        loss = create_loss(run.config, run.class_weights, run.teacher)
        tower = Tower(
            run.model, run.optimizer, loss, settings.seed, settings.accumulate_steps, settings.jit
        )
        if run.teacher is not None:
            _log_teacher_cost(run, writer, start)
        time_input = not settings.deterministic
        train_step = TrainStep(tower, run.strategy, policy, run.ema, last, time_input)
        controller = Controller(run, train_step, policy, global_model, intervals, actions, stop)
        _announce(run, writer, start, intervals)
        step, restored = start, run.resume_from is not None
        while True:
            try:
                if last is not None:
                    last.commit_now(step)  # What a survivor saves until a step completes.
                step, stopped = controller.train(step, restored)
                break
            except lost_worker.PEER_ERRORS as error:
                if not distribute.is_multi_worker(run.strategy):
                    raise
                lost = lost_worker.survive(run, last, error)  # The last complete step saved.
                at = int(run.global_step.numpy())
                writer.write({"step": at, "event": "worker_lost", "message": str(lost)})
                raise lost from None  # The command prints it, once.
            except divergence.DivergedError as diverged:
                controller.interrupt()
                step, restored = divergence.roll_back(run, writer, diverged), True
            except tf.errors.ResourceExhaustedError as error:
                if disk_space.is_disk_full(error):  # A write outside the checkpointer's save.
                    raise disk_space.DiskFullError(
                        f"no space left in {run.model_dir} ({first_line(error)}); free some space "
                        "and rerun the same command to resume from the last checkpoint"
                    ) from None
                raise _out_of_memory(run, error) from None
        if stopped:
            result = _stopped(run, writer, step, stopped)
            # A notice to any worker, even after the agreed stop: exit status 3, requeue.
            if distribute.any_worker(run.strategy, stop.preempted):
                raise preemption.preempted_error(step, run.model_dir)
            return result
        return _finish(run, writer, controller, evaluator, step, swa_checkpoint)


def _log_teacher_cost(run: setup.Run, writer: MetricsWriter, start: int) -> None:
    """The teacher's forward pass on one tower's batch, timed once, logged and recorded."""
    size = run.plan.sizes.size_at(start)
    per_tower = run.config.train.batch_size // run.strategy.num_replicas_in_sync
    shape = [per_tower, size, size, run.pipeline.channels]
    dtype = tf.as_dtype(run.pipeline.preprocessing.dtype)
    seconds = teacher_lib.log_cost(run.teacher, shape, dtype)
    writer.write({"step": start, "event": "teacher", "forward_seconds": round(seconds, 4)})


def keeps_last_step(run: setup.Run) -> bool:
    """Whether the run keeps a copy of its last step: multi-worker, `sync.keep_last_step`."""
    return distribute.is_multi_worker(run.strategy) and run.config.sync.keep_last_step


def _last_step(run: setup.Run) -> LastStep | None:
    """The copy of the last completed step (`last_step.py`), when the run keeps one."""
    if not keeps_last_step(run):
        return None
    variables = [*run.model.variables, *run.optimizer.variables]
    if run.ema is not None:
        variables += run.ema.model.variables
    return LastStep(run.strategy, variables, run.local_sgd)


def _out_of_memory(run: setup.Run, error: Exception) -> ConfigError:
    """A training step that ran out of memory, as one line naming what to change."""
    replicas = run.strategy.num_replicas_in_sync
    return ConfigError(
        f"out of memory training {run.config.model_name} on "
        f"{run.pipeline.preprocessing.image_size} px images, "
        f"{run.config.train.batch_size // replicas} per tower ({first_line(error)}); use a "
        "smaller --batch_size, more towers or --set train.accumulate_steps=N (the same batch "
        "in N slices); the run resumes from its last checkpoint"
    )


def _record_settings(run: setup.Run, writer: MetricsWriter, start: int) -> None:
    """Once resumed, the run directory's files describe the run from here on."""
    if run.chief:
        config_lib.write_yaml(run.config, run_dir.config_path(run.model_dir))
        run_pipeline.write_data_info(run.pipeline, run.model_dir)
        if run.config.schedule.RUNS_CODE:  # Allowed (train.py): a resume may run it.
            script_permission.record(run.model_dir, run.config.schedule.path)
    if run.config_changes:
        changes = {key: list(values) for key, values in run.config_changes.items()}
        writer.write({"step": start, "event": "config_change", "changes": changes})


def _announce(
    run: setup.Run, writer: MetricsWriter, start: int, intervals: cadence.Intervals
) -> None:
    total, config, pipeline = intervals.total, run.config, run.pipeline
    batch, examples = config.train.batch_size, run.examples_per_epoch
    replicas = run.strategy.num_replicas_in_sync
    logging.info(
        "Training %s on %s (%s): %d steps (%.2f epochs of %d examples), global batch %d "
        "on %d replica(s), evaluating on %s every %d steps; run directory %s",
        config.model_name, config.data.dataset, pipeline.describe(), total,
        total * batch / examples, examples, batch, replicas, pipeline.eval_split_name,
        intervals.eval_every, run.model_dir,
    )  # fmt: skip
    schedule = describe_schedule(config, run.plan)
    logging.info("Learning rate (schedule.%s): %s", config.schedule.kind, schedule)
    sizes = run.plan.sizes
    if sizes.progressive:
        logging.info(
            "Progressive resizing (data.progressive): %s; evaluated at %d px; the batch stays %d",
            sizes.describe(), pipeline.preprocessing.eval_size, batch,
        )  # fmt: skip
    devices = distribute.describe_devices(run.strategy)
    record = {"step": start, "event": "start", "total_steps": total, "devices": devices}
    writer.write({**record, "time": time.time()})
    settings = hparam_values(run.config.to_dict(with_derived=True))
    writer.hparams(
        {**settings, "total_steps": total}, os.path.basename(os.path.abspath(run.model_dir))
    )


def _stopped(run: setup.Run, writer: MetricsWriter, step: int, reason: str) -> RunResult:
    writer.write({"step": step, "event": "stopped", "signal": reason})
    logging.warning(
        "Stopped by %s at step %d of %d; saved a checkpoint in %s. Rerun the same command "
        "to resume.",
        reason, step, run.plan.total_steps, run.model_dir,
    )  # fmt: skip
    return RunResult(summary={"step": step, "stopped": reason}, model=run.model, stopped=reason)


def _finish(
    run: setup.Run,
    writer: MetricsWriter,
    controller: Controller,
    evaluator: Evaluator,
    step: int,
    swa_checkpoint: SwaCheckpoint | None,
) -> RunResult:
    last_eval = evaluator.last
    if last_eval is None:  # Resumed at the end: report what is there.
        last_eval = evaluator.evaluate(step)
    elapsed = time.monotonic() - controller.started
    summary = {
        **last_eval,
        "train_loss": controller.train_loss,
        "examples_per_sec": controller.trained_examples / max(elapsed, 1e-9),
    }
    writer.write({"step": step, "event": "end", "seconds": elapsed})
    scores = [last_eval[k] for k in ("split", "top1", "top5", "loss", "num_examples")]
    logging.info(
        "Done: %d steps in %s (%.0f examples/s); %s top-1 %.4f, top-5 %.4f, loss %.4f on "
        "%d examples; run directory %s",
        step, format_duration(elapsed), summary["examples_per_sec"], *scores, run.model_dir,
    )  # fmt: skip
    train = run.config.train
    if "ema_top1" in last_eval:
        if train.swa_start:
            average = f"SWA's average of the weights (train.swa_start={train.swa_start:g})"
        else:
            average = f"Moving average of the weights (train.ema_decay={train.ema_decay:g})"
        logging.info(
            "%s: top-1 %.4f, top-5 %.4f, loss %.4f; evaluate, export and predict use it unless "
            "given --weights=raw",
            average, last_eval["ema_top1"], last_eval["ema_top5"], last_eval["ema_loss"],
        )  # fmt: skip
    if train.swa_start and run.chief:
        summary["swa"] = _write_swa_checkpoint(run, writer, step, swa_checkpoint)
    return RunResult(summary=summary, model=run.model)


def _write_swa_checkpoint(
    run: setup.Run, writer: MetricsWriter, step: int, swa_checkpoint: SwaCheckpoint | None
) -> dict[str, Any]:
    """SWA's end: its average with BatchNorm measured again, as the run's averaged checkpoint."""
    start, period = setup.swa_updates(run.config.train, run.plan)
    models = (step - start) // period + 1 if step >= start else 0
    command = f"resnet-app average --model_dir={run.model_dir} --last=1 --weights=ema"
    found = averaged_checkpoint.read(run.model_dir)
    if found is not None and found[1].get("step") == step:
        # Resumed at its end: written then (or replaced since by `resnet-app average`).
        logging.info("SWA: the run's averaged checkpoint of step %d is there already", step)
        return found[1]
    if swa_checkpoint is None or distribute.is_multi_worker(run.strategy):
        # Multi-worker: minutes of BatchNorm passes on the chief alone would outlast
        # the job's shutdown.
        logging.info("SWA: measure the average's BatchNorm statistics with: %s", command)
        return {}
    record = swa_checkpoint(run.model_dir, run.config.train.swa_bn_batches)
    evaluation = record["evaluation"]
    scores = {
        key: evaluation[key] for key in ("split", "top1", "top5", "loss") if key in evaluation
    }
    bn_batches, checkpoint = record["bn_batches"], record["checkpoint"]
    event = {"step": step, "event": "swa", "checkpoint": checkpoint, "models": models}
    writer.write({**event, "bn_batches": bn_batches, **scores})
    top1 = evaluation.get("top1", float("nan"))
    logging.info(
        "SWA: the mean of %d models (updates %d, %d, ... every %d) with BatchNorm measured on %d "
        "training batches: top-1 %.4f on %s; the run's averaged checkpoint %s "
        "(evaluate and export --checkpoint=averaged)",
        models, start, start + period, period, bn_batches, top1, evaluation.get("split"),
        checkpoint,
    )  # fmt: skip
    return record
