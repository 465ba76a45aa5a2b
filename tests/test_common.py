"""The shared plumbing of resnet_app/common: run directory names, one-line errors,
value checks, `cli.run`, and reading TF_CONFIG."""

import json
import os
import subprocess
import sys
import typing

import pytest

from resnet_app.common import checks, cli, distribute, run_dir, tf_config
from resnet_app.common.errors import ConfigError, first_line
from tests.commands import REPO, error_line, run_command


def test_first_line_of_an_error():
    assert first_line(ValueError("\n  bad value  \nmore detail\n")) == "bad value"
    assert first_line(ValueError("")) == "ValueError"
    assert first_line(KeyError("k"), with_type=True) == "KeyError: 'k'"
    assert first_line(AssertionError(), with_type=True) == "AssertionError"
    assert first_line(OSError("x" * 300)) == "x" * 200
    assert first_line(OSError("abcdef"), limit=3) == "abc"


def test_at_least_names_the_setting_and_the_bound():
    checks.at_least("--top_k", 1)
    checks.at_least("--top_k", None)  # Unset: a default applies.
    checks.at_least("crop_padding", 0, 0)
    with pytest.raises(ConfigError, match=r"^--top_k must be a whole number >= 1, got 0$"):
        checks.at_least("--top_k", 0)
    with pytest.raises(ConfigError, match=r"^crop_padding must be a whole number >= 0, got -1$"):
        checks.at_least("crop_padding", -1, 0)


def test_cli_run_never_returns():
    # absl's app.run exits: run() has no value to return.
    assert typing.get_type_hints(cli.run)["return"] is typing.NoReturn
    program = (
        "import sys\n"
        "from resnet_app.common import cli\n"
        "from resnet_app.common.errors import ConfigError\n"
        "def main(argv):\n"
        "    if argv[1:] == ['bad']:\n"
        "        raise ConfigError('a bad thing; do the fix')\n"
        "cli.run(main)\n"
        "print('returned')\n"
    )

    def run(*args):
        return subprocess.run(
            [sys.executable, "-c", program, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": REPO},
        )

    fine = run()
    assert (fine.returncode, fine.stdout) == (0, ""), fine.stderr
    bad = run("bad")
    assert error_line(bad) == "error: a bad thing; do the fix"
    assert bad.stdout == ""


def test_run_dir_names_its_files(tmp_path):
    model_dir = str(tmp_path)
    assert run_dir.config_path(model_dir) == os.path.join(model_dir, "config.yaml")
    assert run_dir.metrics_path(model_dir) == os.path.join(model_dir, "metrics.jsonl")
    assert run_dir.data_info_path(model_dir) == os.path.join(model_dir, "data_info.json")
    assert run_dir.lr_override_path(model_dir) == os.path.join(model_dir, "lr_override")
    assert run_dir.reports_dir(model_dir) == os.path.join(model_dir, "reports")
    assert run_dir.checkpoint_name(12) == "ckpt-12"
    assert run_dir.checkpoint_step("ckpt-12.index") == 12
    assert run_dir.checkpoint_step("ckpt-12.data-00000-of-00001") is None
    assert run_dir.checkpoint_step("ckpt-x.index") is None
    assert run_dir.is_checkpoint_name("ckpt-3") and run_dir.is_checkpoint_name("ckpt-3.index")
    assert not run_dir.is_checkpoint_name("export") and not run_dir.is_checkpoint_name("ckpt")
    choices = ("ckpt-4", "4", "latest", "ckpt-")
    assert [run_dir.chosen_step(which) for which in choices] == [4, 4, None, None]


def test_the_other_modules_take_the_names_from_run_dir():
    from resnet_app import config
    from resnet_app.common import checkpoint, metrics
    from resnet_app.engine import learning_rate

    assert config.CONFIG_FILE == run_dir.CONFIG_FILE
    assert metrics.METRICS_FILE == run_dir.METRICS_FILE
    assert learning_rate.OVERRIDE_FILE == run_dir.LR_OVERRIDE_FILE
    assert checkpoint.PREFIX == run_dir.CHECKPOINT_PREFIX


def test_data_info_round_trip_and_damage(tmp_path):
    assert run_dir.read_data_info(str(tmp_path), dict) is None
    run_dir.write_data_info(str(tmp_path), {"class_names": ["a", "b"]})
    assert json.loads((tmp_path / "data_info.json").read_text()) == {"class_names": ["a", "b"]}
    assert run_dir.read_data_info(str(tmp_path), lambda info: info["class_names"]) == ["a", "b"]
    with pytest.raises(ConfigError, match=r"data_info.json is damaged \(KeyError: 'nope'\)"):
        run_dir.read_data_info(str(tmp_path), lambda info: info["nope"])
    (tmp_path / "data_info.json").write_text('{"class_names": [')
    with pytest.raises(ConfigError, match="is damaged .JSONDecodeError"):
        run_dir.read_data_info(str(tmp_path), dict)


def test_move_aside_keeps_earlier_runs_and_refuses_other_folders(tmp_path):
    assert run_dir.move_aside(str(tmp_path / "missing")) is None
    assert run_dir.move_aside(str(tmp_path)) is None  # Empty: nothing to move.
    (tmp_path / "ckpt-4.index").write_text("")
    (tmp_path / "train").mkdir()
    first = run_dir.move_aside(str(tmp_path))
    assert os.path.basename(first).startswith("previous-")
    assert sorted(os.listdir(first)) == ["ckpt-4.index", "train"]
    (tmp_path / "metrics.jsonl").write_text("")
    second = run_dir.move_aside(str(tmp_path))
    assert second != first and os.path.isdir(first)
    assert os.listdir(second) == ["metrics.jsonl"]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in (first, second))
    (tmp_path / "setup.py").write_text("")
    with pytest.raises(ConfigError, match="is not a run directory"):
        run_dir.move_aside(str(tmp_path))


