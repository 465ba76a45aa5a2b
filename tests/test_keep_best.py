"""`train.keep_best`: the checkpoint of the best evaluation so far, in `MODEL_DIR/best/`.

What is best is worked out here from `metrics.jsonl` (the evaluator's
records, written by code that knows nothing of keeping the best), and the
weights are compared with copies an action took at every evaluation.
"""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from resnet_app import config as config_lib
from resnet_app.common import checkpoint
from resnet_app.common.errors import ConfigError
from resnet_app.engine import loop, setup
from resnet_app.engine.actions import Action
from resnet_app.export import classify
from tests import runs
from tests.commands import error_line, run_command
from tests.runs import read_records

# Evaluations at every step: the tiny run's top-1 rises, then falls (and its
# loss has its minimum at another step), so the best is neither the first nor
# the last evaluation; each test checks that this holds before relying on it.
EVERY_STEP = ["train.eval_every=1", "train.log_every=1"]


class Snapshots(Action):
    """Every evaluated step's model weights, copied as NumPy arrays."""

    def __init__(self, model):
        self.model = model
        self.weights = {}

    def __call__(self, boundary):
        if boundary.evaluation is not None:
            self.weights[boundary.step] = [w.numpy().copy() for w in self.model.weights]


class NegateLogits(Action):
    """On a resume, negates the classifier, so that the resumed run evaluates badly."""

    def __init__(self, model):
        self.model = model

    def enter(self, step, restored):
        if restored:
            for variable in (self.model.logits.kernel, self.model.logits.bias):
                variable.assign(-variable)


def evaluations(model_dir):
    """{step: record} of the evaluator's records in metrics.jsonl (not evaluate's)."""
    records = read_records(model_dir)
    return {r["step"]: r for r in records if "top1" in r and r.get("event") != "evaluation"}


def best_step(records, metric, best=max):
    """The first step whose `metric` is the best (a later equal value does not replace it)."""
    value = best(r[metric] for r in records.values())
    return min(step for step, r in records.items() if r[metric] == value), value


def read_best_json(model_dir):
    with open(os.path.join(model_dir, "best", "best.json")) as f:
        return json.load(f)


def train(config, model_dir, *make_actions):
    """Trains with extra actions made from the run's model; returns them."""
    run = setup.build_run(config, str(model_dir))
    actions = [make(run.model) for make in make_actions]
    loop.train(run, actions)
    return run, actions


@pytest.fixture(scope="module")
def best_run(tmp_path_factory):
    """8 steps evaluated at each, keeping 1 rolling checkpoint and the best top-1.

    Returns:
      (config, model_dir, the run's model, {step: weights at its evaluation})
    """
    root = tmp_path_factory.mktemp("keep_best")
    sets = [*EVERY_STEP, "train.keep_best=true", "train.keep_checkpoints=1"]
    config = runs.small_config(root, *sets, train_steps=8)
    model_dir = root / "run"
    run, [snapshots] = train(config, model_dir, Snapshots)
    return config, model_dir, run.model, snapshots.weights


def test_best_holds_the_weights_of_the_best_evaluation_and_rotation_leaves_it(best_run):
    config, model_dir, model, weights = best_run
    records = evaluations(model_dir)
    assert sorted(records) == sorted(weights) == list(range(1, 9))
    step, value = best_step(records, "top1")
    assert 1 < step < 8, "the test needs a best that is neither the first nor the last"
    assert best_step(records, "loss", min)[0] != step

    saved = read_best_json(model_dir)
    assert saved["metric"] == "top1" and saved["mode"] == "max"
    assert saved["step"] == step and saved["value"] == value
    assert saved["checkpoint"] == f"best-{step}"
    assert saved["evaluation"] == records[step]
    prefix = str(model_dir / "best" / f"best-{step}")
    assert checkpoint.select(str(model_dir), "best") == [(step, prefix)]

    # Rotation kept one rolling checkpoint; best/ is none of them, and no
    # resume would start from it.
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [8]
    assert checkpoint.find_latest(str(model_dir))[0] == 8
    assert checkpoint.find_latest(str(model_dir / "best")) is None
    assert sorted(os.listdir(model_dir / "best")) == [
        f"best-{step}.data-00000-of-00001",
        f"best-{step}.index",
        "best.json",
    ]

    # The model now holds step 8's weights; restored from best, step `step`'s, bitwise.
    assert any(not np.array_equal(a, b) for a, b in zip(weights[8], weights[step]))
    checkpoint.restore_model(model, prefix)
    for restored, expected in zip(model.weights, weights[step], strict=True):
        np.testing.assert_array_equal(restored.numpy(), expected)


