"""The moving average of the weights (`train.ema_decay`, `engine/ema.py`) against NumPy.

The reference is the recursion e <- d * e + (1 - d) * w written in NumPy
float32, fed with the weights each step actually left on each replica (read
back from the run), so a wrong decay, warm-up, order (before or after the
update) or replica gives different numbers.
"""

import contextlib
import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import checkpoint
from resnet_app.common.distribute import mirrored_strategy
from resnet_app.common.errors import ConfigError
from resnet_app.engine import local_sgd, loop, optim
from resnet_app.engine.ema import WeightEMA
from resnet_app.engine.step import Tower, TrainStep
from resnet_app.evaluation import calibration, checkpoint_eval
from resnet_app.export import savedmodel
from tests import runs
from tests.commands import error_line, run_command
from tests.small_models import SIZE, initial_weights, tiny_bn

DECAY = 0.8


def _numpy_decay(update: int, warmup: bool, every: int = 1) -> np.float32:
    decay = DECAY
    if warmup:
        decay = min(DECAY, (1 + update) / (10 + update))
    return np.float32(decay) ** every


def _numpy_step(average: list, weights: list, decay: np.float32) -> list:
    return [decay * e + (np.float32(1) - decay) * w for e, w in zip(average, weights)]


def _models(strategy, interval=None):
    """The trained model (per-tower BatchNorm) and a second one for the average."""
    make_model = lambda: tiny_bn(synchronized=False)  # noqa: E731
    weights = initial_weights(make_model)
    local = local_sgd.local_variables() if interval else contextlib.nullcontext()
    with strategy.scope(), local:
        model = make_model()
        model.build((None, SIZE, SIZE, 3))
        model.set_weights(weights)
        optimizer = optim.create_optimizer({"class": "momentum", "momentum": 0.9})
        optimizer.build(model.trainable_variables)
    with strategy.scope():
        average = make_model()
        average.build((None, SIZE, SIZE, 3))
    return model, optimizer, average


@pytest.mark.parametrize("warmup", [False, True])
@pytest.mark.parametrize("every", [1, 3])
def test_update_is_the_numpy_recursion(warmup, every):
    """Five updates towards five sets of random weights, moving statistics included."""
    strategy = tf.distribute.get_strategy()
    model, _, average = _models(strategy)
    ema = WeightEMA(model, average, DECAY, warmup, every)
    ema.reset()
    expected = [v.numpy() for v in model.variables]
    assert all(np.array_equal(a.numpy(), e) for a, e in zip(average.variables, expected))
    rng = np.random.default_rng(0)
    for update in range(1, 6):
        weights = [rng.normal(size=v.shape).astype(np.float32) for v in model.variables]
        for variable, value in zip(model.variables, weights):
            variable.assign(value)
        ema.update(strategy, tf.constant(update * every, tf.int64))
        expected = _numpy_step(expected, weights, _numpy_decay(update * every, warmup, every))
    assert len(average.non_trainable_variables) > 0  # BatchNorm statistics are averaged too.
    for variable, value in zip(average.variables, expected):
        np.testing.assert_allclose(variable.numpy(), value, rtol=2e-6, atol=1e-7)


def test_decay_out_of_range_and_mismatched_models_are_refused():
    strategy = tf.distribute.get_strategy()
    model, _, average = _models(strategy)
    with pytest.raises(ValueError, match="decay"):
        WeightEMA(model, average, 1.0)
    other = keras.Sequential([keras.Input((5,)), keras.layers.Dense(5)])  # Another network.
    with pytest.raises(ValueError):
        WeightEMA(model, other, DECAY)


