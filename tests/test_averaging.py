"""Local SGD (`sync.mode: model_average`): local steps, averages every K steps.

References: a single-device run written from the update rules (interval 1 is the
all-reduce update for SGD and momentum), and the NumPy mean of the copies of a run
that never averages.
"""

import contextlib
import json
import re

import numpy as np
import pytest
import tensorflow as tf

from resnet_app import config
from resnet_app.common import checkpoint, distribute
from resnet_app.common.distribute import mirrored_strategy
from resnet_app.common.errors import ConfigError
from resnet_app.engine import local_sgd, loop, optim, setup
from resnet_app.engine.actions import Action
from resnet_app.engine.step import Tower, TrainStep
from tests import runs
from tests.commands import error_line, run_command
from tests.reference import momentum_steps
from tests.runs import saved_tensors
from tests.small_models import SIZE, initial_weights, no_bn, tiny_bn
from tests.test_multiworker import run_workers

LEARNING_RATES = (0.1, 0.05, 0.1)  # An LR change, as the trainer feeds it.
NEVER = 10**9  # An interval that never comes: the replicas' copies as they drift.


def _batches(steps: int, count: int = 8) -> dict:
    """`steps` different global batches of `count` examples, stacked."""
    rng = np.random.default_rng(0)
    return {
        "image": rng.normal(size=(steps, count, SIZE, SIZE, 3)).astype(np.float32),
        "label": rng.integers(0, 5, size=(steps, count)).astype(np.int32),
        "mask": np.ones((steps, count), np.float32),
    }


def _training(make_model, weights, optimizer_config, interval, towers=2):
    """A TrainStep with local SGD averaging every `interval` steps (None: all-reduce)."""
    strategy = mirrored_strategy([f"/cpu:{i}" for i in range(towers)])
    local = local_sgd.local_variables() if interval else contextlib.nullcontext()
    with strategy.scope(), local:
        model = make_model()
        model.build((None, SIZE, SIZE, 3))
        model.set_weights(weights)
        optimizer = optim.create_optimizer(optimizer_config)
        optimizer.build(model.trainable_variables)
    policy = local_sgd.LocalSGD(model, optimizer, strategy, interval) if interval else None
    return strategy, model, optimizer, TrainStep(Tower(model, optimizer), strategy, policy)


def _iterator(strategy, batches):
    dataset = tf.data.Dataset.from_tensor_slices(batches)
    return iter(strategy.experimental_distribute_dataset(dataset))


def _copies(strategy, variable) -> list[np.ndarray]:
    """Every replica's copy of a variable."""
    return [v.numpy() for v in strategy.experimental_local_results(variable.value)]


def _single_device(make_model, weights, batches, optimizer_config) -> list[np.ndarray]:
    """The reference: one device, one batch per step, the update rule written out."""
    model = make_model()
    model.build((None, SIZE, SIZE, 3))
    model.set_weights(weights)
    pairs = list(zip(batches["image"], batches["label"]))
    momentum_steps(model, pairs, LEARNING_RATES, optimizer_config.get("momentum", 0.0))
    return [v.numpy() for v in model.variables]


MODELS = {
    "no_bn": no_bn,
    # Synchronized BatchNorm normalizes like one device, so the reference applies.
    "synchronized_bn": lambda: tiny_bn(synchronized=True),
}
OPTIMIZERS = {
    "sgd": {"class": "sgd", "learning_rate": 0.1, "momentum": 0.0},
    "momentum": {"class": "momentum", "learning_rate": 0.1, "momentum": 0.9},
}


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("optimizer_name", sorted(OPTIMIZERS))
def test_averaging_every_step_is_the_one_device_update(model_name, optimizer_name):
    """Interval 1 on 2 towers: each tower steps alone, the copies are averaged
    (weights and momenta), and that is the one-device step on the whole batch."""
    make_model, optimizer_config = MODELS[model_name], OPTIMIZERS[optimizer_name]
    weights = initial_weights(make_model)
    batches = _batches(len(LEARNING_RATES))
    expected = _single_device(make_model, weights, batches, optimizer_config)
    strategy, model, optimizer, step = _training(make_model, weights, optimizer_config, 1)
    result = step.loop(_iterator(strategy, batches), list(LEARNING_RATES))
    assert result.steps == len(LEARNING_RATES) and result.sums["examples"] == 24
    for variable, value in zip(model.variables, expected):
        for copy in _copies(strategy, variable):
            np.testing.assert_allclose(copy, value, rtol=1e-5, atol=1e-7, err_msg=variable.path)
    assert int(optimizer.iterations.numpy()) == len(LEARNING_RATES)


