"""Progressive resizing: the size schedule (a pure function), the pipeline at each size,
one compiled loop per size, and exact resume across a size change."""

import subprocess
import sys

import numpy as np
import pytest

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.data import progressive
from resnet_app.data.settings import ProgressiveSettings
from tests import runs
from tests.commands import REPO


def ffcv_resolution(epoch, start_ramp, end_ramp, min_res, max_res):
    """FFCV's `get_resolution` (train_imagenet.py), written out with NumPy."""
    if epoch <= start_ramp:
        return min_res
    if epoch >= end_ramp:
        return max_res
    interp = np.interp([epoch], [start_ramp, end_ramp], [min_res, max_res])
    return int(np.round(interp[0] / 32)) * 32


@pytest.mark.parametrize("ramp", [(65, 76, 160, 192), (11, 13, 160, 192), (2, 30, 128, 288)])
def test_the_ramp_is_ffcvs_rule(ramp):
    start_epoch, end_epoch, low, high = ramp
    settings = ProgressiveSettings(
        start_size=low, end_size=high, start_epoch=start_epoch, end_epoch=end_epoch
    )
    for epoch in range(90):
        expected = ffcv_resolution(epoch, *ramp)
        assert progressive.size_at_epoch(settings, epoch, 224) == expected, epoch


def test_small_images_round_to_8_and_the_end_defaults_to_the_image_size():
    settings = ProgressiveSettings(start_size=16, end_epoch=4)
    sizes = [progressive.size_at_epoch(settings, epoch, 32) for epoch in range(6)]
    # 16 + 16 * e / 4 = 16, 20, 24, 28, 32 -> nearest multiple of 8, ties to even.
    assert sizes == [16, 16, 24, 32, 32, 32]
    assert progressive.rounding(settings, 224) == 32


def test_the_list_form_holds_each_size_from_its_epoch():
    settings = ProgressiveSettings(sizes=(128, 224, 288), epochs=(0, 14, 26))
    expected = [128] * 14 + [224] * 12 + [288] * 4
    assert [progressive.size_at_epoch(settings, e, 224) for e in range(30)] == expected
    assert progressive.size_at_epoch(ProgressiveSettings(), 7, 224) == 224  # Off.


@pytest.mark.parametrize("batch, examples", [(16, 64), (128, 1000), (7, 50)])
def test_every_step_trains_at_its_first_examples_epoch(batch, examples):
    settings = ProgressiveSettings(sizes=(16, 24, 32), epochs=(0, 1, 3))
    total = 6 * examples // batch
    schedule = progressive.size_schedule(settings, 32, batch, examples, total)
    for step in range(total):
        epoch = (step * batch) // examples  # The epoch of the step's first example.
        want = 16 if epoch < 1 else 24 if epoch < 3 else 32
        assert schedule.size_at(step) == want, step
        change = schedule.next_change(step)
        later = [s for s in range(step + 1, total) if schedule.size_at(s) != want]
        assert change == (later[0] if later else None)
    assert schedule.sizes == (16, 24, 32)


@pytest.mark.parametrize("second", [0.4, 0.05, 0.333])
def test_the_list_forms_epochs_may_be_fractions(second):
    # A one-epoch run that changes size mid-way: a step trains at 24 px once its first
    # example's epoch, step * batch / examples, reaches `second` (compared in integers).
    batch, examples, total = 32, 50_000, 1560
    settings = ProgressiveSettings(sizes=(16, 24), epochs=(0, second))
    schedule = progressive.size_schedule(settings, 24, batch, examples, total)
    numerator, denominator = round(second * 1000), 1000
    for step in range(total):
        later = step * batch * denominator >= numerator * examples
        assert schedule.size_at(step) == (24 if later else 16), step
    assert schedule.sizes == (16, 24) and schedule.epochs == (0.0, second)


def test_a_ramp_that_never_changes_within_the_run_is_refused():
    # FFCV's ramp reads whole epochs: over a one-epoch run it would train at 16 px
    # throughout and evaluate at 24.
    ramp = ProgressiveSettings(start_size=16, end_epoch=0.8)
    with pytest.raises(ConfigError, match="would train at 16 px throughout"):
        progressive.size_schedule(ramp, 24, 32, 50_000, 1563)
    # Over more epochs it changes, and with the end size from the start it is allowed.
    assert progressive.size_schedule(ramp, 24, 32, 100, 9).sizes == (16, 24)
    assert progressive.size_schedule(ProgressiveSettings(), 24, 32, 50_000, 9).sizes == (24,)


