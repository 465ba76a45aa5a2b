"""Tests for the learning-rate schedules (`config/schedule_kinds.py`, `engine/schedules.py`):
learning rates against hand-computed values.

Every expected number is written out by hand or from a closed form computed
here independently (e.g. `math.sqrt(2) / 2` for cos(pi / 4)), never from the
schedules' own output. No TensorFlow is needed.
"""

from __future__ import annotations

import math
import pathlib
import re
import sys

import pytest

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.engine import schedules


def approx(value: float):
    return pytest.approx(value, rel=1e-12, abs=1e-15)


def create(spec, base_lr=0.1, global_batch_size=256, total_steps=1000):
    return schedules.create_schedule(
        spec, base_lr=base_lr, global_batch_size=global_batch_size, total_steps=total_steps
    )


def write_script(tmp_path: pathlib.Path, source: str, name: str = "user_schedule.py") -> str:
    path = tmp_path / name
    path.write_text(source)
    return str(path)


# --- The published recipes -------------------------------------------------------------


def test_cifar_recipe_he_2015():
    # 0.1, divided by 10 at 32k and 48k iterations, 64k in all, batch 128.
    schedule = create(
        {"name": "piecewise", "boundaries": [32000, 48000], "multipliers": [1, 0.1, 0.01]},
        base_lr=0.1,
        global_batch_size=128,
        total_steps=64000,
    )
    expected = {0: 0.1, 31999: 0.1, 32000: 0.01, 47999: 0.01, 48000: 0.001, 63999: 0.001}
    for step, lr in expected.items():
        assert schedule(step, 391) == approx(lr), step
    assert schedules.check_schedule(schedule, 391, 64000)[63999] == approx(0.001)


def test_imagenet_recipe_goyal_2017():
    # 0.1 per 256 examples at batch 1024 is 0.4; 5 warmup epochs of 1251 steps
    # are 6255 steps; /10 at epochs 30, 60, 80 (steps 37530, 75060, 100080).
    schedule = create(
        {
            "name": "piecewise",
            "boundaries": [30, 60, 80],
            "unit": "epochs",
            "multipliers": [1, 0.1, 0.01, 0.001],
            "warmup_epochs": 5,
            "batch_scaling": 256,
        },
        base_lr=0.1,
        global_batch_size=1024,
        total_steps=90 * 1251,
    )
    expected = {
        0: 0.4 * 1 / 6255,
        1: 0.4 * 2 / 6255,
        3127: 0.4 * 3128 / 6255,
        6254: 0.4,
        6255: 0.4,
        37529: 0.4,
        37530: 0.04,
        75059: 0.04,
        75060: 0.004,
        100079: 0.004,
        100080: 0.0004,
        112589: 0.0004,
    }
    for step, lr in expected.items():
        assert schedule(step, 1251) == approx(lr), step
    assert schedule(0, 1251) == approx(6.394884092725819e-05)


# --- The kinds' curves -----------------------------------------------------------------


def test_constant():
    schedule = create({"name": "constant"}, base_lr=0.25)
    assert schedule(0, 10) == 0.25
    assert schedule(10**9, 10) == 0.25
    assert type(schedule(3, 10)) is float


@pytest.mark.parametrize(
    "step, expected", [(0, 1.0), (9, 1.0), (10, 0.5), (19, 0.5), (20, 0.25), (10**6, 0.25)]
)
def test_piecewise_values_in_steps(step, expected):
    schedule = create({"name": "piecewise", "boundaries": [10, 20], "values": [1.0, 0.5, 0.25]})
    assert schedule(step, 7) == expected


def test_piecewise_multipliers_of_base():
    schedule = create({"name": "piecewise", "boundaries": [10], "multipliers": [1, 0.1]}, 0.5)
    assert schedule(9, 7) == approx(0.5)
    assert schedule(10, 7) == approx(0.05)


EPOCHS = {"name": "piecewise", "unit": "epochs"}


