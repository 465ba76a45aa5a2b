"""`evaluate --watch`: an evaluator beside the trainer, evaluating each new checkpoint once.

    resnet-app evaluate --watch --model_dir=/shared/runs/r50

Every checkpoint that appears in the run directory is evaluated as `evaluate
--checkpoint=ckpt-N` would (the same record), its record written to stdout,
the run's `metrics.jsonl` ("watch": true) and TensorBoard (`evaluator`, or
`evaluator_ema` for the moving average), with its report directory. The
watcher reads and never writes what the trainer reads (no lock, no delayed
save); a checkpoint rotation removed first is skipped. It exits once the run
has ended (an "end" record after its last "start") and every checkpoint up to
that step is evaluated; started first, it waits for the run's config.yaml;
restarted, it skips the checkpoints a watcher with the same settings already
reported. It runs on one machine: a TFJob's `evaluator`, a SLURM step of one
task, or a second process.
"""

from __future__ import annotations

import json
import os
import time
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

    Only complete lines are read; a line that is not JSON is passed over
    silently (not warned about on every poll).

    Attributes:
      ended_at: the step of the run's last "end" record if no "start" followed.
      records: the evaluation records written by a watcher, in order.
    """

    def __init__(self, model_dir: str):
        self._path = os.path.join(model_dir, run_dir.METRICS_FILE)
        self._offset = 0
        self.ended_at: int | None = None
        self.records: list[Record] = []

    def read(self) -> None:
        """Reads what was appended since the last call; ConfigError if the file shrank."""
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
    """Evaluates each checkpoint of `model_dir` as it appears, until the run ends; the records.

    `weights` and `**options` are `checkpoint_eval.evaluate_checkpoints`';
    `timeout` gives up after that many seconds with nothing new (None: wait
    for the run's end).

    Raises:
      ConfigError: as `evaluate_checkpoints`; also for a trainer's TF_CONFIG.
    """
    cluster = tf_config.read()
    trainer = cluster is not None and tf_config.training_tasks(cluster) > 1
    if (trainer and not tf_config.is_evaluator(cluster)) or slurm.read_step() is not None:
        raise ConfigError(
            "--watch runs beside the trainers as one task, but this one is a trainer's: give "
            'its TF_CONFIG "task": {"type": "evaluator", "index": 0}, or run it as a SLURM '
            "step of one task (srun --ntasks=1), or unset TF_CONFIG"
        )
    _wait_for_run(model_dir, poll_seconds, timeout)
    session = checkpoint_eval.Session(model_dir, chosen=list, **options)
    session.events = lambda kind: EMA_EVENTS_DIR if kind == "ema" else EVENTS_DIR
    session.tags = {"watch": True}
    try:
        return _follow(session, weights, poll_seconds, timeout)
    finally:
        session.writer.close()


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
        done.update(  # What a watcher with these settings already reported.
            record.get("checkpoint")
            for record in log.records
            if record.get("split") == session.split
            and record.get("tta") == session.tta
            and weights in ("auto", record.get("weights"))
        )
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


def _evaluate(
    session: checkpoint_eval.Session, step: int, prefix: str, weights: str
) -> Record | None:
    """One checkpoint, as `evaluate --checkpoint=ckpt-N`; None when rotation removed it."""
    from resnet_app.common import checkpoint

    try:
        kind = checkpoint.chosen_weights(prefix, weights)
    except Exception as error:  # noqa: BLE001 - tf.errors.NotFoundError, or a damaged file.
        if isinstance(error, ConfigError) or os.path.exists(prefix + ".index"):
            raise
        logging.warning("Skipping %s: rotation removed it before it could be read", prefix)
        return None
    # As "all" chooses: one removed from here on is skipped with one line.
    return session.evaluate("all", step, prefix, kind)


def _wait_for_run(model_dir: str, poll_seconds: float, timeout: float | None) -> None:
    """Waits for the trainer to create the run (its config.yaml)."""
    path = run_dir.config_path(model_dir)
    if os.path.isfile(path):
        return
    logging.info(
        "Waiting for a trainer to start the run %s (its %s)", model_dir, run_dir.CONFIG_FILE
    )
    started = time.monotonic()
    while not os.path.isfile(path):
        if timeout is not None and time.monotonic() - started > timeout:
            raise ConfigError(
                f"no run appeared in {model_dir} within --watch_timeout={timeout:g} s "
                f"(no {run_dir.CONFIG_FILE}); start the trainer, or check --model_dir"
            )
        time.sleep(poll_seconds)