def test_bad_schedules_are_refused_in_one_line():
    cases = [
        (dict(start_size=16), "a ramp needs 0 <= start_epoch < end_epoch"),
        (dict(start_size=16, end_epoch=2, sizes=(8,), epochs=(0,)), "give one"),
        (dict(sizes=(16, 24), epochs=(0,)), "one first epoch per size"),
        (dict(sizes=(16, 24), epochs=(1, 2)), "start at 0 and increase"),
        (
            dict(sizes=(4,), epochs=(0,)),
            "data.progressive.sizes must be a whole number >= 8, got 4",
        ),
        (dict(multiple=8), "set data.progressive.start_size too"),
    ]
    for keys, message in cases:
        with pytest.raises(ConfigError, match=message):
            ProgressiveSettings(**keys)
    with pytest.raises(ConfigError, match="data.progressive.start_size.*expected int"):
        config.resolve(sets=["data.progressive.start_size=big"])


def test_the_schedule_is_computed_without_tensorflow():
    code = (
        "import sys\n"
        "from resnet_app.data import progressive\n"
        "from resnet_app.data.settings import ProgressiveSettings\n"
        "s = progressive.size_schedule(ProgressiveSettings(start_size=16, end_epoch=4), 32,"
        " 16, 64, 40)\n"
        "assert 'tensorflow' not in sys.modules\n"
        "print(s.describe())\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip()
        == "16 px from epoch 0, 24 from epoch 2 (step 8), 32 from epoch 3 (step 12)"
    )


PROGRESSIVE = ["data.progressive.sizes=[16,24,32]", "data.progressive.epochs=[0,1,3]"]


def _build(tmp_path, name, *sets, **train):
    from resnet_app.engine import setup
    from tests import runs

    resolved = runs.small_config(tmp_path, *PROGRESSIVE, *sets, **train)
    return setup.build_run(resolved, str(tmp_path / name))


def _local_batches(run, size):
    """One step's batch at `size`, replica by replica, as NumPy."""
    batch = next(iter(run.train_dataset(size)))
    parts = run.strategy.experimental_local_results(batch)
    return [{key: value.numpy() for key, value in part.items()} for part in parts]


def test_towers_train_on_the_one_device_batch_at_every_size(tmp_path):
    """Two towers' halves put together are the one-device batch, at each size."""
    one = _build(tmp_path, "one", train_steps=14, num_towers=1)
    two = _build(tmp_path, "two", train_steps=14, num_towers=2)
    try:
        for size in (16, 24, 32):
            (whole,) = _local_batches(one, size)
            halves = _local_batches(two, size)
            assert len(halves) == 2
            assert whole["image"].shape == (16, size, size, 3)
            for key in ("id", "label", "image"):
                np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), whole[key])
        # The examples and their order do not depend on the size.
        (small,) = _local_batches(one, 16)
        (large,) = _local_batches(one, 32)
        np.testing.assert_array_equal(small["id"], large["id"])
    finally:
        one.close()
        two.close()


def test_each_size_is_traced_once_and_a_resumed_run_traces_only_those_ahead(tmp_path, monkeypatch):
    from resnet_app.engine import loop, step
    from tests import runs

    traced = []
    original = step.TrainStep.run_steps

    def recording(self, iterator, *args):
        traced.append(int(iterator.element_spec["image"].shape[1]))  # Runs once per trace.
        return original(self, iterator, *args)

    monkeypatch.setattr(step.TrainStep, "run_steps", recording)
    # Calls of 3, then 1 step (size change at step 4), 2, ... steps: one trace a size.
    sets = [*PROGRESSIVE, "train.log_every=3", "train.eval_every=100", "train.checkpoint_every=7"]
    model_dir = str(tmp_path / "run")
    loop.train_and_evaluate(runs.small_config(tmp_path, *sets, train_steps=7), model_dir)
    assert traced == [16, 24]
    traced.clear()
    loop.train_and_evaluate(runs.small_config(tmp_path, *sets, train_steps=14), model_dir)
    assert traced == [24, 32]  # Resumed at step 7: epoch 1's size, then 32 from step 12.


def test_a_kill_mid_ramp_resumes_bitwise_across_the_next_size_change(tmp_path):
    """Sizes 16, 24, 32 from steps 0, 4, 12; saved at 5, killed in 6-9; resumed to 14."""

    from tests.test_checkpoint import SMALL, kill_and_resume

    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", "--train_steps=14", "--deterministic"]
    args += ["--set=train.checkpoint_every=5", "--precision=auto"]
    args += [f"--set={key}" for key in PROGRESSIVE]
    stderr, _ = kill_and_resume(tmp_path, args, runs.fault_rng().randint(6, 9))
    assert "Resumed from step 5 (epoch 1, example 16 of 64)" in stderr
    assert "Progressive resizing: training at 32 px from step 12" in stderr
    assert "24 px from step" not in stderr  # Resumed inside 24 px's range: entered there.
    assert "train.precision=auto: " in stderr and ", as " in stderr
