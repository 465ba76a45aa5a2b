"""Schedule scripts run only when asked (`config/script_permission.py`, `command_line.py`).

The command line is parsed in this process, as the trainer parses it; the
script under test writes a marker file when it is imported, so each test sees
whether it ran.
"""

from __future__ import annotations

import json
import re

import pytest
from absl import flags
from absl import logging as absl_logging
from absl.testing import flagsaver

from resnet_app.common import run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.config import script_permission
from resnet_app.engine import command_line


@pytest.fixture
def script(tmp_path, monkeypatch):
    """A schedule script that leaves `ran` behind when imported; this user's key in tmp_path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config_home"))
    path = tmp_path / "schedule.py"
    path.write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').close()\n"
        "def lr(step, steps_per_epoch):\n    return 0.1\n"
    )
    return path


def ran(tmp_path) -> bool:
    found = (tmp_path / "ran").exists()
    (tmp_path / "ran").unlink(missing_ok=True)
    return found


def config_from(*args):
    """`command_line.config_from_flags()` for the command line `resnet-app train ARGS`.

    Parsing sets absl's verbosity (its --verbosity default): put back after,
    so that later tests in this process see the log lines they expect.
    """
    verbosity = absl_logging.get_verbosity()
    try:
        with flagsaver.flagsaver():
            flags.FLAGS.unparse_flags()
            flags.FLAGS(["train", *args])
            return command_line.config_from_flags()
    finally:
        absl_logging.set_verbosity(verbosity)


def recipe(tmp_path, script) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"schedule:\n  name: script\n  path: {script}:lr\n")
    return str(path)


def run_directory(tmp_path, script, recorded=True):
    """A run directory whose config.yaml names the script, as a trainer leaves it."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / run_dir.CONFIG_FILE).write_text(
        f"schedule:\n  name: script\n  path: {script}:lr\n"
    )
    if recorded:
        script_permission.record(str(model_dir), f"{script}:lr")
    return model_dir


def refusal(*args) -> str:
    with pytest.raises(ConfigError) as raised:
        config_from(*args)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_recipe_that_names_a_script_does_not_run_it(tmp_path, script):
    message = refusal(f"--config={recipe(tmp_path, script)}")
    assert f"schedule script {script}:lr, which would run as Python" in message
    assert "--allow_scripts" in message and f"--lr_schedule={script}:lr" in message
    assert not ran(tmp_path)


@pytest.mark.parametrize(
    "asked",
    [
        lambda tmp_path, script: [f"--config={recipe(tmp_path, script)}", "--allow_scripts"],
        lambda tmp_path, script: [f"--lr_schedule={script}:lr"],
        lambda tmp_path, script: ["--set=schedule.name=script", f"--set=schedule.path={script}:lr"],
    ],
    ids=["allow_scripts", "lr_schedule", "set"],
)
def test_a_script_the_command_line_names_or_allows_runs(tmp_path, script, asked):
    resolved = config_from(*asked(tmp_path, script))
    assert resolved.schedule.path == f"{script}:lr"
    assert ran(tmp_path)


def test_a_resume_runs_the_script_the_run_recorded_while_it_is_unchanged(tmp_path, script):
    model_dir = run_directory(tmp_path, script)
    config_from(f"--model_dir={model_dir}")
    assert ran(tmp_path)
    script.write_text(script.read_text() + "# changed\n")
    message = refusal(f"--model_dir={model_dir}")
    assert "its content changed since the run recorded it" in message
    assert not ran(tmp_path)
    config_from(f"--model_dir={model_dir}", "--allow_scripts")
    assert ran(tmp_path)


def test_a_run_directory_from_someone_else_does_not_run_its_script(tmp_path, script, monkeypatch):
    model_dir = run_directory(tmp_path, script)  # Recorded with the sender's key...
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "receiver"))  # ...received here.
    assert "not made by this user" in refusal(f"--model_dir={model_dir}")
    assert not ran(tmp_path)


def test_a_forged_or_missing_record_does_not_run_the_script(tmp_path, script):
    model_dir = run_directory(tmp_path, script)
    record = model_dir / run_dir.SCHEDULE_SCRIPT_FILE
    content = json.loads(record.read_text())
    # The sender's own script, its hash, and a tag made up: refused.
    script.write_text(script.read_text() + "print('theirs')\n")
    content["sha256"] = script_permission.digest(f"{script}:lr")
    record.write_text(json.dumps(content))
    assert "not made by this user" in refusal(f"--model_dir={model_dir}")
    record.write_text("not json")
    assert "is not a record written here" in refusal(f"--model_dir={model_dir}")
    record.unlink()
    assert re.search("has no record of it", refusal(f"--model_dir={model_dir}"))
    assert not ran(tmp_path)


def test_the_key_is_private_to_the_user(tmp_path, script):
    run_directory(tmp_path, script)
    key = tmp_path / "config_home" / "resnet_app" / "script_key"
    assert key.stat().st_mode & 0o077 == 0
    assert len(key.read_bytes()) == script_permission.KEY_BYTES
