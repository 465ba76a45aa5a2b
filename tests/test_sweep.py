"""`resnet-app sweep`: the searched space, the checks before any trial, the study, the report,
and sweeps that run, prune and resume real training runs."""

import csv
import math
import os
import signal
import socket
import time

import numpy as np
import optuna
import pytest

from resnet_app import config
from resnet_app.common import metrics
from resnet_app.common.errors import ConfigError
from resnet_app.config import loading
from resnet_app.sweep import report, runner
from resnet_app.sweep import space as space_lib
from resnet_app.sweep import study as study_lib
from tests.commands import run_code, run_command, start_command

# A tiny run on the built-in shapes with a holdout split carved from its training images.
TRAIN = [
    "--dataset=shapes",
    "--model=tiny",
    "--batch_size=16",
    "--set=data.train_examples=240",
    "--set=data.validation_split=40",
    "--set=data.image_size=16",
]


# --- the space ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec,kind,ends,grid",
    [
        ("log(0.01, 1)", "log", (0.01, 1.0), None),
        ("uniform(0, 0.2)", "uniform", (0.0, 0.2), None),
        ("uniform(0, 0.2, 0.05)", "uniform", (0.0, 0.2), (0.0, 0.05, 0.1, 0.15, 0.2)),
        ("int(4, 16, 4)", "int", (4, 16), (4, 8, 12, 16)),
        ("int(5, 7)", "int", (5, 7), (5, 6, 7)),
        ("logint(32, 35)", "logint", (32, 35), (32, 33, 34, 35)),
        ("choice(cosine, piecewise)", "choice", ("cosine", "piecewise"), ("cosine", "piecewise")),
        ([1e-4, 5e-4], "choice", (1e-4, 5e-4), (1e-4, 5e-4)),
        ("choice(true, null, 3)", "choice", (True, None, 3), (True, None, 3)),
    ],
)
def test_specs_read_as_documented(spec, kind, ends, grid):
    param = space_lib.parse_param("section.key", spec)
    assert (param.kind, param.ends()) == (kind, ends)
    if grid is None or kind == "choice":
        assert param.grid() == grid
    else:
        np.testing.assert_allclose(param.grid(), grid, rtol=0, atol=1e-12)
        assert all(type(v) is type(grid[0]) for v in param.grid())
    # What describe() writes reads back as the same parameter (the study's fingerprint).
    assert space_lib.parse_param("section.key", param.describe()) == param


@pytest.mark.parametrize(
    "key,spec,message",
    [
        ("lr", "log(0.01, 1)", "is not a config key"),
        ("optimizer.learning_rate", "gauss(0, 1)", "is not a range or a choice"),
        ("optimizer.learning_rate", "log(0, 1)", "needs low > 0"),
        ("optimizer.learning_rate", "uniform(1, 0.5)", "needs finite low < high"),
        ("optimizer.learning_rate", "log(0.1, 1, 0.1)", "give log(low, high) with numbers"),
        ("train.batch_size", "int(8.5, 64)", "takes whole numbers"),
        ("train.batch_size", "int(8, 64, 2.5)", "step is a whole number"),
        ("train.label_smoothing", "uniform(0, 0.2, 0.5)", "at most high - low"),
        ("schedule.name", "choice()", "needs at least one value"),
        ("schedule.name", "choice(cosine, cosine)", "names a value twice"),
        ("schedule.boundaries", "choice([1, 2], [3])", "choice values are numbers, words"),
        ("train.label_smoothing", "choice(1, true)", "names a value twice (by ==)"),
        ("optimizer.learning_rate", "choice(0.1, .inf)", "must be finite"),
        ("optimizer.learning_rate", "[0.1, 0.2", "is not a YAML list"),
    ],
)
def test_bad_specs_are_one_line(key, spec, message):
    with pytest.raises(ConfigError, match=None) as caught:
        space_lib.parse_param(key, spec)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_yaml_list_and_quoted_words_read_as_choices():
    assert space_lib.parse_param("a.b", "[1e-4, 5e-4]").choices == (1e-4, 5e-4)
    param = space_lib.parse_param("a.b", "choice('a, b', c, 'yes', 1e-3)")
    assert param.choices == ("a, b", "c", "yes", 1e-3)
    assert space_lib.parse_param("a.b", param.describe()) == param