@pytest.mark.parametrize(
    "towers,interval,warmup",
    [(1, None, True), (2, None, False), (2, 2, True)],
    ids=["1-tower-warmup", "2-towers", "2-towers-model-average-2"],
)
def test_training_average_follows_every_replicas_weights(towers, interval, warmup):
    """Four momentum steps: after each, every replica's copy of the average moved
    towards that replica's weights as NumPy computes it; with model averaging
    every 2 steps only after the averages, with decay d**2 from the averaged weights."""
    strategy = mirrored_strategy([f"/cpu:{i}" for i in range(towers)])
    model, optimizer, average = _models(strategy, interval)
    averager = local_sgd.LocalSGD(model, optimizer, strategy, interval) if interval else None
    ema = WeightEMA(model, average, DECAY, warmup, interval or 1)
    ema.reset()
    step = TrainStep(Tower(model, optimizer), strategy, averager, ema)
    rng = np.random.default_rng(0)
    batches = {
        "image": rng.normal(size=(4, 8, SIZE, SIZE, 3)).astype(np.float32),
        "label": rng.integers(0, 5, size=(4, 8)).astype(np.int32),
        "mask": np.ones((4, 8), np.float32),
    }
    dataset = tf.data.Dataset.from_tensor_slices(batches)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    def copies(variable):
        return [v.numpy() for v in strategy.experimental_local_results(variable.value)]

    expected = [[v.numpy() for v in model.variables] for _ in range(towers)]
    for update in range(1, 5):
        assert step.loop(iterator, [0.1]).steps == 1
        if interval and update % interval:
            continue  # Between averages the copies drift; the average waits.
        decay = _numpy_decay(update, warmup, interval or 1)
        for replica in range(towers):
            weights = [copies(v)[replica] for v in model.variables]
            expected[replica] = _numpy_step(expected[replica], weights, decay)
    for index, variable in enumerate(average.variables):
        held = copies(variable)
        for replica in range(towers):
            np.testing.assert_allclose(
                held[replica], expected[replica][index], rtol=2e-6, atol=1e-7, err_msg=variable.path
            )
            # Identical on every replica: the weights, and with model averaging
            # also the per-tower BatchNorm statistics (averaged with the rest).
            if model.variables[index].trainable or interval:
                np.testing.assert_array_equal(held[replica], held[0], err_msg=variable.path)
    moved = [
        not np.array_equal(a.numpy(), w.numpy())
        for a, w in zip(average.variables, model.variables)
        if w.trainable
    ]
    assert all(moved)  # The average lags the weights.


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    """8 steps of the tiny network with the average, a checkpoint at every step,
    and the best by the average's evaluation loss kept."""
    root = tmp_path_factory.mktemp("ema_run")
    resolved = runs.small_config(
        root,
        "train.ema_decay=0.7",
        "train.keep_best=true",
        "train.best_metric=ema_loss",
        train_steps=8,
        eval_every=4,
        checkpoint_every=1,
        keep_checkpoints=10,
    )
    model_dir = root / "run"
    loop.train_and_evaluate(resolved, str(model_dir))
    return model_dir


def _restored(model_dir, step: int, weights: str) -> list[np.ndarray]:
    """A checkpoint's weights or average, restored into the run's network."""
    served, described = savedmodel.load(str(model_dir), str(step), weights=weights)
    assert described["weights"] == weights
    return [v.numpy() for v in served.model.variables]


def test_run_checkpoints_the_average_as_numpy_continues_it(ema_run):
    """ckpt-8's average is ckpt-4's carried on by NumPy over the weights of ckpt-5 ... ckpt-8
    (the BatchNorm statistics included)."""
    expected = _restored(ema_run, 4, "ema")
    for step in range(5, 9):
        expected = _numpy_step(expected, _restored(ema_run, step, "raw"), np.float32(0.7))
    for actual, value in zip(_restored(ema_run, 8, "ema"), expected):
        np.testing.assert_allclose(actual, value, rtol=2e-6, atol=1e-7)


def test_run_evaluates_both_and_evaluate_picks_the_average(ema_run, tmp_path):
    """metrics.jsonl and TensorBoard hold both evaluations; `evaluate` restores
    either, defaulting to the average, and gets the trainer's numbers back."""
    evaluations = [r for r in runs.read_records(ema_run) if "top1" in r]
    assert [r["step"] for r in evaluations] == [4, 8]
    assert all({"ema_top1", "ema_top5", "ema_loss"} <= set(r) for r in evaluations)
    assert evaluations[-1]["ema_loss"] != evaluations[-1]["loss"]
    events = os.listdir(ema_run / "eval_ema")
    assert any(name.startswith("events.out.tfevents") for name in events)

    last = evaluations[-1]
    for weights, prefix in (("auto", "ema_"), ("ema", "ema_"), ("raw", "")):
        [record] = checkpoint_eval.evaluate_checkpoints(
            str(ema_run), "8", weights=weights, report_dir=str(tmp_path / weights)
        )
        assert record["weights"] == ("raw" if weights == "raw" else "ema")
        assert record["top1"] == last[prefix + "top1"]
        assert record["loss"] == pytest.approx(last[prefix + "loss"], rel=1e-5)
        assert record["report"].endswith("ckpt-8-test" + ("" if weights == "raw" else "-ema"))


