"""Schedule scripts run only when the user asked: a file that a config names is not enough.

A script runs when the command line names it (`--lr_schedule=PATH.py:FUNCTION`)
or says `--allow_scripts`, or on a resume whose `schedule_script.json` records,
under an HMAC key only this user holds (`$XDG_CONFIG_HOME/resnet_app/script_key`),
that this user allowed this very content. No TensorFlow.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets

from absl import logging

from resnet_app.common import files, run_dir
from resnet_app.common.errors import ConfigError

RECORD_FILE = run_dir.SCHEDULE_SCRIPT_FILE
KEY_BYTES = 32


def key_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "resnet_app", "script_key")


def _key(create: bool) -> bytes | None:
    """This user's key, created when `create`; None when there is none (or no home)."""
    path = key_path()
    try:
        with open(path, "rb") as f:
            key = f.read()
        if len(key) == KEY_BYTES:
            return key
    except OSError:
        pass
    if not create:
        return None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        key = secrets.token_bytes(KEY_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        return key
    except FileExistsError:
        return _key(create=False)  # Another process made it first.
    except OSError as error:
        logging.warning(
            "Cannot keep a key in %s (%s): a resume of this run will need --allow_scripts",
            path,
            error.strerror,
        )
        return None


def digest(spec: str) -> str:
    """The SHA-256 of the bytes of the script `spec` (PATH.py:FUNCTION) names."""
    with open(spec.rpartition(":")[0], "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _tag(key: bytes, spec: str, sha256: str) -> str:
    message = json.dumps({"path": spec, "sha256": sha256}, sort_keys=True).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def record(model_dir: str, spec: str) -> None:
    """Records in the run directory that this user allowed the script `spec` as it is now."""
    key = _key(create=True)
    if key is None:
        return
    sha256 = digest(spec)
    content = {"path": spec, "sha256": sha256, "tag": _tag(key, spec, sha256)}
    files.write_text_atomically(os.path.join(model_dir, RECORD_FILE), json.dumps(content) + "\n")


def _recorded(model_dir: str | None, spec: str) -> str:
    """Why the run directory's record does not allow `spec` now, or "" when it does."""
    if not model_dir:
        return "no run directory records it"
    try:
        with open(os.path.join(model_dir, RECORD_FILE), "rb") as f:
            content = json.loads(f.read())
        recorded_path, recorded_sha, tag = content["path"], content["sha256"], content["tag"]
    except FileNotFoundError:
        return f"{model_dir} has no record of it"
    except (OSError, ValueError, KeyError, TypeError):  # Unreadable, not JSON, not ours.
        return f"{os.path.join(model_dir, RECORD_FILE)} is not a record written here"
    key = _key(create=False)
    if key is None or not hmac.compare_digest(str(tag), _tag(key, recorded_path, recorded_sha)):
        return f"the run's record of it was not made by this user ({key_path()})"
    if recorded_path != spec:
        return f"the run recorded another script, {recorded_path}"
    try:
        now = digest(spec)
    except OSError:
        return "it cannot be read"
    if not hmac.compare_digest(now, recorded_sha):
        return f"its content changed since the run recorded it (sha256 {recorded_sha[:12]}...)"
    return ""


def check_allowed(
    spec: str, on_command_line: bool, allow_scripts: bool, model_dir: str | None
) -> None:
    """Raises a ConfigError (what would run, why not, how to allow it) unless the user
    asked for the schedule script `spec` to run."""
    if on_command_line or allow_scripts:
        return
    why = _recorded(model_dir, spec)
    if why:
        raise ConfigError(
            f"the config names the schedule script {spec}, which would run as Python, and "
            f"{why}; read it, then pass --allow_scripts (or --lr_schedule={spec}) to run it"
        )
    logging.info("Running the schedule script %s: its content is the one this run recorded", spec)
