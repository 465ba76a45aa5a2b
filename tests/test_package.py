"""The package as `pip install .` leaves it: the `resnet-app` command, from another directory.

The package is installed (without its dependencies, which this environment
has) into a folder of its own, and run from a folder that is not the
repository, so that nothing is found through the repository's checkout.
"""

import os
import shutil
import subprocess
import sys

import pytest

from resnet_app import commands
from resnet_app.config import recipes
from tests.commands import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the install folder, a working folder elsewhere)."""
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(
        os.path.join(REPO, "resnet_app"),
        source / "resnet_app",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), source / name)
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=source,
    )
    return target, tmp_path_factory.mktemp("elsewhere")


def _run(installed, *args):
    target, elsewhere = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(target), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, os.path.join(target, "bin", "resnet-app"), *args],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _files(root):
    return {
        os.path.relpath(os.path.join(folder, name), root)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith((".py", ".yaml")) and "__pycache__" not in folder
    }


def test_the_install_holds_every_module_and_recipe(installed):
    target, _ = installed
    assert _files(os.path.join(target, "resnet_app")) == _files(os.path.join(REPO, "resnet_app"))
    assert os.path.isfile(os.path.join(target, "resnet_app", "recipes", "shapes_quickstart.yaml"))


def test_the_command_lists_its_subcommands(installed):
    result = _run(installed)
    assert result.returncode == 2
    for name in (
        "train",
        "evaluate",
        "export",
        "predict",
        "model",
        "launch",
        "lr-find",
        "schedule",
        "plot",
        "show-batch",
        "average",
        "sweep",
    ):
        assert f"  {name} " in result.stdout
    assert set(commands.COMMANDS) >= {"train", "plot", "show-batch"}


def test_train_help_from_another_directory(installed):
    result = _run(installed, "train", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("`python -m resnet_app.train`: train and evaluate")
    assert "--config" in result.stdout and "resnet-app train:" in result.stdout


def test_model_from_another_directory_runs_the_installed_code(installed):
    target, _ = installed
    result = _run(installed, "model", "--model=resnet50")
    assert result.returncode == 0, result.stderr
    # torchvision's ResNet-50: 25,557,032 parameters.
    assert "(trainable 25,557,032," in result.stdout
    where = subprocess.run(
        [sys.executable, "-c", "import resnet_app; print(resnet_app.__file__)"],
        cwd=installed[1],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(target)},
    )
    assert where.stdout.startswith(str(target)), where.stdout


def test_a_packaged_recipe_by_name_from_another_directory(installed):
    result = _run(installed, "schedule", "--config=cifar10_resnet56")
    assert result.returncode == 0, result.stderr
    # He et al.'s CIFAR schedule: 0.1, divided by 10 twice.
    assert "peak 0.1 at step 0; last 0.001" in result.stdout


def test_an_unknown_recipe_or_command_is_one_line(installed):
    result = _run(installed, "train", "--config=cifar10_resnet57")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert "cifar10_resnet57 not found" in line and "cifar10_resnet56" in line
    assert sorted(recipes.names())[0] in line
    result = _run(installed, "tarin")
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown command 'tarin'; the commands are train")
