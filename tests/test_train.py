"""The trainer end to end: the CLI's files, the learning rate it logs and obeys, errors."""

import os
import re

import numpy as np
import pytest
import tensorflow as tf
import yaml

from resnet_app import config
from resnet_app.common.errors import ConfigError
from resnet_app.engine import loop, plan
from tests.commands import error_line, run_command
from tests.runs import read_records, small_config

# A few steps of the tiny test network on a few hundred `shapes` images.
SMALL = [
    "--model=tiny",
    "--batch_size=16",
    "--set=data.train_examples=64",
    "--set=data.eval_examples=37",
]


def train_cli(*args, env=None):
    return run_command("resnet_app.train", *args, env=env)


def event_tags(directory):
    """The scalar tags in a TensorBoard event directory."""
    tags = set()
    for name in os.listdir(directory):
        for event in tf.compat.v1.train.summary_iterator(str(directory / name)):
            tags.update(value.tag for value in event.summary.value)
    return tags


def test_cli_writes_metrics_events_and_config(tmp_path):
    model_dir = tmp_path / "run"
    result = train_cli(
        *SMALL,
        f"--data_dir={tmp_path / 'data'}",
        "--train_steps=6",
        "--log_every=2",
        "--eval_every=4",
        f"--model_dir={model_dir}",
    )
    assert result.returncode == 0, result.stderr
    records = read_records(model_dir)
    train_records = [r for r in records if "accuracy" in r]
    eval_records = [r for r in records if "top1" in r]
    assert [r["step"] for r in train_records] == [2, 4, 6]
    for record in train_records:
        assert set(record) == {
            "step",
            "epoch",
            "loss",
            "accuracy",
            "learning_rate",
            "examples_per_sec",
            "input_wait",
            "time",
        }
        assert 0 <= record["input_wait"] <= 1
        assert record["epoch"] == pytest.approx(record["step"] * 16 / 64)
        assert np.isfinite(record["loss"]) and 0 <= record["accuracy"] <= 1
    # Evaluated at step 4 and at the end, each time on all 37 examples.
    assert [(r["step"], r["num_examples"], r["split"]) for r in eval_records] == [
        (4, 37, "test"),
        (6, 37, "test"),
    ]
    assert {r["precision"] for r in eval_records} == {"fp32"}
    expected_tags = {
        "train": {"loss", "accuracy", "learning_rate", "examples_per_sec", "input_wait"},
        "eval": {"top1", "top5", "loss", "balanced_accuracy"},
    }
    for kind, tags in expected_tags.items():
        assert event_tags(model_dir / kind) == tags, kind
    with open(model_dir / "config.yaml") as f:
        written = config.from_dict(yaml.safe_load(f))
    assert written.model_name == "tiny" and written.train.train_steps == 6
    assert "Done: 6 steps" in result.stderr


def test_logged_learning_rate_follows_the_schedule_and_the_override(tmp_path):
    # 0.1 for 3 steps, then 0.02 (hand-computed from the spec).
    sets = [
        "schedule.name=piecewise",
        "schedule.boundaries=[3]",
        "schedule.values=[0.1, 0.02]",
        "schedule.multipliers=null",  # The default's; values replace them.
        "train.log_every=1",
        "train.eval_every=100",
    ]
    model_dir = tmp_path / "run"
    os.makedirs(model_dir)
    resolved = small_config(tmp_path, *sets, train_steps=6)
    (model_dir / "lr_override").write_text("x0.5\n")  # Read after step 1.
    loop.train_and_evaluate(resolved, str(model_dir))
    records = read_records(model_dir)
    rates = [r["learning_rate"] for r in records if "accuracy" in r]
    # Step 1 used 0.1; from step 2 on, half the schedule.
    np.testing.assert_allclose(rates, [0.1, 0.05, 0.05, 0.01, 0.01, 0.01], rtol=1e-6)
    events = [r for r in records if r.get("event") == "lr_override"]
    assert len(events) == 1 and events[0]["step"] == 1
    assert not (model_dir / "lr_override").exists()
    assert (model_dir / "lr_override.applied").read_text().strip() == "x0.5"

    # A fixed value replaces the schedule; the resumed run keeps the state.
    (model_dir / "lr_override").write_text("0.003")
    resolved = small_config(tmp_path, *sets, train_steps=8)
    loop.train_and_evaluate(resolved, str(model_dir))
    rates = [r["learning_rate"] for r in read_records(model_dir) if "accuracy" in r][6:]
    np.testing.assert_allclose(rates, [0.01, 0.003], rtol=1e-6)
    # Resumed, the fixed rate holds; a multiplier then scales it.
    (model_dir / "lr_override").write_text("x0.5")
    resolved = small_config(tmp_path, *sets, train_steps=10)
    loop.train_and_evaluate(resolved, str(model_dir))
    rates = [r["learning_rate"] for r in read_records(model_dir) if "accuracy" in r][8:]
    np.testing.assert_allclose(rates, [0.003, 0.0015], rtol=1e-6)