def test_evaluate_export_and_predict_take_checkpoint_best(best_run, tmp_path):
    _, model_dir, _, _ = best_run
    step, value = best_step(evaluations(model_dir), "top1")
    result = run_command("resnet_app.evaluate", f"--model_dir={model_dir}", "--checkpoint=best")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["checkpoint"] == f"best-{step}" and record["step"] == step
    # Evaluated again from best/, the numbers of that step's evaluation in training.
    assert record["top1"] == value
    expected = evaluations(model_dir)[step]
    assert record["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert record["top5"] == expected["top5"]
    assert record["report"] == str(model_dir / "reports" / f"best-{step}-test")
    assert os.path.isfile(os.path.join(record["report"], "eval_results.json"))

    export_dir = tmp_path / "export"
    result = run_command(
        "resnet_app.export",
        f"--model_dir={model_dir}",
        f"--export_dir={export_dir}",
        "--checkpoint=best",
    )
    assert result.returncode == 0, result.stderr
    with open(export_dir / "assets.extra" / "export_info.json") as f:
        info = json.load(f)
    assert info["checkpoint"] == f"best-{step}" and info["step"] == step

    # predict --model_dir --checkpoint=best: other weights than the latest's.
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), np.uint8)
    images = tf.constant([tf.io.encode_png(image).numpy()])
    logits = {
        which: classify.load_classifier(None, str(model_dir), which)(images)["logits"].numpy()
        for which in ("best", "latest")
    }
    assert not np.allclose(logits["best"], logits["latest"])


def test_a_run_without_keep_best_has_no_best_checkpoint(tiny_run):
    _, model_dir = tiny_run
    message = "has no best checkpoint (best/best.json): train with --set train.keep_best=true"
    with pytest.raises(ConfigError, match=re.escape(message)):
        checkpoint.select(str(model_dir), "best")
    result = run_command("resnet_app.evaluate", f"--model_dir={model_dir}", "--checkpoint=best")
    assert message in error_line(result)


def test_a_resumed_run_replaces_the_best_only_when_beaten(tmp_path):
    """4 steps, then resumed to 8 with the classifier negated: the best stays the first run's.

    A resumed run that forgot the best so far would take its first evaluation.
    """
    sets = [*EVERY_STEP, "train.keep_best=true"]
    model_dir = tmp_path / "run"
    loop.train_and_evaluate(runs.small_config(tmp_path, *sets, train_steps=4), str(model_dir))
    first = read_best_json(model_dir)
    train(runs.small_config(tmp_path, *sets, train_steps=8), model_dir, NegateLogits)

    records = evaluations(model_dir)
    assert sorted(records) == list(range(1, 9))
    starts = [r["step"] for r in read_records(model_dir) if r.get("event") == "start"]
    assert starts == [0, 4]  # Resumed from ckpt-4, not from best/.
    step, value = best_step(records, "top1")
    assert step <= 4, "the test needs the first run to hold the best"
    assert read_best_json(model_dir) == first
    assert (first["step"], first["value"]) == (step, value)

    # A best.json of another metric does not count: a resume that keeps the best
    # loss replaces it at its first evaluation.
    more = [*sets, "train.best_metric=loss"]
    loop.train_and_evaluate(runs.small_config(tmp_path, *more, train_steps=9), str(model_dir))
    saved = read_best_json(model_dir)
    assert (saved["metric"], saved["mode"], saved["step"]) == ("loss", "min", 9)
    assert saved["value"] == evaluations(model_dir)[9]["loss"]


