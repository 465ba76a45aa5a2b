"""The training loop observed through its actions: boundaries, saves, stops, checks.

An extra action sees every boundary (after the evaluator, before the checkpointer);
what it saw is compared with what was worked out by hand.
"""

import numpy as np
import pytest

from resnet_app.common import checkpoint, distribute
from resnet_app.common.errors import ConfigError
from resnet_app.engine import loop
from resnet_app.engine.actions import Action
from resnet_app.nets import factory
from tests import runs
from tests.runs import read_records


class Recorder(Action):
    """Every boundary's step, what was due, evaluated and saved; stops at `stop_at`."""

    def __init__(self, stop_at=None):
        self.stop_at = stop_at
        self.boundaries = []

    def __call__(self, boundary):
        self.boundaries.append(boundary)
        if boundary.step == self.stop_at:
            boundary.request_stop("early stop")

    def steps(self, which=lambda b: True):
        return [b.step for b in self.boundaries if which(b)]


def test_boundaries_records_evaluations_and_saves_fall_where_worked_out_by_hand(tmp_path):
    """10 steps; records every 3, evaluations every 4, checkpoints every 5; 3 steps a call."""
    sets = ["train.log_every=3", "train.eval_every=4", "train.checkpoint_every=5"]
    sets += ["train.keep_checkpoints=10"]
    recorder = Recorder()
    model_dir = tmp_path / "run"
    result = loop.train_and_evaluate(
        runs.small_config(tmp_path, *sets, train_steps=10), str(model_dir), actions=[recorder]
    )
    # A call ends at 3 (3 steps), 4 (evaluation), 5 (checkpoint), 6 (record),
    # 8 (evaluation), 9 (record) and 10 (the end).
    assert recorder.steps() == [3, 4, 5, 6, 8, 9, 10]
    assert recorder.steps(lambda b: b.record is not None) == [3, 6, 9, 10]
    assert recorder.steps(lambda b: b.evaluation is not None) == [4, 8, 10]
    # Saved at every evaluation and every 5 steps.
    assert recorder.steps(lambda b: b.saved) == [4, 5, 8, 10]
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [4, 5, 8, 10]
    records = read_records(model_dir)
    assert [r["step"] for r in records if "accuracy" in r] == [3, 6, 9, 10]
    assert [r["step"] for r in records if "top1" in r] == [4, 8, 10]
    assert result.summary["step"] == 10 and result.stopped is None
    # Each boundary saw the rates of its call's steps: 10 steps in all.
    assert sum(len(b.rates) for b in recorder.boundaries) == 10


class AskToSaveAt(Action):
    """Asks for a save at one step (as a keep-best action would when top-1 improves)."""

    def __init__(self, step):
        self.step = step
        self.saved = []

    def __call__(self, boundary):
        if boundary.step == self.step:
            boundary.request_save()

    def after(self, boundary):
        if boundary.saved:
            self.saved.append(boundary.step)


def test_an_extra_action_asks_for_a_save_the_checkpointer_makes(tmp_path):
    """Evaluations every 2 steps, checkpoints only at 6: the save asked for at 4 is made too.

    The evaluator asks for a save at every evaluation itself: an action
    before the one under test drops those requests, so that without the
    extra action's request only step 6 would be saved.
    """
    sets = ["train.log_every=2", "train.eval_every=2", "train.checkpoint_every=6"]
    sets += ["train.keep_checkpoints=10"]
    model_dir = tmp_path / "run"
    asker = AskToSaveAt(4)
    config = runs.small_config(tmp_path, *sets, train_steps=6)
    loop.train_and_evaluate(config, str(model_dir), actions=[ForgetSaveRequests(), asker])
    saved = [s for s, _ in checkpoint.list_checkpoints(str(model_dir))]
    assert saved == asker.saved == [4, 6]


class ForgetSaveRequests(Action):
    """Drops the save requests made before it (the evaluator's)."""

    def __call__(self, boundary):
        boundary.save_requested = False


def test_an_action_stops_the_run_which_saves_and_then_resumes(tmp_path):
    sets = ["train.log_every=2", "train.eval_every=100"]
    model_dir = tmp_path / "run"
    recorder = Recorder(stop_at=3)
    config = runs.small_config(tmp_path, *sets, train_steps=8, steps_per_loop=1)
    result = loop.train_and_evaluate(config, str(model_dir), actions=[recorder])
    assert result.stopped == "early stop" and result.summary == {"step": 3, "stopped": "early stop"}
    # The stop is a boundary of its own: step 3's record and a save.
    assert recorder.steps() == [1, 2, 3, 3]
    stop = recorder.boundaries[-1]
    assert stop.stopping == "early stop" and stop.saved and stop.record["step"] == 3
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [3]
    records = read_records(model_dir)
    assert [r["step"] for r in records if "accuracy" in r] == [2, 3]
    assert [r for r in records if r.get("event") == "stopped"] == [
        {"step": 3, "event": "stopped", "signal": "early stop"}
    ]
    resumed = loop.train_and_evaluate(config, str(model_dir))
    assert resumed.stopped is None and resumed.summary["step"] == 8


def test_one_statistics_sync_and_one_finite_check_per_evaluated_step(tmp_path, monkeypatch):
    """Two towers with per-tower BatchNorm, evaluated and saved at steps 2 and 4: the
    moving statistics are all-reduced once and the weights checked once at each (the
    evaluation and the save share them; the old loop did each three times)."""
    syncs, checks = [], []
    create_sync = distribute.moving_statistics_sync

    def counting_sync(model, strategy):
        sync = create_sync(model, strategy)
        return lambda: syncs.append(1) or sync()

    finite = checkpoint.RunCheckpoint.finite
    monkeypatch.setattr(distribute, "moving_statistics_sync", counting_sync)
    monkeypatch.setattr(
        checkpoint.RunCheckpoint, "finite", lambda self: checks.append(1) or finite(self)
    )
    recorder = Recorder()
    config = runs.small_config(
        tmp_path, "train.eval_every=2", "train.log_every=2", train_steps=4, num_towers=2
    )
    loop.train_and_evaluate(config, str(tmp_path / "run"), actions=[recorder])
    evaluated = recorder.steps(lambda b: b.evaluation is not None)
    assert evaluated == recorder.steps(lambda b: b.saved) == [2, 4]
    assert len(syncs) == len(checks) == len(evaluated)


def test_non_finite_starting_weights_with_rollback_are_a_one_line_error(tmp_path, monkeypatch):
    """The first save (something to roll back to) finds NaN weights: a ConfigError, not a
    traceback, and no checkpoint."""
    create = factory.create_run_model

    def nan_model(*args, **kwargs):
        model = create(*args, **kwargs)
        kernel = model.stem_conv.kernel
        kernel.assign(np.full(kernel.shape, np.nan, np.float32))
        return model

    monkeypatch.setattr(factory, "create_run_model", nan_model)
    model_dir = tmp_path / "run"
    config = runs.small_config(tmp_path, "train.on_nan=rollback", train_steps=2)
    with pytest.raises(ConfigError, match=r"diverged at step 0 after 0 rollback\(s\)"):
        loop.train_and_evaluate(config, str(model_dir))
    assert checkpoint.list_checkpoints(str(model_dir)) == []
