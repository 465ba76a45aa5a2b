"""A bad file given to a command that reads weights, checkpoints, exports or images
is answered as a user sees it: exit 2 (1 for predict's images, which it
skips), one `error:` line, at most 8 non-blank lines
in all (library warnings folded in, TensorFlow's start-up included), no traceback.

Every command runs as a process; one case per command starts a fresh
interpreter, so that what TensorFlow prints while it loads is counted too.
"""

import os
import pathlib
import shutil

import h5py
import keras
import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import save_file

from tests.commands import run_command

MAX_LINES = 8
TRAIN = ("resnet_app.train", "--dataset=synthetic", "--model=resnet50", "--train_steps=1")


@pytest.fixture(scope="module")
def bad(tmp_path_factory, tiny_run, tiny_export):
    """{name: path} of the bad files and directories, and the good run and export."""
    root = tmp_path_factory.mktemp("bad")
    paths = {}

    def path(name):
        paths[name] = str(root / name)
        return paths[name]

    # Another network's file in each weights format.
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]).save_weights(
        path("other.weights.h5")
    )
    with h5py.File(path("other.h5"), "w") as file:
        file.attrs["layer_names"] = [b"dense"]
        file.create_group("dense").attrs["weight_names"] = [b"dense/kernel:0"]
        file["dense"]["dense/kernel:0"] = np.zeros((4, 3), "float32")
    save_file({"head.weight": np.zeros((3, 4), "float32")}, path("other.safetensors"))
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path("image.png"))
    # Truncated, empty, a directory in place of a file, and the wrong format for the suffix.
    for name in ("other.weights.h5", "other.safetensors", "image.png"):
        data = pathlib.Path(paths[name]).read_bytes()
        pathlib.Path(path(f"truncated.{name}")).write_bytes(data[: len(data) // 2])
    for suffix in ("h5", "safetensors", "png"):
        open(path(f"empty.{suffix}"), "wb").close()
        os.makedirs(path(f"folder.{suffix}"))
    shutil.copy(paths["image.png"], path("png.h5"))
    shutil.copy(paths["other.weights.h5"], path("h5.safetensors"))
    with open(path("text.png"), "w") as file:
        file.write("not an image\n")
    # A run whose checkpoint is truncated, emptied, or a directory.
    _, model_dir = tiny_run
    for kind in ("truncated", "empty", "folder"):
        run = path(f"{kind}_run")
        shutil.copytree(model_dir, run, ignore=shutil.ignore_patterns("*.lock"))
        for file in pathlib.Path(run).glob("ckpt-*"):
            if kind == "folder" and file.suffix == ".index":
                file.unlink()
                file.mkdir()
            elif kind != "folder" and ".data-" in file.name:
                data = file.read_bytes()
                file.write_bytes(data[: len(data) // 2] if kind == "truncated" else b"")
    paths.update(run=str(model_dir), export=str(tiny_export), root=str(root))
    return paths


WEIGHTS = [
    "other.weights.h5",
    "other.h5",
    "other.safetensors",
    "run",
    "truncated.other.weights.h5",
    "truncated.other.safetensors",
    "empty.h5",
    "empty.safetensors",
    "folder.h5",
    "folder.safetensors",
    "png.h5",
    "h5.safetensors",
]
IMAGES = ["text.png", "truncated.image.png", "empty.png", "folder.png"]
RUNS = ["truncated_run", "empty_run", "folder_run"]

CASES = (
    [("train", name) for name in WEIGHTS]
    + [(command, run) for command in ("train", "evaluate", "export", "predict") for run in RUNS]
    + [("predict export", name) for name in [*IMAGES, "other.weights.h5", "root"]]
    + [("predict run", name) for name in IMAGES]
)
# In the default suite: each command, and each kind of bad file once; the slow tier
# runs the rest (tests/slow_tier.py).
DEFAULT = [
    ("train", "other.weights.h5"),
    ("train", "run"),
    ("train", "truncated.other.safetensors"),
    ("train", "empty.h5"),
    ("train", "folder.h5"),
    ("train", "png.h5"),
    ("evaluate", "truncated_run"),
    ("export", "empty_run"),
    ("predict", "folder_run"),
    ("predict export", "text.png"),
    ("predict run", "truncated.image.png"),
]
# One fresh interpreter per command: its start-up lines count.
FRESH = {
    ("train", "other.weights.h5"),
    ("evaluate", "truncated_run"),
    ("export", "empty_run"),
    ("predict export", "text.png"),
}


def _command(command: str, name: str, bad: dict, tmp_path) -> tuple:
    path = bad[name]
    if command == "train":
        return (*TRAIN, f"--model_dir={tmp_path / 'run'}", f"--init_from={path}")
    if command == "evaluate":
        return ("resnet_app.evaluate", f"--model_dir={path}")
    if command == "export":
        return ("resnet_app.export", f"--model_dir={path}", f"--export_dir={tmp_path / 'out'}")
    if command == "predict" and name in RUNS:
        return ("resnet_app.predict", f"--model_dir={path}", bad["image.png"])
    if command == "predict export" and name in IMAGES:
        return ("resnet_app.predict", f"--export_dir={bad['export']}", path)
    if command == "predict export":
        return ("resnet_app.predict", f"--export_dir={path}", bad["image.png"])
    return ("resnet_app.predict", f"--model_dir={bad['run']}", path)


@pytest.mark.parametrize(("command", "name"), DEFAULT)
def test_a_bad_file_is_one_line(command, name, bad, tmp_path):
    _check(command, name, bad, tmp_path)


@pytest.mark.parametrize(("command", "name"), [case for case in CASES if case not in DEFAULT])
def test_every_other_bad_file_is_one_line(command, name, bad, tmp_path):
    _check(command, name, bad, tmp_path)


def _check(command, name, bad, tmp_path):
    module, *args = _command(command, name, bad, tmp_path)
    result = run_command(module, *args, fresh=(command, name) in FRESH)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    # predict classifies the other images and exits 1 for those it skips (predict.py).
    assert result.returncode == (1 if name in IMAGES else 2), result.stderr
    assert len(errors) == 1 and bad[name] in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    output = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(output) <= MAX_LINES, "\n".join(output)