def test_a_key_given_twice_or_nothing_given_is_refused():
    with pytest.raises(ConfigError, match="searched twice"):
        space_lib.parse_space(
            {"optimizer.learning_rate": "log(0.1, 1)"}, ["optimizer.learning_rate=log(0.2, 1)"]
        )
    with pytest.raises(ConfigError, match="nothing to search"):
        space_lib.parse_space(None, [])
    with pytest.raises(ConfigError, match="give --param=KEY=SPEC"):
        space_lib.parse_space(None, ["optimizer.learning_rate"])


@pytest.mark.parametrize(
    "value",
    [0.1, 1e-5, 0.12520653814999466, 3, True, False, None, "cosine", "1e-3", "yes", "a, b"],
)
def test_each_value_reaches_the_config_as_itself(value):
    """--set reads YAML: what the sweep writes for a value reads back as that value and type."""
    path, parsed = loading.parse_set(space_lib.assignment("section.key", value))
    assert path == ["section", "key"] and parsed == value and type(parsed) is type(value)


def test_values_are_drawn_from_the_declared_distributions():
    space = space_lib.parse_space(
        {
            "optimizer.learning_rate": "log(0.01, 1)",
            "train.label_smoothing": "uniform(0, 0.2, 0.05)",
            "train.batch_size": "logint(16, 64)",
            "schedule.name": "choice(cosine, piecewise)",
        },
        [],
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(30):
        trial = study.ask()
        values = {p.key: space_lib.suggest(trial, p) for p in space}
        study.tell(trial, 0.0)
        assert 0.01 <= values["optimizer.learning_rate"] <= 1
        assert np.isclose(values["train.label_smoothing"], [0.0, 0.05, 0.1, 0.15, 0.2]).any()
        assert (
            isinstance(values["train.batch_size"], int) and 16 <= values["train.batch_size"] <= 64
        )
        assert values["schedule.name"] in ("cosine", "piecewise")
    distributions = study.trials[0].distributions
    assert distributions["optimizer.learning_rate"].log
    assert (
        distributions["train.batch_size"].log
        and distributions["train.label_smoothing"].step == 0.05
    )
    with pytest.raises(ConfigError, match="--sampler=grid needs every value listed"):
        space_lib.grid_space(space)


# --- the checks before any trial -------------------------------------------------------------


def _resolve(sets=()):
    base = [
        "data.dataset=shapes",
        "data.validation_split=40",
        "model.name=tiny",
    ]
    return lambda extra: config.resolve(None, [*base, *sets, *extra])


@pytest.mark.parametrize(
    "sets,spec,flags,message",
    [
        ((), "nosuch.key=log(0.1, 1)", {}, "--param nosuch.key=log(0.1, 1):"),
        ((), "train.label_smoothing=uniform(0, 1.5)", {}, "train.label_smoothing"),
        ((), "schedule.name=choice(cosine, wobbly)", {}, "wobbly"),
        (
            ("data.validation_split=0",),
            "optimizer.learning_rate=log(0.01, 1)",
            {},
            "validation split carved",
        ),
        (
            ("data.eval_split=test",),
            "optimizer.learning_rate=log(0.01, 1)",
            {},
            "drop data.eval_split",
        ),
        (
            (),
            "train.batch_size=int(8, 32)",
            {"train.batch_size": "batch_size"},
            "--batch_size sets",
        ),
        ((), "data.validation_split=choice(0, 40)", {}, "set it with --set, not as a searched"),
        ((), "data.eval_split=choice(holdout, test)", {}, "set it with --set, not as a searched"),
        ((), "train.best_metric=choice(top1, loss)", {}, "set it with --set, not as a searched"),
    ],
)
def test_the_sweep_is_checked_before_any_trial(sets, spec, flags, message):
    space = space_lib.parse_space(None, [spec])
    with pytest.raises(ConfigError) as caught:
        runner.make_plan([], space, _resolve(sets), flags)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_the_plan_scores_by_the_runs_keep_best_metric():
    space = space_lib.parse_space(None, ["optimizer.learning_rate=log(0.01, 1)"])
    plan = runner.make_plan([], space, _resolve(), {})
    assert (plan.metric, plan.higher) == ("top1", True)
    plan = runner.make_plan([], space, _resolve(["train.best_metric=loss"]), {})
    assert (plan.metric, plan.higher) == ("loss", False)


def test_a_study_that_searched_something_else_is_refused(tmp_path):
    url = study_lib.storage_url(str(tmp_path), None)
    assert url == f"sqlite:///{tmp_path}/study.db"
    first = {"space": {"a.b": "log(0.1, 1)"}, "argv": ["--model=tiny"], "direction": "max"}
    study = study_lib.open_study(url, "s", "maximize", None)
    study_lib.check_fingerprint(study, "s", first)
    again = study_lib.open_study(url, "s", "maximize", None)
    study_lib.check_fingerprint(again, "s", first)  # The same sweep: accepted.
    with pytest.raises(ConfigError, match=r"searched another sweep \(space differ\)"):
        study_lib.check_fingerprint(again, "s", {**first, "space": {"a.b": "log(0.2, 1)"}})
    with pytest.raises(ConfigError, match=r"\(direction differ\)"):  # Optuna would load it.
        study_lib.check_fingerprint(again, "s", {**first, "direction": "min"})
    with pytest.raises(ConfigError, match="cannot open the study database"):
        study_lib.open_study("nosuchdb://x", "s", "maximize", None)


def test_a_sweep_resumes_only_the_unfinished_trials_it_started_here(tmp_path):
    study = optuna.create_study()
    here, mine = socket.gethostname(), str(tmp_path / "s" / "trial-0000")
    for host, run in [(here, mine), ("elsewhere", str(tmp_path / "s" / "trial-0001"))]:
        trial = study.ask()
        trial.set_user_attr(study_lib.HOST, host)
        trial.set_user_attr(study_lib.RUN_DIR, run)
    other = study.ask()  # This machine's, but another sweep directory's.
    other.set_user_attr(study_lib.HOST, here)
    other.set_user_attr(study_lib.RUN_DIR, str(tmp_path / "t" / "trial-0002"))
    done = study.ask()
    done.set_user_attr(study_lib.HOST, here)
    done.set_user_attr(study_lib.RUN_DIR, str(tmp_path / "s" / "trial-0003"))
    study.tell(done, 1.0)
    found = study_lib.own_unfinished(study, str(tmp_path / "s"))
    assert [t.user_attrs[study_lib.RUN_DIR] for t in found] == [mine]


def test_a_grid_keeps_its_seed_and_other_samplers_draw_on(tmp_path):
    """A grid takes its shuffled points in order, so a resumed grid sweep keeps its seed;
    a random or TPE sweep resumed, or run beside another, must not draw the same again."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert study_lib.sampler_seed("grid", 7, 0, a) == study_lib.sampler_seed("grid", 7, 5, b) == 7
    seeds = {study_lib.sampler_seed("tpe", 7, n, d) for n in (0, 5) for d in (a, b)}
    assert len(seeds) == 4


# --- the report ------------------------------------------------------------------------------


def _fake_run(root, number, text):
    run = os.path.join(root, runner.TRIAL_DIR.format(number))
    os.makedirs(run)
    with open(os.path.join(run, "config.yaml"), "w") as f:
        f.write(text)
    return run


@pytest.mark.parametrize("higher", [True, False])
def test_the_ranking_the_csv_and_the_best_recipe(tmp_path, higher):
    states = optuna.trial.TrialState
    distribution = optuna.distributions.FloatDistribution(0.01, 1, log=True)
    values = [0.5, None, 0.9, 0.7, None, None]
    kinds = [
        states.COMPLETE,
        states.PRUNED,
        states.COMPLETE,
        states.COMPLETE,
        states.FAIL,
        states.RUNNING,
    ]
    study = optuna.create_study(direction="maximize" if higher else "minimize")
    recipe = config.to_yaml(config.resolve(None, ["model.name=tiny", "data.validation_split=40"]))
    for number, (value, state) in enumerate(zip(values, kinds)):
        run = _fake_run(tmp_path, number, recipe)
        study.add_trial(
            optuna.trial.create_trial(
                state=state,
                value=value,
                params={"optimizer.learning_rate": 0.01 * (number + 1)},
                distributions={"optimizer.learning_rate": distribution},
                intermediate_values={5: 0.1 * number, 10: 0.2 * number}
                if state != states.FAIL
                else {},
                user_attrs={
                    study_lib.RUN_DIR: run,
                    study_lib.ERROR: "error: boom" if state == states.FAIL else "",
                },
            )
        )
    ranked = report.write_all(
        study, str(tmp_path), ["optimizer.learning_rate"], "top1", higher, "holdout"
    )
    complete = sorted([(v, n) for n, v in enumerate(values) if v is not None], reverse=higher)
    assert [row.number for row in ranked] == [n for _, n in complete] + [1, 5, 4]
    with open(tmp_path / report.SUMMARY_FILE) as f:
        table = list(csv.DictReader(f))
    assert [int(row["trial"]) for row in table] == [row.number for row in ranked]
    assert [row["state"] for row in table][-3:] == ["pruned", "running", "fail"]
    assert (
        table[-1]["error"] == "error: boom"
        and table[-3]["top1"] == repr(0.2)
        and table[-3]["step"] == "10"
    )
    best = complete[0][1]
    text = (tmp_path / report.BEST_FILE).read_text()
    assert text.startswith(
        f"# The best trial of the sweep in {tmp_path}: trial {best}, top1 {values[best]:.4f}"
    )
    # The recipe is the trial's own config: read as a recipe, the same settings.
    assert config.resolve(str(tmp_path / report.BEST_FILE)) == config.from_yaml(recipe, "x")
    assert (tmp_path / report.PLOT_FILE).stat().st_size > 0
    assert "error: boom" not in report.table(ranked, ["optimizer.learning_rate"], "top1")


def test_without_optuna_the_command_is_one_line():
    code = (
        "import sys, runpy; sys.modules['optuna'] = None; "
        "sys.argv = ['resnet-app sweep', '--study_dir=/tmp/x', "
        "'--param=optimizer.learning_rate=log(0.1, 1)', '--dataset=shapes', "
        "'--set=data.validation_split=40']; "
        "runpy.run_module('resnet_app.tools.sweep', run_name='__main__')"
    )
    result = run_code(code)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: resnet-app sweep needs Optuna")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "give --study_dir"),
        (["--study_dir=X", "--model_dir=Y"], "--model_dir: each trial runs in its own directory"),
        (
            ["--study_dir=X", "--param=optimizer.learning_rate=log(0.01, 1)", "--dataset=shapes"],
            "validation split carved",
        ),
        (["--study_dir=X", "--param=optimizer.learning_rate=wobble"], "is not a range or a choice"),
        (["--study_dir=X", "--space=nosuch.yaml"], "--space=nosuch.yaml: No such file"),
        (["--study_dir=X", "--param=a.b=log(0.1,1)", "--sampler=bayes"], "--sampler"),
        (
            [
                "--study_dir=X",
                "--param=optimizer.learning_rate=log(0.1,1)",
                "--dataset=shapes",
                "--set=data.validation_split=40",
                "--pruner=hyperband",
            ],
            "--pruner=hyperband counts its resource in training steps: give --eval_every",
        ),
        (
            ["--study_dir=X", "--param=a.b=log(0.1,1)", "--trials=0"],
            "--trials must be a whole number >= 1",
        ),
    ],
)
def test_mistakes_are_one_line(tmp_path, args, message):
    args = [a.replace("X", str(tmp_path / "s")).replace("Y", str(tmp_path / "r")) for a in args]
    result = run_command("resnet_app.tools.sweep", *args)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, (
        result.stderr
    )
    assert message in errors[0]


def test_a_trial_refused_by_the_trainer_stops_the_sweep_in_one_line(tmp_path):
    """What every trial would meet (here weights that cannot be read) is not met N times."""
    garbage = tmp_path / "weights.safetensors"
    garbage.write_bytes(b"not weights")
    study_dir = tmp_path / "sweep"
    result = run_command(
        "resnet_app.tools.sweep",
        f"--study_dir={study_dir}",
        *TRAIN,
        "--train_steps=4",
        f"--set=train.init_from={garbage}",
        "--param=optimizer.learning_rate=log(0.01, 1)",
        "--trials=3",
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert "trial 0" in errors[0] and "was refused: error: " in errors[0]
    assert "weights.safetensors" in errors[0] and "Traceback" not in result.stderr
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{study_dir}/study.db")
    assert [t.state.name for t in study.trials] == ["FAIL"]
    assert (study_dir / "summary.csv").exists()


# --- real sweeps -----------------------------------------------------------------------------


def _trainer_evaluations(run):
    records = metrics.read_records(os.path.join(run, "metrics.jsonl"))
    return [r for r in records if "split" in r and "top1" in r and "event" not in r]


def test_a_sweep_runs_trials_side_by_side_scores_them_on_the_holdout_and_writes_the_best(tmp_path):
    study_dir = tmp_path / "sweep"
    result = run_command(
        "resnet_app.tools.sweep",
        f"--study_dir={study_dir}",
        *TRAIN,
        "--train_steps=12",
        "--eval_every=4",
        "--param=optimizer.learning_rate=log(0.01, 1)",
        "--param=train.label_smoothing=choice(0.0, 0.1)",
        "--trials=3",
        "--devices=0,1",
        "--sampler=random",
        "--pruner=none",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{study_dir}/study.db")
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    for trial in trials:
        run = trial.user_attrs[study_lib.RUN_DIR]
        assert run == str(study_dir / f"trial-{trial.number:04d}")
        ran = config.read_run_config(run)  # What the trainer was given: the drawn values.
        assert ran.optimizer.learning_rate == trial.params["optimizer.learning_rate"]
        assert ran.train.label_smoothing == trial.params["train.label_smoothing"]
        evaluations = _trainer_evaluations(run)
        assert {r["split"] for r in evaluations} == {"holdout"}
        assert [r["step"] for r in evaluations] == [4, 8, 12]
        # The value is the run's last evaluation; each evaluation was reported at its step.
        assert trial.value == evaluations[-1]["top1"]
        assert trial.intermediate_values == {r["step"]: r["top1"] for r in evaluations}
    # Trials 0 and 1 ran at once, one on each device.
    assert {trials[0].user_attrs["device"], trials[1].user_attrs["device"]} == {"0", "1"}
    assert trials[1].user_attrs["started"] < trials[0].user_attrs["ended"]
    with open(study_dir / "summary.csv") as f:
        ranked = [(float(row["top1"]), int(row["trial"])) for row in csv.DictReader(f)]
    assert ranked == sorted(((t.value, t.number) for t in trials), key=lambda x: (-x[0], x[1]))
    best = trials[ranked[0][1]]
    recipe = config.resolve(str(study_dir / "best.yaml"))
    assert recipe == config.read_run_config(best.user_attrs[study_lib.RUN_DIR])
    assert f"{ranked[0][0]:.4f}" in result.stdout.splitlines()[1]  # The table, best first.


def test_sweeps_in_two_directories_share_one_study_through_its_database(tmp_path):
    storage = f"sqlite:///{tmp_path}/shared.db"
    common = [*TRAIN, "--train_steps=4", "--eval_every=4", f"--storage={storage}"]
    common += ["--param=optimizer.learning_rate=log(0.01, 1)", "--pruner=none"]
    first = run_command(
        "resnet_app.tools.sweep", f"--study_dir={tmp_path / 'a'}", *common, "--trials=1"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_command(
        "resnet_app.tools.sweep", f"--study_dir={tmp_path / 'b'}", *common, "--trials=2"
    )
    assert second.returncode == 0, second.stderr[-3000:]
    study = optuna.load_study(study_name="sweep", storage=storage)
    runs = [t.user_attrs[study_lib.RUN_DIR] for t in study.trials]
    assert runs == [str(tmp_path / "a" / "trial-0000"), str(tmp_path / "b" / "trial-0001")]
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    # Each ranking is of the whole study as it was when that sweep ended.
    for name, trials in (("a", [0]), ("b", [0, 1])):
        with open(tmp_path / name / "summary.csv") as f:
            assert sorted(int(row["trial"]) for row in csv.DictReader(f)) == trials
    assert not (tmp_path / "b" / "study.db").exists()


def test_a_grid_sweep_runs_each_point_once_and_a_diverged_trial_does_not_stop_it(tmp_path):
    study_dir = tmp_path / "sweep"
    result = run_command(
        "resnet_app.tools.sweep",
        f"--study_dir={study_dir}",
        *TRAIN,
        "--train_steps=4",
        "--eval_every=2",
        "--param=optimizer.learning_rate=choice(0.05, 1e9)",  # 1e9 diverges.
        "--sampler=grid",
        "--trials=5",
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{study_dir}/study.db")
    states = {t.params["optimizer.learning_rate"]: t.state.name for t in study.trials}
    assert states == {0.05: "COMPLETE", 1e9: "FAIL"}  # Each point once: the grid is 2.
    failed = [t for t in study.trials if t.state.name == "FAIL"][0]
    assert failed.user_attrs["error"].startswith("error: training diverged")


@pytest.fixture
def always_prune(monkeypatch):
    """A pruner that stops every trial at its first evaluation (top-1 is never >= 2)."""
    monkeypatch.setitem(
        study_lib.PRUNERS, "always", lambda *_: optuna.pruners.ThresholdPruner(lower=2.0)
    )


def test_a_pruned_trial_is_stopped_where_the_pruner_said_and_keeps_its_checkpoint(
    tmp_path, always_prune
):
    space = space_lib.parse_space(None, ["optimizer.learning_rate=choice(0.1)"])
    base = [*TRAIN, "--train_steps=5000", "--eval_every=5"]
    # The config those flags describe, as the command's own resolve would give it.
    keys = ["data.dataset=shapes", "model.name=tiny", "train.batch_size=16"]
    sets = [*keys, *[a.removeprefix("--set=") for a in TRAIN if a.startswith("--set=")]]

    def resolve(extra):
        return config.resolve(None, [*sets, "train.train_steps=5000", *extra])

    plan = runner.make_plan(base, space, resolve, {})
    request = runner.SweepRequest(str(tmp_path / "s"), trials=1, pruner="always", poll_seconds=0.2)
    ranked = runner.Sweep(request, plan).run()
    assert [(row.state, row.step) for row in ranked] == [("PRUNED", 5)]
    run = ranked[0].run_dir
    records = metrics.read_records(os.path.join(run, "metrics.jsonl"))
    stopped = [r for r in records if r.get("event") == "stopped"]
    assert stopped and stopped[0]["step"] < 5000
    assert not [r for r in records if r.get("event") == "end"]
    with open(os.path.join(run, "checkpoint")) as f:
        assert f"ckpt-{stopped[0]['step']}" in f.read()  # It saved where it stopped.


def test_a_killed_sweep_resumes_its_trial_from_its_checkpoint_and_draws_no_extra(tmp_path):
    study_dir = tmp_path / "sweep"
    args = [
        f"--study_dir={study_dir}",
        *TRAIN,
        "--train_steps=200",
        "--eval_every=50",
        "--set=train.checkpoint_every=50",
        "--param=optimizer.learning_rate=log(0.01, 1)",
        "--trials=1",
        "--pruner=none",
    ]
    sweep = start_command("resnet_app.tools.sweep", *args)
    metrics_file = study_dir / "trial-0000" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if metrics_file.exists() and len(_trainer_evaluations(metrics_file.parent)) >= 2:
            break
        time.sleep(0.2)
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.communicate(timeout=60)
    time.sleep(1)  # The trial dies with its sweep (the parent-death signal).
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{study_dir}/study.db")
    assert [t.state.name for t in study.trials] == ["RUNNING"]
    killed_at = _trainer_evaluations(metrics_file.parent)[-1]["step"]
    assert killed_at < 200

    result = run_command("resnet_app.tools.sweep", *args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="sweep", storage=f"sqlite:///{study_dir}/study.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE"]
    records = metrics.read_records(str(metrics_file))
    starts = [r["step"] for r in records if r.get("event") == "start"]
    assert len(starts) == 2 and 0 < starts[1] <= killed_at  # Resumed from a checkpoint.
    steps = [r["step"] for r in _trainer_evaluations(metrics_file.parent)]
    assert steps[-1] == 200 and killed_at in steps
    first = study.trials[0]
    assert first.value == _trainer_evaluations(metrics_file.parent)[-1]["top1"]
    assert set(first.intermediate_values) == set(steps)
    assert all(math.isfinite(v) for v in first.intermediate_values.values())
