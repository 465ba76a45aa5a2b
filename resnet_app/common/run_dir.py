"""The run directory (`--model_dir`): the one module that names its files.

A run directory holds:
- `config.yaml`: the run's config, as the user chose it (`config.write_yaml`,
  `config.read_run_config`);
- `metrics.jsonl`: one JSON record per line (`metrics.MetricsWriter`);
- `data_info.json`: the class names and the resolved preprocessing, so that
  export and predict need no dataset (`run_pipeline.write_data_info`);
- `temperature.json`: the softmax temperature fitted on the holdout split by
  `python -m resnet_app.evaluate --fit_temperature` (`evaluation/calibration.py`);
- `schedule_script.json`: the schedule script the user allowed this run to
  run, with the SHA-256 of its content, so that a resume runs it again
  unasked only while it is unchanged (`config/script_permission.py`);
- `lr_override`: a learning rate the user writes while the run goes on; the
  trainer renames it `lr_override.applied` once read (`engine/learning_rate.py`);
- `ckpt-<step>.index` and `.data-*`: the checkpoints, and `checkpoint`,
  TensorFlow's index of them (`common/checkpoint.py`);
- `best/`: with `train.keep_best`, the checkpoint of the best evaluation so
  far, `best-<step>.index` and `.data-*` (named unlike the rolling ones, so
  that neither rotation nor a resume ever takes it for one), and `best.json`:
  the metric, its direction, value, step and evaluation record. It is
  replaced whole (`checkpoint.keep_best`): a new one is written to
  `best.partial-<pid>/`, the old one renamed to `best.old-<pid>/`, the new one
  renamed in, the old one removed;
- `train/`, `eval/`: TensorBoard's events;
- `reports/`: `python -m resnet_app.evaluate`'s reports (`evaluation/reports.py`);
- `previous-<time>/`: an earlier run, moved aside by `--restart` (`move_aside`);
- `logs/worker<i>.log`: each worker's output under `python -m resnet_app.launch`;
- `.survivor.lock`: locked while a survivor of a lost worker saves
  (`engine/lost_worker.py`);
- `trainer.lock`: locked by the trainer while it runs, holding its pid, host
  and start time (`run_lock.py`); it stays put on `--restart`.
Files written in place are opened with `open_file`/`open_append`, never
through a symbolic link.

Every other module takes these names from here. No TensorFlow: scripts that
only read files (`resnet-app plot`) import this module too.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from resnet_app.common import files
from resnet_app.common.errors import ConfigError

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
DATA_INFO_FILE = "data_info.json"
TEMPERATURE_FILE = "temperature.json"
LR_OVERRIDE_FILE = "lr_override"
SCHEDULE_SCRIPT_FILE = "schedule_script.json"
LR_OVERRIDE_APPLIED = LR_OVERRIDE_FILE + ".applied"
CHECKPOINT_PREFIX = "ckpt"
CHECKPOINT_INDEX_FILE = "checkpoint"  # TensorFlow's list of the checkpoints.
TRAIN_EVENTS_DIR = "train"
EVAL_EVENTS_DIR = "eval"
EMA_EVAL_EVENTS_DIR = "eval_ema"  # The moving average of the weights, evaluated.
REPORTS_DIR = "reports"
PREVIOUS_PREFIX = "previous-"
LOCK_FILE = "trainer.lock"
LOGS_DIR = "logs"  # The launcher's worker logs.
SURVIVOR_LOCK_FILE = ".survivor.lock"  # Keeps apart the saves of a lost worker's survivors.
BEST_DIR = "best"
BEST_FILE = "best.json"
BEST_CHOICE = "best"  # --checkpoint=best
# --weights: a checkpoint's moving average of the weights, its weights, or the
# average when it has one (`checkpoint.restore_model`).
WEIGHTS = ("auto", "ema", "raw")
_BEST_STAGED = BEST_DIR + ".partial-"  # A best being written.
_BEST_ASIDE = BEST_DIR + ".old-"  # The best it replaces, until the new one is in place.

_CHECKPOINT_INDEX = re.compile(rf"^{CHECKPOINT_PREFIX}-(\d+)\.index$")
# A name TensorFlow would take for a checkpoint prefix, or one of its files.
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}-\d+(\..*)?$")
# "ckpt-N" or "N", as --checkpoint takes them.
_CHECKPOINT_CHOICE = re.compile(rf"(?:{CHECKPOINT_PREFIX}-)?(\d+)")

T = TypeVar("T")


def open_file(path: str, flags: int, mode: int = 0o644) -> int:
    """`os.open` of a file of the run directory, never through a symbolic link.

    The files resnet_app opens in place (the lock, metrics.jsonl, the worker
    logs) are created or written without following a link at `path`: a run
    directory received from someone else cannot make a resume write over
    another file (`trainer.lock` -> ~/.bashrc). Files replaced whole
    (`files.write_atomically`) are renamed over a link, never through it.

    Raises:
      ConfigError: `path` is a symbolic link (one line, how to fix it).
    """
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ConfigError(
                f"{path} is a symbolic link; resnet_app writes a run's files only as files "
                "of their own: remove the link (or use another --model_dir)"
            ) from None
        raise


def unwritable(directory: str) -> str | None:
    """Why no file can be created in `directory` (e.g. "Read-only file system"), or None.

    Tried, not guessed from the mode bits: root ignores them, and a read-only
    mount or a full quota answers only to a write.
    """
    probe = os.path.join(directory, f".write-test-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except OSError as error:
        return error.strerror or str(error)
    return None


def open_append(path: str):
    """`open(path, "a")` for a file of the run directory, never through a symbolic link."""
    return os.fdopen(open_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a")


def config_path(model_dir: str) -> str:
    """`model_dir/config.yaml`."""
    return os.path.join(model_dir, CONFIG_FILE)


def lock_path(model_dir: str) -> str:
    """The lock file that keeps a second trainer out (`run_lock.py`)."""
    return os.path.join(model_dir, LOCK_FILE)


def metrics_path(model_dir: str) -> str:
    """`model_dir/metrics.jsonl`."""
    return os.path.join(model_dir, METRICS_FILE)


def data_info_path(model_dir: str) -> str:
    """`model_dir/data_info.json`."""
    return os.path.join(model_dir, DATA_INFO_FILE)


def temperature_path(model_dir: str) -> str:
    """`model_dir/temperature.json`."""
    return os.path.join(model_dir, TEMPERATURE_FILE)


def lr_override_path(model_dir: str) -> str:
    """`model_dir/lr_override`."""
    return os.path.join(model_dir, LR_OVERRIDE_FILE)


def events_dir(model_dir: str, kind: str) -> str:
    """TensorBoard's directory for `kind` (`TRAIN_EVENTS_DIR`, `EVAL_EVENTS_DIR` or
    `EMA_EVAL_EVENTS_DIR`)."""
    return os.path.join(model_dir, kind)


def reports_dir(model_dir: str) -> str:
    """`model_dir/reports`, where evaluation reports go by default."""
    return os.path.join(model_dir, REPORTS_DIR)


def checkpoint_name(step: int) -> str:
    """The checkpoint prefix of `step`, e.g. `ckpt-4`."""
    return f"{CHECKPOINT_PREFIX}-{step}"


def checkpoint_step(file_name: str) -> int | None:
    """The step of a checkpoint's index file name (`ckpt-4.index`: 4), else None."""
    match = _CHECKPOINT_INDEX.match(file_name)
    return int(match.group(1)) if match else None


