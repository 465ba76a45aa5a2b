"""Run directories written before the redesign still resume, evaluate and export.

`tests/fixtures/run_v0_tiny` was written by the code of commit bb118e4 (one flat
package, a four-way `ResidualUnit`, the optimizer and schedule sections as
dicts) with `model.name=tiny data.train_examples=64 data.eval_examples=37
train.batch_size=16 train.train_steps=6 train.eval_every=4 train.log_every=2
train.keep_checkpoints=2`: its config.yaml, data_info.json, metrics.jsonl and
the checkpoints ckpt-4 and ckpt-6. Its data is the `shapes` cache, which each
test regenerates under its own XDG_CACHE_HOME.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from resnet_app import config
from tests.commands import run_code, run_command
from tests.runs import read_records, saved_tensors
from tests.test_evaluate_cli import assert_matches, reference
from tests.test_export import evaluation_logits, restored

FIXTURE = Path(__file__).parent / "fixtures" / "run_v0_tiny"


# The augmentation keys of the code that wrote the fixture: element 0 of
# stateless_fold_in's [hash(seed, stream), epoch], the same in every epoch (a
# bug fixed since: `seeds.augment_key`). Runs that compare with the fixture's
# numbers train with them; everything else they check is today's code.
OLD_KEYS = (
    "import runpy, sys; import resnet_app.data.seeds as s; "
    "s.augment_key = lambda seed, epoch: s.stream_seed(seed, s.AUGMENT, epoch)[0]; "
    "sys.argv[0] = 'train'; runpy.run_module('resnet_app.train', run_name='__main__')"
)


def train_with_the_old_keys(*args, env):
    """`python -m resnet_app.train ARGS` with the fixture's augmentation keys."""
    return run_code(OLD_KEYS, *args, env=env)


