"""Stochastic weight averaging (`train.swa_start`) against the float64 mean of the weights the
run left at the averaged updates (read back from its checkpoints)."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import checkpoint, metrics
from resnet_app.common.errors import ConfigError
from resnet_app.engine import loop, setup
from resnet_app.engine.actions import Action
from resnet_app.engine.ema import SwaAverage
from resnet_app.evaluation.soup import swa_checkpoint
from resnet_app.export import savedmodel
from tests import runs
from tests.small_models import SIZE, initial_weights, tiny_bn


def _models():
    make_model = lambda: tiny_bn(synchronized=True)  # noqa: E731
    weights = initial_weights(make_model)
    model, average = make_model(), make_model()
    for network in (model, average):
        network.build((None, SIZE, SIZE, 3))
    model.set_weights(weights)
    return model, average


@pytest.mark.parametrize("start,period", [(1, 1), (3, 2), (4, 3)])
def test_the_average_is_the_mean_of_the_models_at_its_updates(start, period):
    """Ten updates towards ten sets of random weights: the copy follows the weights
    before `start`, then is the mean of those at start, start + period, ... (BatchNorm
    statistics included), and holds between them."""
    strategy = tf.distribute.get_strategy()
    model, average = _models()
    swa = SwaAverage(model, average, start, period)
    swa.reset()
    rng = np.random.default_rng(start * 10 + period)
    averaged = []
    for update in range(1, 11):
        weights = [rng.normal(size=v.shape).astype(np.float32) for v in model.variables]
        for variable, value in zip(model.variables, weights):
            variable.assign(value)
        swa.update(strategy, tf.constant(update, tf.int64))
        if update < start:
            expected = weights
        elif (update - start) % period == 0:
            averaged.append(weights)
        if averaged:
            expected = [
                np.mean(np.stack(same).astype(np.float64), axis=0) for same in zip(*averaged)
            ]
        for variable, value in zip(average.variables, expected):
            np.testing.assert_allclose(variable.numpy(), value, rtol=1e-6, atol=1e-6)
    assert len(averaged) == (10 - start) // period + 1


def test_start_and_period_must_be_updates():
    model, average = _models()
    with pytest.raises(ValueError, match="SWA needs start >= 1 and period >= 1"):
        SwaAverage(model, average, 0, 2)


@pytest.mark.parametrize(
    "sets,message",
    [
        (["train.swa_start=0.75", "train.ema_decay=0.99"], "exclude each other"),
        (["train.swa_every=2"], "train.swa_every needs train.swa_start"),
        (["train.swa_start=1.0"], "train.swa_start must be"),
        (["train.swa_start=0.5", "train.swa_bn_batches=-1"], "train.swa_bn_batches must be"),
        (["train.swa_start=0.5", "sync.mode=model_average"], "needs sync.mode=allreduce"),
        (["train.swa_start=0.5", "train.precision=fp16"], "would be averaged twice"),
    ],
)
def test_swa_settings_are_checked(tmp_path, sets, message):
    with pytest.raises(ConfigError, match=message):
        runs.small_config(tmp_path, *sets)


class StopAt(Action):
    def __init__(self, step):
        self.step = step

    def after(self, boundary):
        if boundary.step == self.step:
            boundary.request_stop("SIGTERM")


SWA = ["train.swa_start=0.5", "train.swa_every=2", "train.swa_bn_batches=2"]


@pytest.fixture(scope="module")
def swa_run(tmp_path_factory):
    """8 steps of the tiny network with SWA from step 4 every 2 steps (models 4, 6, 8),
    a checkpoint at every step."""
    root = tmp_path_factory.mktemp("swa_run")
    resolved = runs.small_config(
        root, *SWA, train_steps=8, eval_every=4, checkpoint_every=1, keep_checkpoints=10
    )
    model_dir = root / "run"
    loop.train_and_evaluate(resolved, str(model_dir), swa_checkpoint=swa_checkpoint)
    return root, model_dir


def _restored(model_dir, step, weights):
    served, described = savedmodel.load(str(model_dir), str(step), weights=weights)
    assert described["weights"] == weights
    return [v.numpy() for v in served.model.variables]


def test_the_run_checkpoints_the_mean_of_its_models(swa_run):
    _, model_dir = swa_run
    raw = {step: _restored(model_dir, step, "raw") for step in (3, 4, 5, 6, 8)}
    mean = [np.mean(np.stack(v).astype(np.float64), axis=0) for v in zip(raw[4], raw[6], raw[8])]
    for actual, expected in zip(_restored(model_dir, 8, "ema"), mean):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)
    # Before the start it follows the weights; between two models it holds.
    for actual, expected in zip(_restored(model_dir, 3, "ema"), raw[3]):
        np.testing.assert_array_equal(actual, expected)
    held = [np.mean(np.stack(v).astype(np.float64), axis=0) for v in zip(raw[4], raw[6])]
    for actual, expected in zip(_restored(model_dir, 7, "ema"), held):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_the_end_writes_the_average_with_batch_norm_measured(swa_run):
    """The averaged checkpoint holds the SWA weights; its BatchNorm statistics are measured
    (not the averaged ones); the event names it, and --checkpoint=averaged selects it."""
    _, model_dir = swa_run
    with open(model_dir / "averaged" / "averaged.json") as f:
        record = json.load(f)
    assert record["step"] == 8 and record["bn_batches"] == 2 and record["weights"] == ["ema"]
    prefix = checkpoint.select(str(model_dir), "averaged")[0][1]
    saved = runs.saved_tensors(prefix)
    swa = runs.saved_tensors(checkpoint.select(str(model_dir), "8")[0][1])
    trainable = [k for k in saved if "kernel" in k and "model/" in k]
    assert trainable
    for key in trainable:
        ema_key = key.replace("model/", "ema/", 1)
        np.testing.assert_array_equal(saved[key], swa[ema_key])
    moving = [k for k in saved if "moving_mean" in k and "model/" in k]
    assert moving and any(
        not np.allclose(saved[k], swa[k.replace("model/", "ema/", 1)]) for k in moving
    )
    events = [
        r for r in metrics.read_records(str(model_dir / "metrics.jsonl")) if r.get("event") == "swa"
    ]
    assert len(events) == 1 and events[0]["models"] == 3
    assert events[0]["top1"] == record["evaluation"]["top1"]


def test_a_stopped_run_resumes_to_the_same_average(swa_run, tmp_path):
    """Stopped at step 5 (between two models) and resumed: the end's average is the
    uninterrupted run's (to float32 rounding: kernels without op determinism)."""
    root, whole = swa_run

    def config():
        return runs.small_config(
            root, *SWA, train_steps=8, eval_every=4, checkpoint_every=1, keep_checkpoints=10
        )

    model_dir = str(tmp_path / "run")
    stopped = loop.train(setup.build_run(config(), model_dir), actions=[StopAt(5)])
    assert stopped.stopped == "SIGTERM"
    loop.train(setup.build_run(config(), model_dir), swa_checkpoint=swa_checkpoint)
    for resumed, straight in zip(_restored(model_dir, 8, "ema"), _restored(whole, 8, "ema")):
        np.testing.assert_allclose(resumed, straight, rtol=1e-6, atol=1e-8)
    assert os.path.isdir(os.path.join(model_dir, "averaged"))