def is_checkpoint_name(name: str) -> bool:
    """Whether TensorFlow would take `name` for a checkpoint prefix or one of its files."""
    return bool(_CHECKPOINT_NAME.match(name))


def has_checkpoints(model_dir: str) -> bool:
    """Whether `model_dir` holds a checkpoint (an index file of one; readable or not)."""
    try:
        names = os.listdir(model_dir)
    except OSError:
        return False
    return any(_CHECKPOINT_INDEX.match(name) for name in names)


def best_dir(model_dir: str) -> str:
    """`model_dir/best`, the checkpoint of the best evaluation so far (`train.keep_best`)."""
    return os.path.join(model_dir, BEST_DIR)


def best_checkpoint_name(step: int) -> str:
    """The best checkpoint's prefix in `best/`, e.g. `best-8` (not a rolling `ckpt-N` name)."""
    return f"{BEST_DIR}-{step}"


def best_work_dirs(model_dir: str) -> tuple[str, str]:
    """This process's (staged, aside) directories for replacing `best/`."""
    pid = os.getpid()
    return (
        os.path.join(model_dir, f"{_BEST_STAGED}{pid}"),
        os.path.join(model_dir, f"{_BEST_ASIDE}{pid}"),
    )


def best_leftovers(model_dir: str) -> tuple[list[str], list[str]]:
    """(staged, aside) directories an interrupted replacement of `best/` left, oldest first."""
    try:
        names = os.listdir(model_dir)
    except OSError:
        return [], []

    def oldest_first(prefix: str) -> list[str]:
        found = []
        for name in names:
            path = os.path.join(model_dir, name)
            with contextlib.suppress(OSError):  # Gone since the listing: not left over.
                if name.startswith(prefix):
                    found.append((os.stat(path).st_mtime, path))
        return [path for _, path in sorted(found)]

    return oldest_first(_BEST_STAGED), oldest_first(_BEST_ASIDE)