def test_piecewise_epochs_use_steps_per_epoch_at_call_time():
    schedule = create(dict(EPOCHS, boundaries=[2, 3.5], values=[3.0, 2.0, 1.0]))
    # 10 steps per epoch: boundaries at steps 20 and 35.
    assert [schedule(step, 10) for step in (19, 20, 34, 35)] == [3.0, 2.0, 2.0, 1.0]
    # 100 steps per epoch: boundaries at steps 200 and 350.
    assert [schedule(step, 100) for step in (199, 200, 349, 350)] == [3.0, 2.0, 2.0, 1.0]


def test_piecewise_fractional_epoch_boundary_is_rounded():
    # 1/3 epoch of 10 steps is 3.33 steps: rounded, step 3.
    schedule = create(dict(EPOCHS, boundaries=[1 / 3], values=[1.0, 0.5]))
    assert schedule(2, 10) == 1.0
    assert schedule(3, 10) == 0.5
    # 0.26 epoch of 10 steps is 2.6 steps: rounded, step 3 (truncating would give 2).
    schedule = create(dict(EPOCHS, boundaries=[0.26], values=[1.0, 0.5]))
    assert schedule(2, 10) == 1.0
    assert schedule(3, 10) == 0.5


def test_warmup_ramps_linearly_to_the_target():
    schedule = create({"warmup_steps": 4}, 1.0)
    assert [schedule(step, 100) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_warmup_from_a_start_value():
    schedule = create({"warmup_steps": 4, "warmup_start": 0.2}, 1.0)
    # 0.2 + 0.8 * (step + 1) / 4
    expected = [0.4, 0.6, 0.8, 1.0, 1.0]
    assert [schedule(step, 100) for step in range(5)] == pytest.approx(expected)


def test_warmup_in_epochs():
    # Half an epoch of 8 steps: 4 warmup steps.
    schedule = create({"warmup_epochs": 0.5}, 2.0)
    assert [schedule(step, 8) for step in range(5)] == [0.5, 1.0, 1.5, 2.0, 2.0]


def test_warmup_epochs_round_to_whole_steps():
    # 0.3 epoch of 9 steps is 2.7 steps: rounded, 3 (truncating would give 2).
    schedule = create({"warmup_epochs": 0.3}, 3.0)
    assert [schedule(step, 9) for step in range(4)] == [1.0, 2.0, 3.0, 3.0]
    # 0.01 epoch of 10 steps rounds to 0 steps: a warmup lasts at least 1 step.
    schedule = create({"warmup_epochs": 0.01}, 3.0)
    assert schedule(0, 10) == 3.0


def test_warmup_targets_the_value_at_the_end_of_the_warmup():
    # The wrapped schedule is 1.0 before step 4 and 3.0 from step 4 on, where
    # the 4-step warmup ends: the ramp climbs to 3.0, not to 1.0.
    schedule = create({"name": "piecewise", "boundaries": [4], "values": [1, 3], "warmup_steps": 4})
    assert [schedule(step, 100) for step in range(6)] == [0.75, 1.5, 2.25, 3.0, 3.0, 3.0]


def test_cosine_against_closed_form():
    schedule = create({"name": "cosine", "total_steps": 100, "final": 0.001}, 0.1)
    for step in (0, 1, 17, 50, 99, 100):
        expected = 0.001 + 0.5 * (0.1 - 0.001) * (1 + math.cos(math.pi * step / 100))
        assert schedule(step, 10) == approx(expected), step
    # Hand values: the start, a quarter (cos(pi/4) = sqrt(2)/2), the middle, the end.
    assert schedule(0, 10) == approx(0.1)
    assert schedule(25, 10) == approx(0.001 + 0.0495 * (1 + math.sqrt(2) / 2))
    assert schedule(50, 10) == approx(0.0505)
    assert schedule(100, 10) == approx(0.001)
    assert schedule(150, 10) == approx(0.001)


def test_linear_after_a_warmup_is_pages_one_cycle_triangle():
    """Page 2018: 0 to 0.4 over 5 epochs, then to 0 at epoch 24 (np.interp of his knots)."""
    import numpy as np

    spec = {"name": "linear", "warmup_epochs": 5}
    steps_per_epoch, total = 100, 2400
    schedule = schedules.create_schedule(
        spec, base_lr=0.4, global_batch_size=512, total_steps=total
    )
    for step in (0, 1, 250, 499, 500, 501, 1200, 2399, 2400, 3000):
        # The warmup ends on its target at step W - 1 (see `warmup`): knots shifted by 1.
        epoch = (step + 1) / steps_per_epoch if step < 500 else step / steps_per_epoch
        expected = np.interp(epoch, [0, 5, 24], [0, 0.4, 0])
        assert schedule(step, steps_per_epoch) == pytest.approx(expected, abs=1e-12), step
    plain = create({"name": "linear", "final": 0.02}, 0.1, total_steps=10)
    assert [plain(s, 5) for s in (0, 5, 10, 20)] == approx([0.1, 0.06, 0.02, 0.02])


def test_cosine_in_epochs():
    schedule = create({"name": "cosine", "total_epochs": 2}, 0.1)
    # 2 epochs of 50 steps: the middle is step 50, the end step 100.
    assert schedule(50, 50) == approx(0.05)
    assert schedule(100, 50) == approx(0.0)
    assert schedule(25, 50) == approx(0.05 * (1 + math.sqrt(2) / 2))


@pytest.mark.parametrize(
    "step, smooth, staircase",
    [
        (0, 1.0, 1.0),
        (5, 1 / math.sqrt(2), 1.0),
        (9, 0.5**0.9, 1.0),
        (10, 0.5, 0.5),
        (25, 0.25 / math.sqrt(2), 0.25),
    ],
)
def test_exponential_smooth_and_staircase(step, smooth, staircase):
    assert create(HALVING, 1.0)(step, 3) == approx(smooth)
    assert create(dict(HALVING, staircase=True), 1.0)(step, 3) == approx(staircase)
    # 2 epochs of 5 steps: the same period of 10 steps.
    by_epochs = {"name": "exponential", "decay_rate": 0.5, "decay_epochs": 2}
    assert create(by_epochs, 2.0)(step, 5) == approx(2 * smooth)


HALVING = {"name": "exponential", "decay_rate": 0.5, "decay_steps": 10}


def test_linear_scaling():
    # Goyal et al.: the rate grows with the batch, base_lr * global batch / reference.
    assert create({"batch_scaling": 64}, 0.1, global_batch_size=256)(0, 1) == approx(0.4)
    assert create({"batch_scaling": 256}, 0.1, global_batch_size=1024)(0, 1) == approx(0.4)
    assert create({"batch_scaling": 256}, 0.1, global_batch_size=128)(0, 1) == approx(0.05)
    assert create({"batch_scaling": 512}, 0.1, global_batch_size=1024)(0, 1) == approx(0.2)


def test_numpy_like_steps_give_python_floats():
    class Step(int):
        """An int subclass standing in for a numpy integer."""

    for spec in ({"warmup_steps": 4}, HALVING, {"name": "cosine", "total_steps": 10}):
        schedule = create(spec, 1.0)
        assert type(schedule(Step(2), 5)) is float


# --- create_schedule -------------------------------------------------------------------


def test_default_is_the_constant_base_lr():
    assert create(None, base_lr=0.3)(500, 10) == 0.3
    assert create({}, base_lr=0.3)(500, 10) == 0.3
    # Without batch_scaling the batch size does not matter.
    assert create({"name": "constant"}, base_lr=0.3, global_batch_size=4096)(0, 10) == 0.3


def test_batch_scaling_scales_base_and_absolute_values():
    # Batch 512 against a reference of 256: every rate doubles.
    assert create({"batch_scaling": 256}, global_batch_size=512)(0, 10) == approx(0.2)
    schedule = create(
        {"name": "piecewise", "boundaries": [10], "values": [0.1, 0.01], "batch_scaling": 256},
        global_batch_size=512,
    )
    assert schedule(9, 10) == approx(0.2)
    assert schedule(10, 10) == approx(0.02)
    schedule = create(
        {"name": "cosine", "final": 0.01, "batch_scaling": 256},
        base_lr=0.1,
        global_batch_size=512,
        total_steps=100,
    )
    assert schedule(0, 10) == approx(0.2)
    assert schedule(50, 10) == approx(0.11)
    assert schedule(100, 10) == approx(0.02)


def test_piecewise_values_ignore_base_lr():
    schedule = create({"name": "piecewise", "boundaries": [10], "values": [0.3, 0.03]}, base_lr=0.1)
    assert schedule(0, 10) == 0.3
    assert schedule(10, 10) == 0.03


def test_cosine_spans_the_run_unless_told_otherwise():
    schedule = create({"name": "cosine"}, base_lr=0.1, total_steps=200)
    assert schedule(100, 10) == approx(0.05)
    assert schedule(200, 10) == approx(0.0)
    schedule = create({"name": "cosine", "total_steps": 100}, base_lr=0.1, total_steps=200)
    assert schedule(50, 10) == approx(0.05)
    schedule = create({"name": "cosine", "total_epochs": 4}, base_lr=0.1, total_steps=200)
    assert schedule(20, 10) == approx(0.05)  # 4 epochs of 10 steps: the middle is step 20.


def test_cosine_with_warmup_targets_the_cosine_at_the_end_of_warmup():
    schedule = create({"name": "cosine", "warmup_steps": 100}, base_lr=0.1, total_steps=1000)
    at_100 = 0.05 * (1 + math.cos(math.pi * 100 / 1000))
    assert schedule(0, 10) == approx(at_100 / 100)
    assert schedule(99, 10) == approx(at_100)
    assert schedule(100, 10) == approx(at_100)
    assert schedule(101, 10) == approx(0.05 * (1 + math.cos(math.pi * 101 / 1000)))


def test_exponential_from_a_spec():
    schedule = create(
        {"name": "exponential", "decay_rate": 0.5, "decay_epochs": 1, "staircase": True},
        base_lr=0.8,
    )
    assert schedule(9, 10) == approx(0.8)
    assert schedule(10, 10) == approx(0.4)
    assert schedule(25, 10) == approx(0.2)


def test_null_keys_count_as_absent():
    schedule = create({"name": "constant", "warmup_steps": None, "batch_scaling": None})
    assert schedule(0, 10) == 0.1


def test_script_from_a_spec(tmp_path):
    path = write_script(tmp_path, "def lr(step, steps_per_epoch):\n    return 0.5 / (step + 1)\n")
    # The script's value is used as is: no base_lr, no batch scaling.
    schedule = create({"name": "script", "path": f"{path}:lr"}, base_lr=7.0)
    assert schedule(0, 10) == 0.5
    assert schedule(4, 10) == 0.1


PIECEWISE = {"name": "piecewise", "boundaries": [10, 20], "multipliers": [1, 0.1, 0.01]}
PIECEWISE_KEYS = (
    "batch_scaling, boundaries, multipliers, name, total_steps, unit, values, "
    "warmup_epochs, warmup_start, warmup_steps"
)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            {"name": "cosin"},
            "unknown schedule 'cosin'; valid schedules: "
            "constant, cosine, exponential, linear, piecewise, script",
        ),
        ({"name": ["piecewise"]}, "unknown schedule ['piecewise']"),
        ([("name", "cosine")], "the schedule section must be a mapping"),
        (
            {"name": "piecewise", "boundary": [10], "multipliers": [1, 0.1]},
            f"unknown schedule key 'boundary' for piecewise; valid keys: {PIECEWISE_KEYS}",
        ),
        (
            {"name": "script", "path": "x.py:f", "warmup_epochs": 5},
            "unknown schedule key 'warmup_epochs' for script; valid keys: name, path",
        ),
        (
            {"name": "constant", "final": 0.0},
            "unknown schedule key 'final' for constant; valid keys: "
            "batch_scaling, name, warmup_epochs, warmup_start, warmup_steps",
        ),
        (
            {"name": "piecewise", "multipliers": [1]},
            f"schedule piecewise needs key 'boundaries'; valid keys: {PIECEWISE_KEYS}",
        ),
        (
            {"name": "piecewise", "boundaries": [10]},
            "schedule piecewise needs key 'values' or 'multipliers'; valid keys: ",
        ),
        ({"name": "exponential", "decay_steps": 10}, "needs key 'decay_rate'"),
        (
            {"name": "exponential", "decay_rate": 0.5},
            "needs key 'decay_steps' or 'decay_epochs'",
        ),
        ({"name": "script"}, "schedule script needs key 'path'; valid keys: name, path"),
        ({"name": "script", "path": 3}, "schedule key 'path' must be PATH.py:FUNCTION"),
        (
            {"warmup_steps": 5, "warmup_epochs": 1},
            "schedule.warmup_steps and schedule.warmup_epochs exclude each other",
        ),
        (
            dict(PIECEWISE, values=[1, 2, 3]),
            "schedule.values and schedule.multipliers exclude each other",
        ),
        (
            {"name": "cosine", "total_steps": 10, "total_epochs": 1},
            "schedule.total_steps and schedule.total_epochs exclude each other",
        ),
        (
            {"name": "exponential", "decay_rate": 0.5, "decay_steps": 1, "decay_epochs": 1},
            "schedule.decay_steps and schedule.decay_epochs exclude each other",
        ),
        (
            dict(PIECEWISE, boundaries=[10, 10]),
            "schedule key 'boundaries' must be strictly increasing, got [10, 10]",
        ),
        (
            dict(PIECEWISE, boundaries=[20, 10]),
            "schedule key 'boundaries' must be strictly increasing",
        ),
        (dict(PIECEWISE, boundaries=[-1, 10]), "schedule key 'boundaries' must be a number >= 0"),
        (dict(PIECEWISE, boundaries=30), "schedule key 'boundaries' needs a list"),
        (
            dict(PIECEWISE, multipliers=[1, 0.1]),
            "schedule key 'multipliers' needs 3 entries (one more than 'boundaries'), got 2",
        ),
        (
            {"name": "piecewise", "boundaries": [10], "values": [0.1, 0.01, 0.001]},
            "schedule key 'values' needs 2 entries",
        ),
        (
            {"name": "piecewise", "boundaries": [10], "values": [0.1, -0.01]},
            "schedule key 'values' needs numbers >= 0, got -0.01",
        ),
        (
            dict(PIECEWISE, multipliers=[1, "0.1", 0.01]),
            "schedule key 'multipliers' needs numbers >= 0, got '0.1'",
        ),
        (
            dict(PIECEWISE, unit="iterations"),
            "schedule key 'unit' must be steps, epochs or fraction",
        ),
        (
            dict(PIECEWISE, total_steps=100),
            "schedule key 'total_steps' is for boundaries in fractions",
        ),
        (
            {"name": "exponential", "decay_rate": 0, "decay_steps": 10},
            "schedule key 'decay_rate' must be a number > 0, got 0",
        ),
        (
            {"name": "exponential", "decay_rate": -0.5, "decay_steps": 10},
            "schedule key 'decay_rate' must be a number > 0",
        ),
        (
            {"name": "exponential", "decay_rate": 0.5, "decay_epochs": 0},
            "schedule key 'decay_epochs' must be a number > 0",
        ),
        (
            {"name": "exponential", "decay_rate": 0.5, "decay_steps": 1, "staircase": "yes"},
            "schedule key 'staircase' must be true or false",
        ),
        ({"warmup_steps": 0}, "schedule key 'warmup_steps' must be a whole number >= 1, got 0"),
        ({"warmup_steps": 2.5}, "schedule key 'warmup_steps' must be a whole number >= 1"),
        ({"warmup_epochs": -1}, "schedule key 'warmup_epochs' must be a number > 0, got -1"),
        ({"name": "cosine", "final": -0.1}, "schedule key 'final' must be a number >= 0"),
        ({"name": "cosine", "total_steps": 0}, "schedule key 'total_steps' must be a whole"),
        ({"name": "cosine", "total_epochs": 0}, "schedule key 'total_epochs' must be a number"),
        ({"warmup_steps": 2, "warmup_start": -1}, "key 'warmup_start' must be a number >= 0"),
        ({"warmup_start": 0.01}, "schedule key 'warmup_start' needs warmup_steps or warmup_epochs"),
        ({"batch_scaling": 0}, "schedule key 'batch_scaling' must be the batch size"),
        ({"batch_scaling": True}, "schedule key 'batch_scaling' must be the batch size"),
    ],
)
def test_create_schedule_rejects(spec, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        create(spec)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "setting, message",
    [
        (
            "optimizer.learning_rate=-0.1",
            "argument 'learning_rate' must be a number >= 0, got -0.1",
        ),
        ("optimizer.learning_rate=.nan", "argument 'learning_rate' must be a number >= 0"),
        ("train.batch_size=0", "train.batch_size must be a whole number >= 1"),
        ("train.train_steps=0", "train.train_steps must be a whole number >= 1"),
    ],
)
def test_the_config_checks_what_a_schedule_is_built_from(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.resolve(sets=[setting])


# --- A new kind: its dataclass and its registration, nothing else ----------------------


def test_a_new_kind_takes_its_dataclass_and_registration_only(monkeypatch):
    """A kind declared here (keys, checks and curve in one dataclass, registered by its
    `kind=`) is read, checked, built and documented from a config, with no other edit."""
    import dataclasses

    from resnet_app.common.fields import AT_LEAST_1, setting
    from resnet_app.config import reference, schedule_kinds
    from resnet_app.engine.plan import plan_run

    # A copy of the registry, restored after the test: no other test sees the toy kind.
    family = schedule_kinds.ScheduleSection
    monkeypatch.setattr(family, "KINDS", dict(family.KINDS))

    @dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
    class InverseTime(schedule_kinds.RateSchedule, kind="inverse_time"):
        """Inverse-time decay: the learning rate over 1 + step / half_life.

        Attributes:
          half_life: the step the rate halves at.
        """

        half_life: int = setting(rule=AT_LEAST_1)

        def rate(self, step, steps_per_epoch, base_lr, total_steps):
            return base_lr / (1 + step / self.half_life)

    with pytest.raises(ConfigError, match=re.escape("schedule inverse_time needs key 'half_life'")):
        create({"name": "inverse_time"})
    message = "schedule key 'half_life' must be a whole number >= 1, got 0"
    with pytest.raises(ConfigError, match=re.escape(message)):
        create({"name": "inverse_time", "half_life": 0})
    with pytest.raises(ConfigError, match=re.escape("schedule key 'warmup_steps' must be")):
        create({"name": "inverse_time", "half_life": 10, "warmup_steps": -1})

    # The shared keys apply as to every kind: batch 256 over 128 doubles the rate,
    # and the 10-step warmup climbs to the curve's value at step 10, 0.2 / 1.1.
    spec = {"name": "inverse_time", "half_life": 100, "batch_scaling": 128, "warmup_steps": 10}
    schedule = create(spec, base_lr=0.1, global_batch_size=256)
    for step in (10, 11, 100, 300, 999):
        assert schedule(step, 7) == approx(0.2 / (1 + step / 100)), step
    assert schedule(0, 7) == approx(0.2 / 1.1 / 10)
    assert schedule(9, 7) == approx(0.2 / 1.1)
    assert schedules.check_schedule(schedule, 7, 1000)[999] == approx(0.2 / 10.99)

    assert "inverse_time" in str(pytest.raises(ConfigError, create, {"name": "nope"}).value)
    resolved = config.resolve(sets=["schedule.name=inverse_time", "schedule.half_life=100"])
    assert plan_run(resolved, 50_000).schedule(100, 390) == approx(0.05)  # The default 0.1.
    documented = reference.markdown()  # docs/config.md's text, from the registry.
    assert "### `name: inverse_time`" in documented and "| `schedule.half_life` |" in documented


# --- User scripts ----------------------------------------------------------------------


def test_load_script_good_function(tmp_path):
    path = write_script(
        tmp_path,
        "import decimal\n"
        "def helper():\n"
        "    pass\n"
        "def lr(step, steps_per_epoch):\n"
        "    return decimal.Decimal(step) / steps_per_epoch\n",
    )
    schedule = schedules.load_script(f"{path}:lr")
    # A Decimal comes back as a Python float.
    assert schedule(5, 10) == 0.5
    assert type(schedule(5, 10)) is float
    assert schedule.__name__ == "lr"
    assert not any(name.startswith("_lr_schedule_") for name in sys.modules)


@pytest.mark.parametrize("spec", ["my_schedule.py", "one_cycle.py:", ":one_cycle", 3])
def test_load_script_needs_a_colon(spec):
    with pytest.raises(ConfigError, match=re.escape("needs PATH.py:FUNCTION")):
        schedules.load_script(spec)


def test_load_script_missing_file(tmp_path):
    path = tmp_path / "absent.py"
    with pytest.raises(ConfigError, match=re.escape(f"schedule script {path} not found")):
        schedules.load_script(f"{path}:lr")


def test_load_script_missing_function_lists_the_defined_callables(tmp_path):
    path = write_script(
        tmp_path,
        "from math import floor\n"
        "RATE = 0.1\n"
        "def warm(step, steps_per_epoch):\n"
        "    return RATE\n"
        "def cool(step, steps_per_epoch):\n"
        "    return RATE\n"
        "def _private():\n"
        "    pass\n",
    )
    # `floor` is imported, not defined there; `_private` is private.
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"schedule script {path} defines no 'lr'; callables defined there: cool, warm"
        )
        + "$",
    ):
        schedules.load_script(f"{path}:lr")