def test_best_loss_is_the_lowest_loss(tmp_path):
    model_dir = tmp_path / "run"
    config = runs.small_config(
        tmp_path, *EVERY_STEP, "train.keep_best=true", "train.best_metric=loss", train_steps=8
    )
    assert config.train.best_direction == "min"
    loop.train_and_evaluate(config, str(model_dir))
    records = evaluations(model_dir)
    step, value = best_step(records, "loss", min)
    assert step not in (best_step(records, "top1")[0], 8), "loss and top-1 must differ here"
    saved = read_best_json(model_dir)
    assert (saved["metric"], saved["mode"], saved["step"], saved["value"]) == (
        "loss",
        "min",
        step,
        value,
    )
    [(chosen, _)] = checkpoint.select(str(model_dir), "best")
    assert chosen == step


def test_best_settings_are_checked_and_resumable():
    config = config_lib.resolve(sets=["train.best_metric=top5"])
    assert config.train.best_direction == "max" and not config.train.keep_best
    config = config_lib.resolve(sets=["train.best_metric=loss", "train.best_mode=max"])
    assert config.train.best_direction == "max"
    wrong_metric = r"^train.best_metric must be one of: top1, .*, got 'top2'"
    with pytest.raises(ConfigError, match=wrong_metric):
        config_lib.resolve(sets=["train.best_metric=top2"])
    with pytest.raises(ConfigError, match=r"^train\.best_mode must be one of: max, min, got 'hi"):
        config_lib.resolve(sets=["train.best_mode=high"])
    from resnet_app.config.differences import RESUMABLE_CHANGES

    assert {"train.keep_best", "train.best_metric", "train.best_mode"} <= RESUMABLE_CHANGES


# --- Atomicity: a crash while replacing best/ leaves a complete best. ---

# Keeps ckpt-STEP as the best, killed (os._exit: no cleanup runs) at WHERE:
# "copy" halfway through copying the data file, "swap" between the two
# renames (the old best set aside, the new one not yet in place).
CRASH_SCRIPT = """
import os, shutil, sys
from resnet_app.common import checkpoint, run_dir

model_dir, step, where = sys.argv[1], int(sys.argv[2]), sys.argv[3]
best = os.path.abspath(run_dir.best_dir(model_dir))
replace, copyfile = os.replace, shutil.copyfile

def crashing_replace(source, destination):
    if where == "swap" and os.path.abspath(destination) == best:
        os._exit(3)
    replace(source, destination)

def crashing_copyfile(source, destination):
    if where == "copy" and ".data-" in source:
        with open(source, "rb") as f, open(destination, "wb") as out:
            out.write(f.read()[:100])
        os._exit(3)
    return copyfile(source, destination)

os.replace, shutil.copyfile = crashing_replace, crashing_copyfile
checkpoint.keep_best(model_dir, step, {"metric": "top1", "mode": "max", "value": 1.0})
"""


@pytest.fixture
def two_checkpoints(tmp_path):
    """A run with ckpt-1 and ckpt-2, and ckpt-1 kept as its best (by hand, not by training)."""
    model_dir = tmp_path / "run"
    config = runs.small_config(tmp_path, *EVERY_STEP, train_steps=2)
    loop.train_and_evaluate(config, str(model_dir))
    checkpoint.keep_best(str(model_dir), 1, {"metric": "top1", "mode": "max", "value": 0.5})
    tensors = runs.saved_tensors(model_dir / "ckpt-1")
    assert any(
        not np.array_equal(value, runs.saved_tensors(model_dir / "ckpt-2")[name])
        for name, value in tensors.items()
    )
    return model_dir, tensors