TWO_WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


@pytest.mark.parametrize(
    "text, message",
    [
        ("{nope", "TF_CONFIG is not valid JSON"),
        ("[1]", "TF_CONFIG is JSON but not an object ([1]); set it like {"),
        ('"x"', 'TF_CONFIG is JSON but not an object ("x"); set it like {'),
        ('{"cluster": [1]}', 'TF_CONFIG\'s "cluster" is not an object of address lists'),
        ('{"cluster": {"worker": "a:1"}}', '"cluster" is not an object of address lists'),
    ],
)
def test_tf_config_that_is_not_a_cluster_is_one_clear_error(monkeypatch, text, message):
    monkeypatch.setenv("TF_CONFIG", text)
    with pytest.raises(ConfigError) as raised:
        tf_config.read()
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_tf_config_is_read(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert tf_config.read() is None
    monkeypatch.setenv("TF_CONFIG", json.dumps(worker_config(1)))
    assert tf_config.read() == worker_config(1)


def test_tf_config_json_but_not_an_object_from_the_command_line(tmp_path):
    result = run_command(
        "resnet_app.train",
        f"--model_dir={tmp_path / 'run'}",
        "--model=tiny",
        env={"TF_CONFIG": "[1]"},
    )
    line = error_line(result)
    assert line.startswith("error: TF_CONFIG is JSON but not an object ([1])"), line


def test_a_run_directory_that_cannot_be_made_is_one_line(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot be created .*; pick a directory"):
        run_dir.create(str(blocked / "run"))
    result = run_command(
        "resnet_app.train", f"--model_dir={blocked / 'run'}", "--model=tiny", "--train_steps=1"
    )
    assert "cannot be created" in error_line(result)
    assert blocked.read_text() == "not a directory"  # Nothing there is touched.


def worker_config(index=0):
    return {"cluster": TWO_WORKERS, "task": {"type": "worker", "index": index}}


def test_a_worker_uses_the_first_num_towers_gpus(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(worker_config(1)))
    # TFConfigClusterResolver: MultiWorkerMirroredStrategy would take every GPU.
    resolver = distribute.worker_resolver(worker_config(1), None, num_gpus=8)
    assert type(resolver).__name__ == "TFConfigClusterResolver"
    # Any other resolver: its num_accelerators() is the number of GPUs it takes.
    resolver = distribute.worker_resolver(worker_config(1), 4, num_gpus=8)
    assert resolver.num_accelerators() == {"GPU": 4}
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("worker", 1, "grpc")
    assert resolver.cluster_spec().as_dict() == TWO_WORKERS
    # The one CPU: MultiWorkerMirroredStrategy's default.
    resolver = distribute.worker_resolver(worker_config(1), 1, num_gpus=0)
    assert type(resolver).__name__ == "TFConfigClusterResolver"


@pytest.mark.parametrize(
    "num_towers, num_gpus, message",
    [
        (2, 0, "--num_towers=2 with TF_CONFIG: a CPU-only worker runs one replica"),
        (9, 8, "--num_towers=9 but this machine has 8 GPU(s); use at most 8"),
        (0, 8, "--num_towers must be a whole number >= 1, got 0"),
    ],
)
def test_a_worker_refuses_towers_it_cannot_run(monkeypatch, num_towers, num_gpus, message):
    monkeypatch.setenv("TF_CONFIG", json.dumps(worker_config()))
    with pytest.raises(ConfigError) as raised:
        distribute.worker_resolver(worker_config(), num_towers, num_gpus)
    assert message in str(raised.value)


def test_a_worker_without_a_task_is_one_clear_error():
    with pytest.raises(ConfigError, match='names 2 workers but not this one\'s "task"'):
        distribute.worker_resolver({"cluster": TWO_WORKERS}, None, 0)