def find_best_dir(model_dir: str) -> str | None:
    """The directory holding the run's best checkpoint, or None.

    `best/`, once complete (it holds `best.json`); else, after a crash between
    the two renames that replace it, the previous best set aside
    (`best.old-<pid>/`), complete by then.
    """
    candidates = [best_dir(model_dir), *reversed(best_leftovers(model_dir)[1])]
    for directory in candidates:
        if os.path.isfile(os.path.join(directory, BEST_FILE)):
            return directory
    return None


def read_best(model_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(its directory, `best.json`) of the run's best checkpoint, or None if it has none.

    Raises:
      ConfigError: when `best.json` cannot be read or lacks the step or checkpoint.
    """
    directory = find_best_dir(model_dir)
    if directory is None:
        return None
    remedy = f"delete {directory} to start keeping the best anew"
    return directory, read_kept_record(os.path.join(directory, BEST_FILE), remedy)


def read_kept_record(path: str, remedy: str) -> dict[str, Any]:
    """The JSON record beside a kept checkpoint (best.json, averaged.json): at least its
    "step" and "checkpoint" (its name in that directory).

    Raises:
      ConfigError: "PATH is damaged (...); REMEDY".
    """
    try:
        with open(path) as f:
            record = json.load(f)
        if not isinstance(record["step"], int) or not isinstance(record["checkpoint"], str):
            raise TypeError("step or checkpoint of the wrong type")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path} is damaged ({type(error).__name__}: {error}); {remedy}"
        ) from None
    return record


def chosen_step(which: str) -> int | None:
    """The step `--checkpoint=ckpt-N` or `--checkpoint=N` names, else None."""
    match = _CHECKPOINT_CHOICE.fullmatch(which)
    return int(match.group(1)) if match else None


def write_data_info(model_dir: str, info: dict[str, Any]) -> None:
    """Writes `data_info.json` whole (atomically)."""
    files.write_text_atomically(data_info_path(model_dir), json.dumps(info, indent=1))


def read_data_info(model_dir: str, parse: Callable[[dict[str, Any]], T]) -> T | None:
    """`parse` of the run's `data_info.json`, or None if there is none.

    Args:
      model_dir: the run directory.
      parse: turns the file's JSON object into what the caller needs; it raises
        KeyError, TypeError or ValueError for a file it cannot use.

    Raises:
      ConfigError: when the file exists but cannot be read or parsed.
    """
    path = data_info_path(model_dir)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return parse(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path} is damaged ({type(error).__name__}: {error}); delete it to take the "
            f"classes and preprocessing from the dataset again"
        ) from None


def recorded_multi_label(model_dir: str) -> bool:
    """Whether the run's data is multi-label, as data_info.json records (False before it did)."""
    return bool(read_data_info(model_dir, lambda info: bool(info.get("multi_label"))))


def create(model_dir: str) -> None:
    """Makes the run directory (and its parents) if it is not there yet.

    Raises:
      ConfigError: when it cannot be made (a read-only or missing filesystem).
    """
    try:
        os.makedirs(model_dir, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"--model_dir={model_dir} cannot be created ({error.strerror}); pick a directory "
            "you can write to"
        ) from None


def move_aside(directory: str) -> str | None:
    """Moves a run directory's contents into `directory/previous-<time>/` (for --restart).

    Earlier `previous-*` folders stay where they are.

    Args:
      directory: the run directory.

    Returns:
      The new folder, or None if there was nothing to move.

    Raises:
      ConfigError: when the directory holds files but does not look like a run
        directory (a mistyped --model_dir must not move a source tree).
    """
    if not os.path.isdir(directory):
        return None
    # The lock stays (the trainer moving the run aside holds it), and the
    # launcher's logs, which it is writing.
    names = [
        n
        for n in os.listdir(directory)
        if not n.startswith(PREVIOUS_PREFIX) and n not in (LOCK_FILE, LOGS_DIR)
    ]
    if not names:
        return None
    markers = (CONFIG_FILE, METRICS_FILE, CHECKPOINT_INDEX_FILE)
    if not any(n in markers or checkpoint_step(n) is not None for n in names):
        raise ConfigError(
            f"--restart: {directory} is not a run directory (no checkpoint, {CONFIG_FILE} or "
            f"{METRICS_FILE}); check --model_dir"
        )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = os.path.join(directory, f"{PREVIOUS_PREFIX}{stamp}")
    count = 1
    while os.path.exists(aside):
        count += 1
        aside = os.path.join(directory, f"{PREVIOUS_PREFIX}{stamp}-{count}")
    os.makedirs(aside)
    for name in names:
        os.replace(os.path.join(directory, name), os.path.join(aside, name))
    return aside
