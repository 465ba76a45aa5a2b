"""The default schedule fits the run: He et al.'s drops at 1/2 and 3/4 of any length."""

import logging

import pytest

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.config import schedule_kinds
from resnet_app.engine import schedules
from resnet_app.engine.plan import describe_schedule, plan_run


def he_rate(step: int, total: int) -> float:
    """He et al.: 0.1, divided by 10 at half the run and again at three quarters."""
    return 0.1 * 0.1 ** ((step >= round(total / 2)) + (step >= round(total * 3 / 4)))


@pytest.mark.parametrize("total", [1, 2, 7, 30, 1407, 64_000])
def test_the_default_drops_at_half_and_three_quarters_of_any_length(total):
    plan = plan_run(config.resolve(sets=[f"train.train_steps={total}"]), 50_000)
    for step in range(total):
        assert plan.schedule(step, plan.steps_per_epoch) == pytest.approx(he_rate(step, total))


def test_over_the_default_length_it_is_he_et_al_in_steps():
    default = plan_run(config.resolve(), 50_000)
    for step in range(64_000):
        multiplier = (1, 0.1, 0.01)[(step >= 32_000) + (step >= 48_000)]
        assert default.schedule(step, 390) == 0.1 * multiplier


def test_epochs_set_on_the_command_line_keep_the_drops_inside_the_run():
    resolved = config.resolve(sets=["train.epochs=3", "train.batch_size=128"])
    plan = plan_run(resolved, 60_000)  # Fashion-MNIST: 1,407 steps.
    assert plan.total_steps == 1407
    rates = sorted({plan.schedule(step, plan.steps_per_epoch) for step in range(1407)})
    assert rates == pytest.approx([0.001, 0.01, 0.1])


@pytest.mark.parametrize(
    "boundaries", [[0, 0.5], [0.5, 1], [32_000, 48_000], [-0.1, 0.5], [0.75, 0.5]]
)
def test_fractions_lie_strictly_inside_the_run(boundaries):
    spec = {"name": "piecewise", "unit": "fraction", "boundaries": boundaries}
    with pytest.raises(ConfigError, match="schedule key 'boundaries'"):
        schedules.create_schedule(
            {**spec, "multipliers": [1, 0.1, 0.01]},
            base_lr=0.1,
            global_batch_size=128,
            total_steps=100,
        )


def test_boundaries_given_without_a_unit_are_steps_as_before():
    resolved = config.resolve(sets=["schedule.boundaries=[100, 200]"])
    assert (resolved.schedule.boundaries, resolved.schedule.unit) == ((100, 200), "steps")
    recipe = config.resolve("imagenet_resnet50", ["schedule.boundaries=[10, 20, 30]"])
    assert recipe.schedule.unit == "epochs"  # The recipe's unit stays.


def test_a_recipe_s_boundaries_follow_a_length_given_after_it(caplog):
    with caplog.at_level(logging.INFO, logger="absl"):
        resolved = config.resolve("cifar10_wrn28_10", ["train.epochs=3"])
    # Zagoruyko & Komodakis: epochs 60, 120, 160 of 200.
    assert resolved.schedule.unit == "fraction"
    assert resolved.schedule.boundaries == pytest.approx((0.3, 0.6, 0.8))
    assert "[60, 120, 160] epochs of cifar10_wrn28_10's 200 epochs" in caplog.text
    plan = plan_run(resolved, 50_000)  # 1,172 steps of 128.
    drops = [
        s for s in range(1, plan.total_steps) if plan.schedule(s, 390) < plan.schedule(s - 1, 390)
    ]
    assert drops == [round(0.3 * 1172), round(0.6 * 1172), round(0.8 * 1172)]


def test_boundaries_in_other_units_than_the_recipe_s_length_are_left_as_written(tmp_path):
    # Steps against epochs cannot be compared before the dataset is read.
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        "schedule: {name: piecewise, boundaries: [500, 900], multipliers: [1, 0.1, 0.01]}\n"
        "train: {epochs: 10}\n"
    )
    resolved = config.resolve(str(recipe), ["train.epochs=3"])
    assert (resolved.schedule.boundaries, resolved.schedule.unit) == ((500, 900), "steps")


def test_a_schedule_given_again_is_the_user_s():
    written = config.resolve("imagenet_resnet50", ["schedule.unit=epochs", "train.epochs=9"])
    assert (written.schedule.boundaries, written.schedule.unit) == ((30, 60, 80), "epochs")


def test_a_resumed_run_s_schedule_stays_as_it_was_trained(tmp_path):
    path = tmp_path / "config.yaml"
    config.write_yaml(config.resolve("cifar10_wrn28_10"), str(path))
    resumed = config.resolve(str(path), ["train.epochs=300"], resumed=True)
    assert resumed.schedule.boundaries == (60, 120, 160)
    assert resumed.schedule.unit == "epochs"


def test_the_start_line_says_where_the_rate_drops():
    plan = plan_run(config.resolve(sets=["train.train_steps=1407"]), 60_000)
    text = describe_schedule(config.resolve(sets=["train.train_steps=1407"]), plan)
    assert text == "0.1, then 0.01 from step 704 (50%), 0.001 from step 1,055 (75%)"
    cosine = config.resolve(sets=["schedule.name=cosine", "schedule.warmup_steps=10"])
    plan = plan_run(cosine, 50_000)
    assert describe_schedule(cosine, plan) == (
        f"cosine from 0.1 to {plan.schedule(63_999, 390):.4g} after a warmup of 10 steps"
    )


def test_a_run_lengthened_on_resume_keeps_its_drops_and_records_why(tmp_path):
    from resnet_app.engine import loop
    from tests.runs import read_records, small_config

    model_dir = str(tmp_path / "run")
    loop.train_and_evaluate(small_config(tmp_path, train_steps=4, log_every=1), model_dir)
    # The same command, longer: the drops stay at steps 2 and 3 of the first 4.
    loop.train_and_evaluate(small_config(tmp_path, train_steps=8, log_every=1), model_dir)
    records = read_records(model_dir)
    rates = {r["step"]: r["learning_rate"] for r in records if "learning_rate" in r}
    assert [rates[step] for step in range(1, 9)] == pytest.approx(
        [he_rate(step, 4) for step in range(8)]
    )
    [change] = [r["changes"] for r in records if r.get("event") == "config_change"]
    assert change == {"schedule.total_steps": [None, 4], "train.train_steps": [4, 8]}
    saved = config.read_run_config(model_dir)
    assert saved.schedule.total_steps == 4


def test_boundaries_past_the_run_are_named_by_the_kind_itself():
    spec = schedule_kinds.ScheduleSection.from_mapping(
        {
            "name": "piecewise",
            "boundaries": [500, 32000, 48000],
            "multipliers": [1, 0.1, 0.01, 0.001],
        }
    )
    (warning,) = spec.warnings(469, 1407)
    assert warning.startswith("Schedule boundaries [32000, 48000] (steps) fall at or after")
    fractions = schedule_kinds.ScheduleSection.from_mapping(
        {"name": "piecewise", "boundaries": [0.5, 0.75], "unit": "fraction", "values": [1, 2, 3]}
    )
    assert fractions.warnings(469, 1407) == [] and fractions.boundary_steps(469, 1407) == [
        704,
        1055,
    ]
    assert schedule_kinds.ScheduleSection.from_mapping({"name": "cosine"}).warnings(469, 10) == []