@pytest.mark.parametrize("towers", [2, 3])
def test_copies_drift_between_averages_and_become_their_mean(towers):
    """Interval 4, per-tower BatchNorm, momentum: after steps 1-3 the copies differ;
    after step 4 they are identical and equal to the NumPy mean of the copies a
    run that never averages holds after the same 4 steps; step 5 drifts again."""
    make_model = lambda: tiny_bn(synchronized=False)  # noqa: E731
    weights = initial_weights(make_model)
    batches = _batches(5, count=4 * towers)
    momentum = OPTIMIZERS["momentum"]
    drifting = _training(make_model, weights, momentum, NEVER, towers)
    averaged = _training(make_model, weights, momentum, 4, towers)
    iterators = [_iterator(run[0], batches) for run in (drifting, averaged)]
    for run, iterator in zip((drifting, averaged), iterators):
        assert run[3].loop(iterator, [0.1] * 3).steps == 3
    strategy, model, optimizer, step = averaged
    variables = [*model.variables, *optimizer.variables]
    drifted = {
        v.path
        for v in variables
        if not all(np.array_equal(_copies(strategy, v)[0], c) for c in _copies(strategy, v))
    }
    kinds = {
        "weights": model.trainable_variables,
        "moving statistics": model.non_trainable_variables,
        "slots": optimizer.variables,
    }
    for kind, members in kinds.items():
        assert {v.path for v in members} & drifted, kind

    drifting[3].loop(iterators[0], [0.1])  # Step 4 without averaging.
    step.loop(iterators[1], [0.1])  # Step 4, then the average.
    averaged_names = {v.path for v in step.policy.averaged}
    not_averaged = {optimizer.iterations.path, optimizer.learning_rate.path}
    assert averaged_names == {v.path for v in variables} - not_averaged
    for variable, before in zip(variables, [*drifting[1].variables, *drifting[2].variables]):
        copies = _copies(strategy, variable)
        for copy in copies[1:]:
            np.testing.assert_array_equal(copy, copies[0], err_msg=variable.path)
        if variable.path in averaged_names:
            mean = np.mean(_copies(drifting[0], before), axis=0)
            np.testing.assert_allclose(copies[0], mean, rtol=1e-6, atol=1e-7)
    # Read across replicas (what a checkpoint stores), a copy is their mean.
    kernel = model.stem_conv.kernel
    np.testing.assert_allclose(kernel.numpy(), _copies(strategy, kernel)[0], rtol=1e-6)

    step.loop(iterators[1], [0.1])  # Step 5: apart again.
    copies = _copies(strategy, kernel)
    assert not np.array_equal(copies[0], copies[1])


def _collectives(step, strategy, steps=2):
    """The collective ops of the compiled loop, traced for `steps` steps."""
    batches = _batches(steps)
    iterator = _iterator(strategy, batches)
    function = step.compiled_loop(iterator).get_concrete_function(
        iterator, tf.constant([0.1] * steps), tf.constant(steps), None
    )
    return distribute.collective_ops(function.graph)


def test_no_gradient_all_reduce_between_averages():
    """All-reduce: every step all-reduces the gradients and the example count.
    Model averaging: no collective at all outside the averaging branch, which
    moves the weights and momenta once. (The 4 metrics reach one device by
    copies, not a collective, within one machine.)"""
    weights = initial_weights(no_bn)
    momentum = OPTIMIZERS["momentum"]
    parameters = sum(w.size for w in weights)
    strategy, _, _, allreduce = _training(no_bn, weights, momentum, None)
    found = _collectives(allreduce, strategy)
    # One op per replica for each all-reduce.
    assert sorted((c.path, c.bytes) for c in found) == sorted(
        [(("While",), 4 * parameters), (("While",), 4)] * 2
    )

    strategy, _, _, local = _training(no_bn, weights, momentum, 4)
    found = _collectives(local, strategy)
    assert sorted((c.path, c.bytes) for c in found) == [(("While", "If"), 4 * 2 * parameters)] * 2


