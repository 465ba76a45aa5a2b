"""The resume guard as a pure function: which differences from a run's settings are refused.

No run and no TensorFlow: two configs, the saved step and the replica counts.
The trainer's end-to-end refusals are in test_checkpoint.py and test_averaging.py.
"""

import dataclasses
import math

import pytest

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.data.settings import DataConfig
from resnet_app.engine.plan import plan_run
from resnet_app.engine.resume import check_resume, keep_drops

TINY = ["model.name=tiny", "train.batch_size=16"]
EXAMPLES = 64  # 4 steps an epoch.


def resolve(*sets, **train):
    return config.resolve(sets=[*TINY, *sets], overrides={"train": train})


def test_the_same_settings_resume_silently():
    check = check_resume(resolve(), resolve(), 4, 1, 1, EXAMPLES)
    assert check.changes == {} and check.refused == []


def test_a_changed_batch_is_refused_and_a_longer_run_is_not():
    saved = resolve(train_steps=2)
    check = check_resume(saved, resolve(train_steps=2, batch_size=32), 2, 1, 1, EXAMPLES)
    assert check.changes == {"train.batch_size": (16, 32)}
    assert check.refused == ["train.batch_size 16 -> 32"]
    # Boundaries in steps: a longer run keeps every rate.
    steps = ["schedule.boundaries=[3, 6]", "schedule.unit=steps"]
    saved = resolve(*steps, train_steps=2)
    check = check_resume(saved, resolve(*steps, train_steps=8, log_every=2), 2, 1, 1, EXAMPLES)
    assert check.changes == {"train.train_steps": (2, 8), "train.log_every": (100, 2)}
    assert check.refused == []


def test_a_longer_run_keeps_the_default_s_drops_where_they_were():
    # By default the rate drops at 1/2 and 3/4 of the run: at steps 4 and 6 of 8.
    saved = resolve(train_steps=8)
    longer = resolve(train_steps=16)
    # As given, the drops would move to 8 and 12, under steps already trained.
    assert check_resume(saved, longer, 6, 1, 1, EXAMPLES).refused == [
        "the learning rate at step 4 0.01 -> 0.1 (the schedule depends on the run's length)"
    ]
    kept = keep_drops(saved, longer, EXAMPLES)
    assert kept.schedule.total_steps == 8 and kept.train.train_steps == 16
    check = check_resume(saved, kept, 6, 1, 1, EXAMPLES)
    assert check.refused == []
    plan = plan_run(kept, EXAMPLES)
    assert [plan.schedule(s, 4) for s in range(16)] == pytest.approx(
        [0.1] * 4 + [0.01] * 2 + [0.001] * 10
    )
    # Lengthened again from the run it became: the drops stay of its first 8 steps.
    again = keep_drops(kept, resolve(train_steps=24), EXAMPLES)
    assert again.schedule.total_steps == 8
    # Pinned in steps by hand: the same rates for the steps trained, so it may resume.
    pinned = resolve("schedule.unit=steps", "schedule.boundaries=[4, 6]", train_steps=16)
    check = check_resume(saved, pinned, 6, 1, 1, EXAMPLES)
    assert set(check.changes) == {"schedule.boundaries", "schedule.unit", "train.train_steps"}
    assert check.refused == []


def test_only_the_same_schedule_in_fractions_is_kept():
    saved = resolve(train_steps=8)
    for new in (
        resolve(train_steps=8),  # Not lengthened.
        resolve("schedule.boundaries=[0.25, 0.5]", train_steps=16),  # Other fractions.
        resolve("schedule.name=cosine", train_steps=16),
        resolve("schedule.total_steps=16", train_steps=16),  # Says what they are of.
    ):
        assert keep_drops(saved, new, EXAMPLES) is new


def test_a_schedule_written_otherwise_with_the_same_rates_resumes():
    # The default before fractions: He et al.'s boundaries in steps of a 64k-step run.
    he = ["schedule.boundaries=[32000, 48000]", "schedule.unit=steps"]
    saved = resolve(*he, train_steps=64_000)
    check = check_resume(saved, resolve(train_steps=64_000), 40_000, 1, 1, EXAMPLES)
    assert set(check.changes) == {"schedule.boundaries", "schedule.unit"}
    assert check.refused == []
    # One step apart is another schedule.
    moved = resolve("schedule.boundaries=[32000, 48001]", "schedule.unit=steps", train_steps=64_000)
    check = check_resume(moved, resolve(train_steps=64_000), 40_000, 1, 1, EXAMPLES)
    assert check.refused == [
        "schedule.boundaries [32000, 48001] -> [0.5, 0.75]",
        "schedule.unit 'steps' -> 'fraction'",
    ]