def _copy(model_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    return copy


def test_a_run_resumed_at_its_end_keeps_its_average(swa_run, tmp_path):
    """Nothing is measured again: the averaged checkpoint and its one swa event stay."""
    root, model_dir = swa_run
    copy = _copy(model_dir, tmp_path)
    before = (copy / "averaged" / "averaged.json").read_text()
    resolved = runs.small_config(
        root, *SWA, train_steps=8, eval_every=4, checkpoint_every=1, keep_checkpoints=10
    )
    loop.train_and_evaluate(resolved, str(copy), swa_checkpoint=swa_checkpoint)
    assert (copy / "averaged" / "averaged.json").read_text() == before
    records = metrics.read_records(str(copy / "metrics.jsonl"))
    assert len([r for r in records if r.get("event") == "swa"]) == 1
    assert len([r for r in records if r.get("event") == "start"]) == 2  # It did resume.


def test_a_resume_that_moves_the_averaged_models_is_refused(swa_run, tmp_path):
    """8 steps averaged from update 4; 12 would start at 6: the average would be misweighted."""
    root, model_dir = swa_run
    copy = _copy(model_dir, tmp_path)
    longer = runs.small_config(
        root, *SWA, train_steps=12, eval_every=4, checkpoint_every=1, keep_checkpoints=10
    )
    with pytest.raises(
        ConfigError, match="from update 4 every 2; the settings given put them at 6"
    ):
        setup.build_run(longer, str(copy))
