"""One trial of a sweep: an ordinary `resnet-app train` run in a directory of its own.

The trial runs in its own process group, dying with the sweep (`common/parent_death.py`),
its output appended to the run's `logs/train.log`. The sweep reads the evaluations it
appends to `metrics.jsonl` (whole lines only) and stops a pruned trial with SIGTERM: the
trainer saves its step and exits, so its run directory can be resumed like any other.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from typing import Any

from resnet_app.common import metrics, parent_death, run_dir

LOG_FILE = "train.log"


def trainer_evaluation(record: dict[str, Any], key: str, split: str) -> bool:
    """Whether a metrics.jsonl record is the trainer's own evaluation on `split` with `key`
    (`resnet-app evaluate` and `--watch` records carry "event" and "checkpoint")."""
    own = "event" not in record and "checkpoint" not in record
    return own and key in record and record.get("split") == split


def _number(value: Any) -> float:
    """A recorded metric as a float (metrics.jsonl writes a value that is not finite as null)."""
    return float(value) if isinstance(value, int | float) else math.nan


class TrialProcess:
    """A running trial in its run directory `run`: its process (on `device`, by
    CUDA_VISIBLE_DEVICES), Unix times `started` and `ended`, the step it was pruned after,
    and the evaluations of `key` on `split` read from the run so far."""

    def __init__(
        self, trial: Any, argv: list[str], run: str, device: str | None, key: str, split: str
    ):
        self.trial, self.number, self.run, self.device = trial, trial.number, run, device
        self._argv, self._key, self._split, self._offset, self._partial = argv, key, split, 0, b""
        self.process: subprocess.Popen | None = None
        self.started = self.ended = None
        self.pruned_at: int | None = None

    def start(self) -> None:
        """Starts the trainer in its own process group, its output to the run's log."""
        logs = os.path.join(self.run, run_dir.LOGS_DIR)
        os.makedirs(logs, exist_ok=True)
        log = run_dir.open_file(
            os.path.join(logs, LOG_FILE), os.O_WRONLY | os.O_CREAT | os.O_APPEND
        )
        env = dict(os.environ)
        if self.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.device
        program = [sys.executable, "-m", "resnet_app.train", *self._argv]
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", parent_death.__name__, str(os.getpid()), *program],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                process_group=0,
            )
        finally:
            os.close(log)
        self.started = time.time()

    def new_evaluations(self) -> list[tuple[int, float]]:
        """(step, value) of the trainer's evaluations written since the last call."""
        path = os.path.join(self.run, metrics.METRICS_FILE)
        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        found = []
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict) and trainer_evaluation(record, self._key, self._split):
                    found.append((int(record["step"]), _number(record[self._key])))
        return found

    def poll(self) -> int | None:
        status = self.process.poll()
        if status is not None and self.ended is None:
            self.ended = time.time()
        return status

    def stop(self, number: int = signal.SIGTERM) -> None:
        """A signal to the trainer's group: SIGTERM saves its step and exits."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, number)

    def started_training(self) -> bool:
        """Whether the trainer got as far as training (its "start" event in metrics.jsonl)."""
        path = os.path.join(self.run, metrics.METRICS_FILE)
        if not os.path.isfile(path):
            return False
        return any(r.get("event") == "start" for r in metrics.read_records(path))

    def kill(self) -> None:
        self.stop(signal.SIGKILL)
        self.process.wait()

    def final_value(self) -> float | None:
        """The metric at the run's end (its last evaluation, at the step it ended on),
        or None when the run did not end (stopped, failed, or no evaluation there)."""
        records = metrics.read_records(os.path.join(self.run, metrics.METRICS_FILE))
        ends = [r for r in records if r.get("event") == "end"]
        if not ends:
            return None
        last = ends[-1]["step"]
        values = [
            r[self._key]
            for r in records
            if trainer_evaluation(r, self._key, self._split) and r["step"] == last
        ]
        return _number(values[-1]) if values else None

    def error_line(self) -> str:
        """The trainer's `error:` line, or the last line of its log."""
        path = os.path.join(self.run, run_dir.LOGS_DIR, LOG_FILE)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = [line.rstrip() for line in f if line.strip()]
        except OSError:
            return "no output"
        errors = [line for line in lines if line.startswith("error: ")]
        return (errors or lines or ["no output"])[-1][:300]