def test_a_stop_waits_for_the_next_average():
    weights = initial_weights(no_bn)
    strategy, _, optimizer, step = _training(no_bn, weights, OPTIMIZERS["sgd"], 3)
    iterator = _iterator(strategy, _batches(8))
    assert step.loop(iterator, [0.1]).steps == 1
    stop = tf.Variable(True)
    assert step.loop(iterator, [0.1] * 5, stop).steps == 2  # Steps 2 and 3, then the average.
    assert int(optimizer.iterations.numpy()) == 3
    assert step.loop(iterator, [0.1] * 5, stop).steps == 0


def small_config(tmp_path, *sets, **train):
    """`runs.small_config` on 2 towers with model averaging every 3 steps."""
    return runs.small_config(
        tmp_path,
        "train.log_every=1",
        "train.eval_every=100",
        "sync.mode=model_average",
        "sync.interval=3",
        *sets,
        **{"num_towers": 2, **train},
    )


class SpreadAtSaves(Action):
    """Records (step, the largest difference between replicas' copies) at every save."""

    def __init__(self, run, saves, stop_at=None):
        self.run, self.saves, self.stop_at = run, saves, stop_at

    def after(self, boundary):
        if boundary.saved:
            run = self.run
            spread = max(
                np.max(np.abs(c - _copies(run.strategy, v)[0]))
                for v in [*run.model.variables, *run.optimizer.variables]
                for c in _copies(run.strategy, v)
            )
            self.saves.append((boundary.step, float(spread)))
        if boundary.step == self.stop_at:
            boundary.request_stop("SIGTERM")


def train_recording_saves(config, model_dir, saves, stop_at=None):
    run = setup.build_run(config, str(model_dir))
    return loop.train(run, actions=[SpreadAtSaves(run, saves, stop_at)])


def test_checkpoints_hold_averages_and_a_stopped_run_resumes_exactly(tmp_path):
    """Interval 3, checkpoint_every 2 (made 3). A stop asked for at step 4 waits
    for the average of step 6; resumed, the run ends where an uninterrupted one
    does. Every save sees identical copies."""
    saves = []
    sets = ["train.checkpoint_every=2"]
    whole = train_recording_saves(
        small_config(tmp_path, *sets, train_steps=8), tmp_path / "whole", saves
    )
    # 3 and 6 (averages) and 8 (the last step, which averages once more).
    assert saves == [(3, 0.0), (6, 0.0), (8, 0.0)]
    assert [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "whole"))] == [3, 6, 8]

    saves.clear()
    stopped = train_recording_saves(
        small_config(tmp_path, *sets, train_steps=8), tmp_path / "run", saves, stop_at=4
    )
    assert stopped.stopped == "SIGTERM" and stopped.summary["step"] == 6
    assert saves == [(3, 0.0), (6, 0.0)]
    resumed = train_recording_saves(
        small_config(tmp_path, *sets, train_steps=8), tmp_path / "run", saves
    )
    assert saves[-1] == (8, 0.0)
    expected = saved_tensors(tmp_path / "whole" / "ckpt-8")
    actual = saved_tensors(tmp_path / "run" / "ckpt-8")
    assert any(name.startswith("optimizer/_variables/") for name in expected)  # Slots.
    for name, value in expected.items():
        if getattr(value, "dtype", None) is not None and value.dtype.kind == "f":
            np.testing.assert_allclose(actual[name], value, rtol=1e-6, atol=1e-8, err_msg=name)
        elif name != "_CHECKPOINTABLE_OBJECT_GRAPH":
            np.testing.assert_array_equal(actual[name], value, err_msg=name)
    # The trained model (what evaluation saw) is the checkpoint's global model.
    for weights in (whole.model.get_weights(), resumed.model.get_weights()):
        kernel = [w for w in weights if w.shape == (3, 3, 3, 4)][0]
        np.testing.assert_allclose(
            kernel, expected["model/stem_conv/_kernel/.ATTRIBUTES/VARIABLE_VALUE"], rtol=1e-6
        )