def assert_best_is_step_1(model_dir, tensors):
    [(step, prefix)] = checkpoint.select(str(model_dir), "best")
    assert step == 1
    saved = runs.saved_tensors(prefix)
    assert saved.keys() == tensors.keys()
    for name, value in tensors.items():
        np.testing.assert_array_equal(saved[name], value)


def leftovers(model_dir):
    return sorted(n for n in os.listdir(model_dir) if n.startswith("best."))


@pytest.mark.parametrize("where", ["copy", "swap"])
def test_a_crash_while_replacing_the_best_leaves_the_old_one_readable(two_checkpoints, where):
    model_dir, tensors = two_checkpoints
    script = model_dir.parent / "crash.py"
    script.write_text(CRASH_SCRIPT)
    result = run_command(str(script), str(model_dir), "2", where)
    assert result.returncode == 3, result.stderr
    pid_dirs = leftovers(model_dir)
    if where == "copy":  # An unfinished copy; best/ as it was.
        assert [n.split("-")[0] for n in pid_dirs] == ["best.partial"]
        assert read_best_json(model_dir)["step"] == 1
    else:  # Both complete, the old one aside and no best/ at all.
        assert [n.split("-")[0] for n in pid_dirs] == ["best.old", "best.partial"]
        assert not os.path.exists(model_dir / "best")
    assert_best_is_step_1(model_dir, tensors)

    checkpoint.recover_best(str(model_dir))  # What a resumed run does first.
    assert leftovers(model_dir) == [] and read_best_json(model_dir)["step"] == 1
    assert_best_is_step_1(model_dir, tensors)
    checkpoint.keep_best(str(model_dir), 2, {"metric": "top1", "mode": "max", "value": 1.0})
    assert checkpoint.select(str(model_dir), "best")[0][0] == 2


def test_a_failed_rename_puts_the_old_best_back(two_checkpoints, monkeypatch):
    model_dir, tensors = two_checkpoints
    best, replace = os.path.abspath(model_dir / "best"), os.replace

    def failing_replace(source, destination):
        if os.path.abspath(destination) == best and "partial" in source:
            raise OSError(28, "No space left on device")
        replace(source, destination)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.keep_best(str(model_dir), 2, {"metric": "top1", "mode": "max", "value": 1.0})
    assert leftovers(model_dir) == []
    assert_best_is_step_1(model_dir, tensors)


def test_a_run_goes_on_when_the_best_cannot_be_kept(tmp_path, monkeypatch):
    """Every new best fails to be renamed in: training ends normally, best/ as it was."""
    sets = [*EVERY_STEP, "train.keep_best=true"]
    model_dir = tmp_path / "run"
    loop.train_and_evaluate(runs.small_config(tmp_path, *sets, train_steps=1), str(model_dir))
    first = read_best_json(model_dir)
    # A best any evaluation beats: the resumed run tries to replace it at each one.
    with open(model_dir / "best" / "best.json", "w") as f:
        json.dump({**first, "value": -1.0}, f)
    best, replace, attempts = os.path.abspath(model_dir / "best"), os.replace, []

    def failing_replace(source, destination):
        if os.path.abspath(destination) == best and "partial" in source:
            attempts.append(source)
            raise OSError(28, "No space left on device")
        replace(source, destination)

    monkeypatch.setattr(os, "replace", failing_replace)
    config = runs.small_config(tmp_path, *sets, train_steps=3)
    result = loop.train_and_evaluate(config, str(model_dir))
    assert result.summary["step"] == 3 and len(attempts) == 2  # Steps 2 and 3.
    assert read_best_json(model_dir) == {**first, "value": -1.0}
    assert leftovers(model_dir) == []
    assert checkpoint.select(str(model_dir), "best")[0][0] == 1