@pytest.fixture
def old_run(tmp_path):
    """A copy of the old run directory, and the environment its commands run in."""
    copy = tmp_path / "run"
    shutil.copytree(FIXTURE, copy)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    return copy, env


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory):
    """The old run's settings trained for 8 steps from scratch by today's code.

    It saves every 2 steps and keeps them all (saving does not change the
    weights): ckpt-6 is the old run's last step, ckpt-8 the resumed run's.
    """
    root = tmp_path_factory.mktemp("fresh")
    result = train_with_the_old_keys(
        f"--config={FIXTURE / 'config.yaml'}",
        f"--model_dir={root / 'run'}",
        "--train_steps=8",
        "--set=train.checkpoint_every=2",
        "--set=train.keep_checkpoints=10",
        env={"XDG_CACHE_HOME": str(root / "cache")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run"


def test_an_old_run_resumes_from_its_last_checkpoint(old_run, fresh_run):
    model_dir, env = old_run
    before = saved_tensors(model_dir / "ckpt-6")
    result = train_with_the_old_keys(f"--model_dir={model_dir}", "--train_steps=8", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resumed from step 6" in result.stderr

    after = saved_tensors(model_dir / "ckpt-8")
    assert after["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == 8
    # 8 steps of 16 examples: the data stream went on where it stopped.
    assert after["data_position/.ATTRIBUTES/VARIABLE_VALUE"] == 8 * 16
    # The old checkpoint's slots were restored and moved on: the optimizer's
    # step count went on from 6, and every weight moved from its step-6 value.
    assert after["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"] == 8
    kernels = [k for k in before if k.startswith("model/") and "kernel" in k]
    assert kernels
    for key in kernels:
        assert after[key].shape == before[key].shape
        assert not np.array_equal(after[key], before[key]), key

    new = [r for r in read_records(model_dir) if r.get("event") == "start"]
    assert [r["step"] for r in new] == [0, 6]  # The old attempt, then the resume.
    last = [r for r in read_records(model_dir) if "top1" in r][-1]
    assert last["step"] == 8 and last["num_examples"] == 37

    # The uninterrupted 8 steps, by today's code from scratch: the old
    # checkpoint's weights, momentum slots and data position went on as they
    # would have (a mixed-up slot or a skipped batch would move the weights).
    # On a CPU of another kind than the one that wrote the fixture (e.g. Eigen
    # kernels on AVX2 against oneDNN's), today's first 6 steps round apart from
    # the fixture's: that drift, measured at step 6, is the control, and the
    # two runs may differ at step 8 by a few times it (2 more steps amplify it),
    # far below what a swapped slot or a skipped batch makes (the 2 steps'
    # update itself, `moved`).
    uninterrupted = saved_tensors(fresh_run / "ckpt-8")
    fresh_six = saved_tensors(fresh_run / "ckpt-6")
    keys = [k for k in after if k.startswith("model/")]
    control = _relative_l2(before, fresh_six, keys)
    moved = _relative_l2(after, before, keys)
    difference = _relative_l2(after, uninterrupted, keys)
    assert difference <= max(1e-6, 20 * control), (difference, control)
    assert difference < moved / 10, (difference, moved)


def _relative_l2(a: dict, b: dict, keys: list[str]) -> float:
    """||a - b|| / ||b|| over the tensors `keys`, as one vector."""
    diff = sum(float(np.sum((np.float64(a[k]) - np.float64(b[k])) ** 2)) for k in keys)
    norm = sum(float(np.sum(np.float64(b[k]) ** 2)) for k in keys)
    return (diff / norm) ** 0.5


def test_the_new_code_retrains_the_old_checkpoint(old_run, fresh_run):
    """The same settings, trained from scratch by today's code, reach the old run's weights.

    The redesign changes the shape of the code, not what it computes: six steps
    from the same seed give the weights the old code saved, up to the float
    rounding of a different op order or other kernels. On the CPU kind that
    wrote the fixture (oneDNN) they were identical; on Eigen kernels (AVX2)
    they round apart, so the bound is global, against the step-0 weights'
    distance: a mistake in the network (a lost ReLU, a swapped layer) moves
    the weights by about as much as the 6 steps themselves.
    """
    model_dir, _ = old_run
    old, new = saved_tensors(model_dir / "ckpt-6"), saved_tensors(fresh_run / "ckpt-6")
    start = saved_tensors(fresh_run / "ckpt-2")
    weights = [k for k in old if k.startswith("model/")]
    assert weights and set(weights) <= set(new)
    difference = _relative_l2(new, old, weights)
    moved = _relative_l2(new, start, weights)
    assert difference < moved / 100, (difference, moved)
    for key in weights:  # Shapes and finite values, variable by variable.
        assert new[key].shape == old[key].shape and np.all(np.isfinite(new[key])), key


def test_an_old_run_evaluates_like_plain_model_calls(old_run, monkeypatch):
    model_dir, env = old_run
    result = run_command(
        "resnet_app.evaluate", f"--model_dir={model_dir}", "--checkpoint=ckpt-6", env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [record] = [json.loads(line) for line in result.stdout.splitlines()]
    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    resolved = config.read_run_config(str(model_dir))
    assert_matches(record, reference((resolved, model_dir), "ckpt-6"))


def test_an_old_run_exports_a_model_that_serves_its_logits(old_run, tmp_path, monkeypatch):
    model_dir, env = old_run
    export_dir = tmp_path / "export"
    result = run_command(
        "resnet_app.export", f"--model_dir={model_dir}", f"--export_dir={export_dir}", env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["checkpoint"] == "ckpt-6"

    monkeypatch.setenv("XDG_CACHE_HOME", env["XDG_CACHE_HOME"])
    resolved = config.read_run_config(str(model_dir))
    pipeline, model = restored((resolved, model_dir), "ckpt-6")
    expected = evaluation_logits(model, pipeline.eval_dataset(16))
    served = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    logits = served(images=tf.constant(pipeline.eval_split().images))["logits"].numpy()
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)
    labels = (export_dir / "assets.extra" / "labels.txt").read_text().splitlines()
    with open(os.path.join(model_dir, "data_info.json")) as f:
        assert labels == json.load(f)["class_names"]