def test_resuming_with_other_sync_settings_or_replicas_is_refused(tmp_path):
    model_dir = str(tmp_path / "run")
    loop.train_and_evaluate(small_config(tmp_path, train_steps=1), model_dir)
    for sets, train, message in [
        (["sync.mode=allreduce"], {}, r"sync.mode 'model_average' -> 'allreduce'"),
        (["sync.interval=4"], {}, r"sync.interval 3 -> 4"),
        ([], {"num_towers": 1}, r"replicas 2 -> 1 \(with model averaging each replica trains"),
    ]:
        with pytest.raises(ConfigError, match=message):
            loop.train_and_evaluate(
                small_config(tmp_path, *sets, train_steps=2, **train), model_dir
            )


def test_two_workers_end_with_the_same_global_model(tmp_path):
    """Each worker trains its own copy, averaged every 2 steps and at the end
    (step 5). Both workers' own copies end identical, equal to their mean (the
    cross-replica read) and to the checkpoint."""
    sets = ["sync.mode=model_average", "sync.interval=2", "model.bn_synchronized=false"]
    chief, other = run_workers(tmp_path, 5, *sets)
    local = sorted(name for name in chief.files if name.startswith("local_"))
    assert len(local) > 2
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name], err_msg=name)
    for name in local:
        np.testing.assert_array_equal(chief[name], chief[name.replace("local", "arr")])
    saved = checkpoint.list_checkpoints(str(tmp_path / "run"))
    assert [s for s, _ in saved] == [4, 5]  # An epoch (4 steps, an average), then the end.
    kernel = saved_tensors(saved[-1][1])["model/stem_conv/_kernel/.ATTRIBUTES/VARIABLE_VALUE"]
    np.testing.assert_array_equal(chief["local_0"], kernel)


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--sync=foo", r"sync.mode must be one of: allreduce, model_average, got 'foo'"),
        ("--average_interval=0", r"sync.interval must be a whole number >= 1, got 0"),
        (
            "--set=sync.intervall=2",
            r"unknown sync key\(s\) intervall; valid keys: interval, keep_last_step, mode, timeout",
        ),
        (
            "--sync=model_average --precision=fp16",
            r"sync.mode=model_average cannot use train.precision=fp16",
        ),
    ],
)
def test_bad_sync_input_is_one_line(tmp_path, flag, message):
    result = run_command("resnet_app.train", *flag.split(), f"--model_dir={tmp_path / 'run'}")
    assert re.search(message, error_line(result))


def test_sync_section_round_trips_and_defaults_to_allreduce():
    default = config.resolve()
    assert default.sync == config.SyncSettings(mode="allreduce", interval=8)
    averaged = config.resolve(sets=["sync.mode=model_average", "sync.interval=4"])
    assert config.from_dict(averaged.to_dict()) == averaged
    assert config.changes(default, averaged) == {
        "sync.interval": (8, 4),
        "sync.mode": ("allreduce", "model_average"),
    }
    assert not {"sync.mode", "sync.interval"} & config.RESUMABLE_CHANGES
    # A run directory written before the section existed reads as all-reduce.
    old = {k: v for k, v in default.to_dict().items() if k != "sync"}
    assert config.from_dict(old) == default


def test_benchmark_counts_collectives_falling_by_the_interval():
    """The benchmark's profiler count: all-reduce 2 collectives per step (gradients,
    example count); local SGD 1/K, and its bytes fall by K."""
    args = ["sync", "--model=tiny", "--steps=4", "--intervals=1,4", "--windows=1", "--json"]
    result = run_command("scripts/benchmark.py", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(result.stdout)["rows"]
    assert [
        rows[k]["collectives"] for k in ["allreduce", "model_average 1", "model_average 4"]
    ] == [2.0, 1.0, 0.25]
    assert rows["model_average 4"]["bytes"] * 4 == rows["model_average 1"]["bytes"]