def test_a_length_that_moves_a_cosine_schedule_is_refused_at_the_first_step_it_moves():
    saved = resolve("schedule.name=cosine", train_steps=8)
    longer = resolve("schedule.name=cosine", train_steps=16)
    # Every rate of steps 0-4 compared: cosine from the same peak over 8 or 16
    # steps first differs at step 1 (cos(pi/8) against cos(pi/16)).
    refused = check_resume(saved, longer, 4, 1, 1, EXAMPLES).refused
    assert len(refused) == 1
    first = refused[0]
    assert first.startswith("the learning rate at step 1 ")
    assert first.endswith("(the schedule depends on the run's length)")
    before, after = (float(x) for x in first.split("step 1 ")[1].split(" (")[0].split(" -> "))
    assert after / before == pytest.approx(
        (1 + math.cos(math.pi / 16)) / (1 + math.cos(math.pi / 8))
    )
    # At step 0 nothing was run at another rate yet.
    assert check_resume(saved, longer, 0, 1, 1, EXAMPLES).refused == []


def test_other_replicas_are_refused_where_each_normalizes_or_steps_alone():
    per_tower = resolve()
    check = check_resume(per_tower, per_tower, 3, 2, 1, EXAMPLES)
    assert check.changes == {"replicas": (2, 1)}
    assert check.refused == ["replicas 2 -> 1 (each BatchNorm normalizes over 8 -> 16 examples)"]
    # Synchronized BatchNorm normalizes over the global batch: allowed.
    synchronized = resolve("model.bn_synchronized=true")
    check = check_resume(synchronized, synchronized, 3, 2, 4, EXAMPLES)
    assert check.changes == {"replicas": (2, 4)} and check.refused == []
    averaged = resolve("model.bn_synchronized=true", "sync.mode=model_average")
    assert check_resume(averaged, averaged, 3, 4, 2, EXAMPLES).refused == [
        "replicas 4 -> 2 (with model averaging each replica trains alone on 4 -> 8 examples "
        "per step)"
    ]
    # A checkpoint that does not record its replicas is not compared.
    assert check_resume(per_tower, per_tower, 3, None, 2, EXAMPLES).changes == {}


def test_refusals_add_up():
    check = check_resume(resolve(), resolve("sync.interval=4", batch_size=32), 3, 2, 1, EXAMPLES)
    assert check.refused == [
        "sync.interval 8 -> 4",
        "train.batch_size 16 -> 32",
        "replicas 2 -> 1 (each BatchNorm normalizes over 16 -> 32 examples)",
    ]


def test_how_a_lost_worker_is_noticed_may_change_on_resume():
    check = check_resume(
        resolve(), resolve("sync.timeout=30", "sync.keep_last_step=false"), 4, 2, 2, EXAMPLES
    )
    assert check.changes == {"sync.timeout": (None, 30.0), "sync.keep_last_step": (True, False)}
    assert check.refused == []


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_sync_timeout_must_be_seconds_above_0(value):
    with pytest.raises(ConfigError, match=rf"sync.timeout must be a number > 0, got {value}.0"):
        resolve(f"sync.timeout={value}")


def test_a_nested_key_compares_by_itself_and_resumable_fields_come_from_their_metadata():
    check = check_resume(resolve(), resolve("data.augment.flip=false"), 4, 1, 1, EXAMPLES)
    assert check.changes == {"data.augment.flip": (True, False)}
    assert check.refused == ["data.augment.flip True -> False"]
    # The old flat key is the same setting: nothing changed.
    same = check_resume(resolve("data.flip=false"), resolve("data.augment.flip=false"), 4, 1, 1, 64)
    assert same.changes == {}
    # The threshold only moves the F1 scores; the class weights change the loss.
    assert check_resume(resolve(), resolve(threshold=0.3), 4, 1, 1, EXAMPLES).refused == []
    weighted = check_resume(resolve(), resolve("train.class_weights=balanced"), 4, 1, 1, EXAMPLES)
    assert weighted.refused == ["train.class_weights None -> 'balanced'"]
    from resnet_app.common import fields

    marked = {
        f"{section}.{field.name}"
        for section, cls in (
            ("data", DataConfig),
            ("train", config.TrainSettings),
            ("sync", config.SyncSettings),
        )
        for field in dataclasses.fields(cls)
        if field.metadata.get(fields.RESUMABLE)
    }
    assert marked == set(config.RESUMABLE_CHANGES) and "train.threshold" in marked
