"""`evaluate --watch`: an evaluator beside the trainer, evaluating each new checkpoint once.

    resnet-app evaluate --watch --model_dir=/shared/runs/r50

It follows a run directory that a trainer is writing (on this machine or
another that shares the directory): every checkpoint that appears is
evaluated exactly once, as `evaluate --checkpoint=ckpt-N` would evaluate it
(the same record, the same numbers), and its record goes to stdout, to the
run's `metrics.jsonl` (with "event": "evaluation" and "watch": true) and to
TensorBoard under its step, in `MODEL_DIR/evaluator` (or `evaluator_ema` for
the moving average of the weights), beside the trainer's `train` and `eval`.
Each checkpoint also gets its report directory, as with `evaluate`.

A run that had ended when the watcher started counts as ended until the
trainer's next "start": to follow a finished run you extend, start the
watcher after the trainer. The run's metrics.jsonl is appended to by both
(one line per write, O_APPEND): atomic on a local filesystem, not promised
across NFS clients.

It reads and never writes what the trainer reads: it takes no lock, and a
save is never delayed by it. A checkpoint that rotation removed before the
watcher reached it is skipped with one line. It exits once the run has
ended (the trainer's "end" record, after its last "start") and every
checkpoint up to that step, the end's own included, is evaluated. Started
before the trainer (a TFJob's evaluator pod may be), it waits for the run's
`config.yaml`. Restarted, it goes on where it stopped: a checkpoint whose
record a watcher with the same split, test-time augmentation and weights
already wrote is not evaluated again. `--watch_timeout=S` gives up after S
seconds with nothing new.

The watcher runs on one machine. Under a TFJob it is the `evaluator`
replica (its TF_CONFIG says so, and it stays out of the training cluster);
under SLURM a step of one task; anywhere, a second process.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from absl import logging

from resnet_app.common import run_dir, slurm, tf_config
from resnet_app.common.errors import ConfigError
from resnet_app.evaluation import checkpoint_eval

Record = dict[str, Any]

EVENTS_DIR = "evaluator"  # TensorBoard's runs for the watcher's records: raw weights,
EMA_EVENTS_DIR = "evaluator_ema"  # and their moving average.
POLL_SECONDS = 10.0


class RunLog:
    """What a watcher needs from a growing `metrics.jsonl`, read incrementally.

    Only complete lines are read (the trainer may be writing the last one);
    a line that is not JSON is passed over silently, as `metrics.read_records`
    would warn about it on every poll.

    Attributes:
      ended_at: the step of the run's "end" record when no "start" came after
        it (the run is over), else None.
      records: the evaluation records written by a watcher, in order.
    """

    def __init__(self, model_dir: str):
        self._path = os.path.join(model_dir, run_dir.METRICS_FILE)
        self._offset = 0
        self.ended_at: int | None = None
        self.records: list[Record] = []

    def read(self) -> None:
        """Reads what was appended since the last call.

        Raises:
          ConfigError: when the file is shorter than what was read (replaced:
            the run was started over with --restart).
        """
        try:
            with open(self._path, "rb") as file:
                if os.fstat(file.fileno()).st_size < self._offset:
                    raise ConfigError(
                        f"{self._path} was replaced while being watched (the run was started "
                        "over with --restart?); start the watcher again for the new run"
                    )
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict):
                continue
            event = record.get("event")
            if event == "start":
                self.ended_at = None
            elif event == "end" and isinstance(record.get("step"), int):
                self.ended_at = record["step"]
            elif event == "evaluation" and record.get("watch") is True:
                self.records.append(record)


def watch_run(
    model_dir: str,
    *,
    weights: str = "auto",
    poll_seconds: float = POLL_SECONDS,
    timeout: float | None = None,
    **options: Any,
) -> list[Record]:
    """Evaluates each checkpoint of `model_dir` as it appears, until the run ends.

    Args:
      model_dir, weights: as `checkpoint_eval.evaluate_checkpoints`.
      poll_seconds: how often the run directory is looked at.
      timeout: give up after this many seconds without a new checkpoint (or
        without the run's config.yaml); None waits for the run's end.
      **options: `evaluate_checkpoints`' split, batch_size, num_towers,
        data_dir, report_dir, tta and on_record.

    Returns:
      The records of the checkpoints this call evaluated, in order.

    Raises:
      ConfigError: as `evaluate_checkpoints`; also for a training TF_CONFIG
        (the watcher runs on one machine, beside the trainers).
    """
    cluster = tf_config.read()
    trainer = cluster is not None and tf_config.training_tasks(cluster) > 1
    if (trainer and not tf_config.is_evaluator(cluster)) or slurm.read_step() is not None:
        raise ConfigError(
            "--watch runs beside the trainers as one task, but this one is a trainer's: give "
            'its TF_CONFIG "task": {"type": "evaluator", "index": 0}, or run it as a SLURM '
            "step of one task (srun --ntasks=1), or unset TF_CONFIG"
        )
    _wait_for(
        lambda: os.path.isfile(run_dir.config_path(model_dir)), model_dir, poll_seconds, timeout
    )
    session = checkpoint_eval.open_session(model_dir, chosen=list, **options)
    session.events = lambda kind: EMA_EVENTS_DIR if kind == "ema" else EVENTS_DIR
    session.tags = {"watch": True}
    try:
        return _follow(session, weights, poll_seconds, timeout)
    finally:
        session.close()


def _follow(
    session: checkpoint_eval.Session, weights: str, poll_seconds: float, timeout: float | None
) -> list[Record]:
    """The watcher's loop: evaluate what is new, stop at the run's end."""
    from resnet_app.common import checkpoint

    model_dir, log = session.model_dir, RunLog(session.model_dir)
    done: set[str] = set()
    records: list[Record] = []
    last_news, newest = time.monotonic(), 0
    logging.info("Watching %s for new checkpoints (every %g s)", model_dir, poll_seconds)
    while True:
        log.read()
        done.update(_already_evaluated(log.records, session, weights))
        listed = checkpoint.list_checkpoints(model_dir)
        newest = max([newest, *(step for step, _ in listed)])
        new = [(s, p) for s, p in listed if os.path.basename(p) not in done]
        for step, prefix in new:
            done.add(os.path.basename(prefix))
            record = _evaluate(session, step, prefix, weights)
            if record is not None:
                records.append(record)
        if new:
            last_news = time.monotonic()
            continue  # Look again at once: the trainer may have saved meanwhile.
        # The end always saves: until its checkpoint is listed (a network
        # filesystem's listing may lag), the run's last evaluation is to come.
        if log.ended_at is not None and newest >= log.ended_at:
            logging.info("The run ended at step %d: every checkpoint is evaluated", log.ended_at)
            return records
        if timeout is not None and time.monotonic() - last_news > timeout:
            logging.warning(
                "No new checkpoint in %s for %g s (--watch_timeout) and the run has not ended; "
                "stopping",
                model_dir,
                timeout,
            )
            return records
        time.sleep(poll_seconds)


def _already_evaluated(
    written: list[Record], session: checkpoint_eval.Session, weights: str
) -> set[str]:
    """The checkpoints a watcher with these settings already reported (a restarted watcher)."""
    return {
        record.get("checkpoint")
        for record in written
        if record.get("split") == session.split
        and record.get("tta") == session.tta
        and weights in ("auto", record.get("weights"))
    }


def _evaluate(
    session: checkpoint_eval.Session, step: int, prefix: str, weights: str
) -> Record | None:
    """One checkpoint, as `evaluate --checkpoint=ckpt-N`; None when rotation removed it."""
    from resnet_app.common import checkpoint

    try:
        kind = checkpoint.chosen_weights(prefix, weights)
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - tf.errors.NotFoundError, or a damaged file.
        if os.path.exists(prefix + ".index"):
            raise
        logging.warning("Skipping %s: rotation removed it before it could be read", prefix)
        return None
    # As "all" chooses: one removed from here on is skipped with one line.
    return session.evaluate("all", step, prefix, kind)


def _wait_for(
    ready: Callable[[], bool], model_dir: str, poll_seconds: float, timeout: float | None
) -> None:
    """Waits for the trainer to create the run (its config.yaml)."""
    if ready():
        return
    logging.info(
        "Waiting for a trainer to start the run %s (its %s)", model_dir, run_dir.CONFIG_FILE
    )
    started = time.monotonic()
    while not ready():
        if timeout is not None and time.monotonic() - started > timeout:
            raise ConfigError(
                f"no run appeared in {model_dir} within --watch_timeout={timeout:g} s "
                f"(no {run_dir.CONFIG_FILE}); start the trainer, or check --model_dir"
            )
        time.sleep(poll_seconds)