def test_keep_best_ranks_by_the_averages_evaluation(ema_run):
    import json

    evaluations = [r for r in runs.read_records(ema_run) if "ema_loss" in r]
    best = min(evaluations, key=lambda r: r["ema_loss"])
    with open(ema_run / "best" / "best.json") as file:
        kept = json.load(file)
    assert kept["step"] == best["step"] and kept["value"] == best["ema_loss"]
    [record] = checkpoint_eval.evaluate_checkpoints(
        str(ema_run), "best", report_dir=str(ema_run.parent / "best_report")
    )
    assert record["weights"] == "ema" and record["loss"] == pytest.approx(best["ema_loss"], 1e-5)


def test_export_loads_the_average_by_default(ema_run):
    """The served model's weights are the checkpoint's average (or with raw, its weights)."""
    tensors = runs.saved_tensors(ema_run / "ckpt-8")
    ema = [value for key, value in tensors.items() if key.startswith("ema/")]

    def fingerprint(arrays):
        return sorted((a.shape, a.tobytes()) for a in arrays)

    for weights, chosen in (("auto", "ema"), ("raw", "raw")):
        served, described = savedmodel.load(str(ema_run), "8", weights=weights)
        assert described["weights"] == chosen
        loaded = fingerprint(v.numpy() for v in served.model.variables)
        assert (loaded == fingerprint(ema)) == (chosen == "ema")


def test_weights_ema_without_an_average_is_one_line(tiny_run):
    _, model_dir = tiny_run
    prefix = checkpoint.find_latest(str(model_dir))[1]
    with pytest.raises(ConfigError, match="holds no moving average"):
        checkpoint.chosen_weights(prefix, "ema")
    assert checkpoint.chosen_weights(prefix, "auto") == "raw"
    result = run_command("resnet_app.evaluate", f"--model_dir={model_dir}", "--weights=ema")
    assert "--weights=raw" in error_line(result)


def test_ema_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="train.ema_decay"):
        runs.small_config(tmp_path, "train.ema_decay=1.0")
    with pytest.raises(ConfigError, match="ema_top1 needs the moving average"):
        runs.small_config(tmp_path, "train.best_metric=ema_top1")
    resolved = runs.small_config(tmp_path, "train.ema_decay=0.99", "train.best_metric=ema_top1")
    assert resolved.train.best_direction == "max"


def test_fine_tuning_from_a_run_takes_its_average(ema_run, tmp_path):
    from resnet_app.engine import setup

    source = f"train.init_from={ema_run / 'ckpt-8'}"
    resolved = runs.small_config(tmp_path, source, "train.ema_decay=0.9", train_steps=4)
    run = setup.build_run(resolved, str(tmp_path / "tuned"))
    average = _restored(ema_run, 8, "ema")
    # The run starts from the source's average, and so does its own average.
    for variables in (run.model.variables, run.ema.model.variables):
        for variable, value in zip(variables, average, strict=True):
            np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.path)


def test_a_temperature_fitted_on_the_other_weights_is_warned(caplog):
    fitted = {"temperature": 1.5, "checkpoint": "ckpt-8", "weights": "raw"}
    calibration.warn_if_fitted_elsewhere(fitted, "/run/ckpt-8", "ema")
    assert "fitted on ckpt-8's raw weights, not its ema weights" in caplog.text
    assert "--checkpoint=ckpt-8 --weights=ema" in caplog.text
    caplog.clear()
    calibration.warn_if_fitted_elsewhere(fitted, "/run/ckpt-8", "raw")
    del fitted["weights"]  # A temperature.json from before EMA: fitted on the raw weights.
    calibration.warn_if_fitted_elsewhere(fitted, "/run/ckpt-8", "raw")
    assert caplog.text == ""