def test_load_script_not_callable(tmp_path):
    path = write_script(tmp_path, "lr = 0.1\n")
    with pytest.raises(ConfigError, match=re.escape("'lr' in schedule script") + ".* is a float"):
        schedules.load_script(f"{path}:lr")


def test_load_script_syntax_error(tmp_path):
    path = write_script(tmp_path, "def lr(step, steps_per_epoch)\n    return 0.1\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path} failed on import: SyntaxError")) as e:
        schedules.load_script(f"{path}:lr")
    assert "\n" not in str(e.value)


def test_load_script_raising_on_import(tmp_path):
    path = write_script(tmp_path, "raise RuntimeError('no GPU\\nfound')\n")
    with pytest.raises(
        ConfigError, match=re.escape(f"{path} failed on import: RuntimeError: no GPU found") + "$"
    ):
        schedules.load_script(f"{path}:lr")


def test_load_script_not_a_python_file(tmp_path):
    path = write_script(tmp_path, "def lr(step, steps_per_epoch):\n    return 0.1\n", "lr.txt")
    with pytest.raises(ConfigError, match="is not a Python file"):
        schedules.load_script(f"{path}:lr")


@pytest.mark.parametrize(
    "body, message",
    [
        # Breaks only at the last step, which check_schedule must try.
        (
            "    if step == 999:\n        raise ValueError('too far')\n    return 0.1",
            "raised at step 999: ValueError: too far",
        ),
        ("    return float('nan')", "returned nan at step 0"),
        ("    return float('inf') if step == 1 else 0.1", "returned inf at step 1"),
        ("    return -0.1 if step >= 10 else 0.1", "returned -0.1 at step 10"),
        ("    return '0.1'", "returned '0.1' at step 0"),
        ("    return None", "returned None at step 0"),
        ("    return [0.1]", "returned a list at step 0"),
    ],
)
def test_check_schedule_catches_a_bad_script(tmp_path, body, message):
    path = write_script(tmp_path, f"def lr(step, steps_per_epoch):\n{body}\n")
    schedule = schedules.load_script(f"{path}:lr")
    with pytest.raises(ConfigError, match=re.escape(message)):
        schedules.check_schedule(schedule, steps_per_epoch=10, total_steps=1000)


