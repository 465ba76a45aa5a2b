"""The run directory (`--model_dir`): the one module that names its files.

config.yaml, metrics.jsonl, data_info.json (classes and preprocessing, so that
export and predict need no dataset), temperature.json, schedule_script.json,
lr_override (renamed .applied once read), the checkpoints (`ckpt-N.*`,
`checkpoint`), best/ and averaged/ (replaced whole via `.partial-<pid>` and
`.old-<pid>`), TensorBoard's train/ eval/ eval_ema/, reports/, previous-<time>/
(--restart), logs/ (the launcher's) and the locks. No TensorFlow.
"""

from __future__ import annotations

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
PROFILE_DIR = "profile"  # train.profile_steps
PREVIOUS_PREFIX = "previous-"
LOCK_FILE = "trainer.lock"
LOGS_DIR = "logs"  # The launcher's worker logs.
SURVIVOR_LOCK_FILE = ".survivor.lock"  # Keeps apart the saves of a lost worker's survivors.
BEST_DIR = "best"
BEST_FILE = "best.json"
BEST_CHOICE = "best"  # --checkpoint=best
WEIGHTS = ("auto", "ema", "raw")  # --weights (`checkpoint.restore_model`)

_CHECKPOINT_INDEX = re.compile(rf"^{CHECKPOINT_PREFIX}-(\d+)\.index$")
# A name TensorFlow would take for a checkpoint prefix, or one of its files.
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}-\d+(\..*)?$")
# "ckpt-N" or "N", as --checkpoint takes them.
_CHECKPOINT_CHOICE = re.compile(rf"(?:{CHECKPOINT_PREFIX}-)?(\d+)")

T = TypeVar("T")


def open_file(path: str, flags: int, mode: int = 0o644) -> int:
    """`os.open` never through a symbolic link: a run directory from someone else must not
    make a resume write over another file (`trainer.lock` -> ~/.bashrc)."""
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
    """Why no file can be created in `directory`, or None: tried, as root ignores mode bits
    and a read-only mount or full quota answers only to a write."""
    probe = os.path.join(directory, f".write-test-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        os.unlink(probe)
    except OSError as error:
        return error.strerror or str(error)
    return None


def open_append(path: str):
    return os.fdopen(open_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a")


def _in_run(name: str) -> Callable[[str], str]:
    """The function `model_dir -> model_dir/name`."""
    return lambda model_dir: os.path.join(model_dir, name)


config_path = _in_run(CONFIG_FILE)
lock_path = _in_run(LOCK_FILE)
metrics_path = _in_run(METRICS_FILE)
data_info_path = _in_run(DATA_INFO_FILE)
temperature_path = _in_run(TEMPERATURE_FILE)
lr_override_path = _in_run(LR_OVERRIDE_FILE)
reports_dir = _in_run(REPORTS_DIR)
best_dir = _in_run(BEST_DIR)


def checkpoint_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}-{step}"


def checkpoint_step(file_name: str) -> int | None:
    """4 for `ckpt-4.index`, else None."""
    match = _CHECKPOINT_INDEX.match(file_name)
    return int(match.group(1)) if match else None


def is_checkpoint_name(name: str) -> bool:
    """Whether TensorFlow would take `name` for a checkpoint prefix or one of its files."""
    return bool(_CHECKPOINT_NAME.match(name))


def has_checkpoints(model_dir: str) -> bool:
    """Whether `model_dir` holds a checkpoint's index file (readable or not)."""
    try:
        names = os.listdir(model_dir)
    except OSError:
        return False
    return any(_CHECKPOINT_INDEX.match(name) for name in names)


def best_checkpoint_name(step: int) -> str:
    """`best-8`: unlike a rolling `ckpt-N`, so neither rotation nor a resume takes it."""
    return f"{BEST_DIR}-{step}"


def read_best(model_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(its directory, `best.json`) of the run's best checkpoint, or None if it has none."""
    remedy = "delete {directory} to start keeping the best anew"
    return read_kept(best_dir(model_dir), BEST_FILE, remedy)


def read_kept(final: str, record: str, remedy: str) -> tuple[str, dict[str, Any]] | None:
    """(its directory, its JSON `record`, with "step" and "checkpoint") of a checkpoint kept
    whole in `final` (best/, averaged/; `files.find_complete`), or None; a damaged record is
    ConfigError "PATH is damaged (...); REMEDY" (`remedy` may name the {directory})."""
    directory = files.find_complete(final, record)
    if directory is None:
        return None

    def checked(content: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(content["step"], int) or not isinstance(content["checkpoint"], str):
            raise TypeError("step or checkpoint of the wrong type")
        return content

    path = os.path.join(directory, record)
    return directory, read_json(path, checked, remedy.format(directory=directory))


def write_kept(
    final: str, record: str, name: str, step: int, content: dict[str, Any], save: Callable
) -> str:
    """Replaces the directory `final` whole (`files.replace_directory`) with the checkpoint
    `name` that `save(prefix)` writes and the JSON `record` (`content` plus "step" and
    "checkpoint"); returns its prefix. OSError leaves the old one."""

    def fill(staged: str) -> None:
        save(os.path.join(staged, name))
        text = json.dumps({**content, "step": step, "checkpoint": name}, indent=1)
        files.write_text_atomically(os.path.join(staged, record), text)

    files.replace_directory(final, *files.swap_directories(final), fill)
    return os.path.join(final, name)


def read_json(path: str, parse: Callable[[Any], T], remedy: str) -> T:
    """`parse(the JSON at path)`; ConfigError "PATH is damaged (...); REMEDY" when it cannot
    be read or `parse` raises KeyError, TypeError or ValueError."""
    try:
        with open(path) as f:
            return parse(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path} is damaged ({type(error).__name__}: {error}); {remedy}"
        ) from None


def chosen_step(which: str) -> int | None:
    """N for `--checkpoint=ckpt-N` or `N`, else None."""
    match = _CHECKPOINT_CHOICE.fullmatch(which)
    return int(match.group(1)) if match else None


def write_data_info(model_dir: str, info: dict[str, Any]) -> None:
    files.write_text_atomically(data_info_path(model_dir), json.dumps(info, indent=1))


def read_data_info(model_dir: str, parse: Callable[[dict[str, Any]], T]) -> T | None:
    """`parse(the JSON of data_info.json)`, or None without one; ConfigError when damaged
    (`parse` raises KeyError, TypeError or ValueError for a file it cannot use)."""
    path = data_info_path(model_dir)
    if not os.path.isfile(path):
        return None
    remedy = "delete it to take the classes and preprocessing from the dataset again"
    return read_json(path, parse, remedy)


def recorded_multi_label(model_dir: str) -> bool:
    """Whether data_info.json records multi-label data (older files: False)."""
    return bool(read_data_info(model_dir, lambda info: bool(info.get("multi_label"))))


def create(model_dir: str) -> None:
    """Makes the run directory and its parents if needed (ConfigError if it cannot)."""
    try:
        os.makedirs(model_dir, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"--model_dir={model_dir} cannot be created ({error.strerror}); pick a directory "
            "you can write to"
        ) from None


def move_aside(directory: str) -> str | None:
    """Moves a run directory's contents into `previous-<time>/` (--restart); returns it, or
    None. Refuses a directory that does not look like a run (a mistyped --model_dir)."""
    if not os.path.isdir(directory):
        return None
    # The lock (held by the trainer moving the run) and the launcher's logs stay.
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