def _train(directory, *sets, **train):
    """A small run with the average (decay 0.7), a checkpoint at every step."""
    resolved = runs.small_config(
        directory.parent, *sets, checkpoint_every=1, keep_checkpoints=20, **train
    )
    return loop.train_and_evaluate(resolved, str(directory))


def test_two_towers_evaluate_the_average_as_evaluate_does(tmp_path):
    """Per-tower BatchNorm: the towers' statistics of the average are averaged
    before the trainer evaluates and saves it, as the weights' are, so
    `evaluate` on 2 towers gets the trainer's numbers back."""
    result = _train(tmp_path / "run", "train.ema_decay=0.7", train_steps=4, num_towers=2)
    for weights, prefix in (("ema", "ema_"), ("raw", "")):
        [record] = checkpoint_eval.evaluate_checkpoints(
            str(tmp_path / "run"), "4", num_towers=2, weights=weights
        )
        assert record["loss"] == pytest.approx(result.summary[prefix + "loss"], rel=1e-6)


def test_model_averaging_off_the_interval_ends_with_the_average_followed(tmp_path):
    """K=4 and 6 steps: the run averages at its end, and the average takes the
    two steps since step 4 at once (0.7**2) from the averaged weights."""
    sets = ("train.ema_decay=0.7", "sync.mode=model_average", "sync.interval=4")
    _train(tmp_path / "run", *sets, train_steps=6, num_towers=2)
    decay = np.float32(0.7) ** 2
    expected = _numpy_step(
        _restored(tmp_path / "run", 4, "ema"), _restored(tmp_path / "run", 6, "raw"), decay
    )
    for actual, value in zip(_restored(tmp_path / "run", 6, "ema"), expected, strict=True):
        np.testing.assert_allclose(actual, value, rtol=2e-6, atol=1e-7)


def test_the_average_may_start_on_resume(tmp_path, caplog):
    """A run resumed with train.ema_decay set starts its average from the
    resumed weights (no --allow_config_change needed: the weights do not change)."""
    _train(tmp_path / "run", train_steps=4)
    _train(tmp_path / "run", "train.ema_decay=0.7", train_steps=6)
    assert "starts from the weights of step 4" in caplog.text
    expected = _restored(tmp_path / "run", 4, "raw")
    for step in (5, 6):
        expected = _numpy_step(expected, _restored(tmp_path / "run", step, "raw"), np.float32(0.7))
    for actual, value in zip(_restored(tmp_path / "run", 6, "ema"), expected, strict=True):
        np.testing.assert_allclose(actual, value, rtol=2e-6, atol=1e-7)


def test_keep_best_ranks_by_the_average_by_default(tmp_path):
    assert runs.small_config(tmp_path).train.best_by == "top1"
    resolved = runs.small_config(tmp_path, "train.ema_decay=0.9")
    assert (resolved.train.best_by, resolved.train.best_direction) == ("ema_top1", "max")
    with pytest.raises(ConfigError, match="train.ema_warmup needs train.ema_decay"):
        runs.small_config(tmp_path, "train.ema_warmup=true")


def test_evaluate_all_skips_a_checkpoint_rotated_out_while_it_runs(ema_run, tmp_path, monkeypatch):
    """A trainer still running rotates checkpoints out under `evaluate --checkpoint=all`:
    the one gone is skipped with a warning; the others are evaluated as they are."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ema_run, run)
    for step in range(1, 6):
        for path in glob.glob(str(run / f"ckpt-{step}.*")):
            os.remove(path)
    restore = checkpoint.restore_model

    def rotating(model, prefix, weights="raw"):
        for path in glob.glob(str(run / "ckpt-7.*")):  # Rotated out after the choice.
            os.remove(path)
        return restore(model, prefix, weights)

    monkeypatch.setattr(checkpoint, "restore_model", rotating)
    records = checkpoint_eval.evaluate_checkpoints(
        str(run), "all", weights="raw", report_dir=str(tmp_path / "reports")
    )
    assert [record["step"] for record in records] == [6, 8]
    trained = {r["step"]: r for r in runs.read_records(ema_run) if "top1" in r}
    assert records[1]["top1"] == trained[8]["top1"]