def test_schedule_script(tmp_path):
    script = tmp_path / "my_schedule.py"
    script.write_text("def lr(step, steps_per_epoch):\n    return 0.01 * (step + 1)\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "home_config")}  # This user's key.
    result = train_cli(
        *SMALL,
        f"--data_dir={tmp_path / 'data'}",
        "--train_steps=3",
        "--log_every=1",
        f"--lr_schedule={script}:lr",
        f"--model_dir={tmp_path / 'run'}",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    rates = [r["learning_rate"] for r in read_records(tmp_path / "run") if "accuracy" in r]
    np.testing.assert_allclose(rates, [0.01, 0.02, 0.03], rtol=1e-6)
    # Resumed with the same command minus the script: the run recorded it, so it runs...
    resume = [*SMALL, f"--data_dir={tmp_path / 'data'}", "--log_every=1"]
    result = train_cli(*resume, "--train_steps=4", f"--model_dir={tmp_path / 'run'}", env=env)
    assert result.returncode == 0, result.stderr
    rates = [r["learning_rate"] for r in read_records(tmp_path / "run") if "accuracy" in r]
    np.testing.assert_allclose(rates, [0.01, 0.02, 0.03, 0.04], rtol=1e-6)
    # ...until its content changes: then the resume names it and how to allow it.
    script.write_text("def lr(step, steps_per_epoch):\n    return 0.5\n")
    result = train_cli(*resume, "--train_steps=5", f"--model_dir={tmp_path / 'run'}", env=env)
    assert result.returncode == 2
    assert re.search(f"{script}:lr.*content changed.*--allow_scripts", error_line(result))


@pytest.mark.parametrize(
    "args,message",
    [
        (["--batch_sise=3"], "Unknown command line flag 'batch_sise'"),
        (["--batch_size=x"], "batch_size"),
        (["--config=configs/nope.yaml"], "configs/nope.yaml not found"),
        (["--set=train.bach_size=3"], "unknown train key.*bach_size.*valid keys"),
        (["--set=optimizer.learning_rate=-0.1"], "learning_rate"),
        (["--train_steps=0"], "train.train_steps must be a whole number >= 1, got 0"),
        (["--model=resnet21"], "unknown model 'resnet21'"),
        (["--dataset=folder:/no/such/dir"], "/no/such/dir"),
        (["--dataset=cifar11"], "cifar11"),
        (["--set=optimizer.class=adagrad"], "adagrad.*momentum"),
        (["--set=optimizer.momentun=0.5"], "momentun"),
        (["--lr_schedule=nothere.py:f"], "nothere.py"),
        # 16 examples do not split over 3 towers.
        (["--batch_size=16", "--num_towers=3"], "batch_size=16 is not divisible by the 3 towers"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, message):
    length = [] if any(a.startswith("--train_steps") for a in args) else ["--train_steps=1"]
    result = train_cli(*args, *length, f"--model_dir={tmp_path / 'run'}")
    assert re.search(message, error_line(result))


def test_two_towers_train_like_one(tmp_path):
    """With synchronized BatchNorm, the trainer on 2 towers follows the 1-tower run."""
    weights = []
    for towers in (1, 2):
        resolved = small_config(
            tmp_path, "model.bn_synchronized=true", "train.eval_every=100", train_steps=3
        )
        resolved = config.from_dict(
            {**resolved.to_dict(), "train": {**resolved.to_dict()["train"], "num_towers": towers}}
        )
        result = loop.train_and_evaluate(resolved, str(tmp_path / f"run{towers}"))
        weights.append(result.model.get_weights())
    # Three steps through the whole trainer; one step is compared to 1e-5 in
    # test_step.py. Per-tower BatchNorm would differ by about 1e-2.
    for one, two in zip(*weights):
        np.testing.assert_allclose(two, one, rtol=1e-3, atol=2e-5)


def test_a_schedule_that_never_trains_is_refused(tmp_path):
    resolved = small_config(
        tmp_path, "schedule.name=cosine", "schedule.warmup_steps=10", train_steps=5
    )
    with pytest.raises(ConfigError, match="learning rate is 0 at every step"):
        plan.plan_run(resolved, 64)


def test_resumed_run_equals_an_uninterrupted_one(tmp_path):
    """3 steps, a restart, 3 more: the same weights as 6 steps in one go."""
    # A schedule in steps, so that the 3-step run feeds the same rates.
    sets = ["train.log_every=1", "train.eval_every=100", "schedule.boundaries=[4]"]
    sets += ["schedule.multipliers=[1, 0.3]"]
    whole = loop.train_and_evaluate(
        small_config(tmp_path, *sets, train_steps=6), str(tmp_path / "whole")
    ).model.get_weights()
    # Stopped after 3 steps, with the checkpoint of step 3 on disk, then rerun.
    loop.train_and_evaluate(small_config(tmp_path, *sets, train_steps=3), str(tmp_path / "resumed"))
    resumed = loop.train_and_evaluate(
        small_config(tmp_path, *sets, train_steps=6), str(tmp_path / "resumed")
    ).model.get_weights()
    for expected, actual in zip(whole, resumed):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-8)
    records = read_records(tmp_path / "resumed")
    assert [r["step"] for r in records if "accuracy" in r] == [1, 2, 3, 4, 5, 6]


def test_resuming_another_model_is_a_one_line_error(tmp_path):
    loop.train_and_evaluate(
        small_config(tmp_path, "train.eval_every=100", train_steps=1), str(tmp_path / "run")
    )
    wider = small_config(tmp_path, "train.eval_every=100", "model.widths=[8]", train_steps=2)
    # The settings are compared first ...
    with pytest.raises(ConfigError, match=r"settings differ .*: model.widths \[4\] -> \[8\]\."):
        loop.train_and_evaluate(wider, str(tmp_path / "run"))
    # ... and a checkpoint that does not fit the model is refused even when allowed.
    with pytest.raises(ConfigError, match="cannot resume from .*ckpt-1.*use a new --model_dir"):
        loop.train_and_evaluate(wider, str(tmp_path / "run"), allow_config_change=True)
    # That failed attempt changed nothing: the run goes on with its own settings.
    loop.train_and_evaluate(
        small_config(tmp_path, "train.eval_every=100", train_steps=2), str(tmp_path / "run")
    )