def test_check_schedule_catches_a_wrong_signature(tmp_path):
    path = write_script(tmp_path, "def lr(step):\n    return 0.1\n")
    schedule = schedules.load_script(f"{path}:lr")
    with pytest.raises(ConfigError, match="raised at step 0: TypeError"):
        schedules.check_schedule(schedule, steps_per_epoch=10, total_steps=1000)


def test_check_schedule_on_a_plain_callable():
    with pytest.raises(ConfigError, match=re.escape("returned nan at step 0")):
        schedules.check_schedule(lambda step, steps_per_epoch: math.nan, 10, 100)
    with pytest.raises(ConfigError, match="raised at step 1: ZeroDivisionError"):
        schedules.check_schedule(lambda step, steps_per_epoch: 1 / (1 - step), 10, 100)
    with pytest.raises(ConfigError, match="steps_per_epoch must be a whole number >= 1"):
        schedules.check_schedule(lambda step, steps_per_epoch: 0.1, 0, 100)
    with pytest.raises(ConfigError, match="the run's total_steps must be a whole number >= 1"):
        schedules.check_schedule(lambda step, steps_per_epoch: 0.1, 10, 0)
    # Ranges are checked once, by the config; a curve computes what it is given.
    with pytest.raises(ConfigError, match=re.escape("returned -0.2 at step 0")):
        schedules.check_schedule(lambda step, steps_per_epoch: -0.2, 10, 100)


def test_check_schedule_tries_the_first_and_last_steps():
    seen = []

    def schedule(step, steps_per_epoch):
        seen.append(step)
        return 0.1

    rates = schedules.check_schedule(schedule, steps_per_epoch=10, total_steps=1000)
    assert {0, 1, 9, 10, 500, 999} <= set(rates)
    assert max(seen) == 999
    assert set(rates.values()) == {0.1}


@pytest.mark.parametrize(
    "content",
    [
        "x0.5".encode("utf-16"),  # Notepad's "Unicode": UTF-16 with its BOM.
        "\ufeffx0.5\r\n".encode(),  # UTF-8 with a BOM, Windows line end.
        b"x0.5\n",
    ],
)
def test_an_lr_override_in_any_common_encoding_applies(tmp_path, content):
    from resnet_app.engine.learning_rate import LearningRate

    rate = LearningRate(lambda step, steps_per_epoch: 0.1, steps_per_epoch=10)
    (tmp_path / "lr_override").write_bytes(content)
    assert rate.apply_override(str(tmp_path)) == "multiplier 0.5 (now x0.5)"
    assert rate.rates(0, 2) == pytest.approx([0.05, 0.05])
    assert (tmp_path / "lr_override.applied").exists()


def test_an_unreadable_lr_override_is_one_error_line_and_training_goes_on(tmp_path, caplog):
    from resnet_app.engine.learning_rate import LearningRate

    rate = LearningRate(lambda step, steps_per_epoch: 0.1, steps_per_epoch=10)
    (tmp_path / "lr_override").write_bytes(b"\xfd\xfc not text")  # Neither UTF-8 nor a BOM.
    assert rate.apply_override(str(tmp_path)) is None
    (error,) = [r.getMessage() for r in caplog.records if "lr_override" in r.getMessage()]
    assert "cannot be read as text (UnicodeDecodeError" in error and "x0.1" in error
    assert rate.rates(0, 1) == pytest.approx([0.1])  # The schedule's, untouched.
    assert rate.apply_override(str(tmp_path)) is None  # Consumed: reported once.
    (tmp_path / "lr_override").mkdir()  # Unreadable: a directory.
    assert rate.apply_override(str(tmp_path)) is None


def test_an_lr_override_that_cannot_be_consumed_is_not_applied_again_and_again(
    tmp_path, caplog, monkeypatch
):
    """A multiplier read at every interval would compound: one that cannot be renamed
    away is not applied, and reported once."""
    import os

    from resnet_app.engine.learning_rate import LearningRate

    def refused(source, destination):
        raise PermissionError(13, "Permission denied", destination)

    rate = LearningRate(lambda step, steps_per_epoch: 0.1, steps_per_epoch=10)
    (tmp_path / "lr_override").write_text("x0.5")
    monkeypatch.setattr(os, "replace", refused)
    for _ in range(3):
        assert rate.apply_override(str(tmp_path)) is None
    assert rate.rates(0, 1) == pytest.approx([0.1])
    errors = [r.getMessage() for r in caplog.records if "lr_override" in r.getMessage()]
    assert len(errors) == 1 and "cannot be renamed to lr_override.applied" in errors[0]
    monkeypatch.undo()
    assert rate.apply_override(str(tmp_path)) == "multiplier 0.5 (now x0.5)"
