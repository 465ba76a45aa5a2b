"""Time to accuracy: the trainer against Keras `fit`, timed from the command to targets.

    python scripts/time_to_accuracy.py                          # shapes, top-1 >= 85%
    python scripts/time_to_accuracy.py --targets=0.85,0.9 --seeds=0,1,2 --json
    python scripts/time_to_accuracy.py --config=resnet_app/recipes/fashion_mnist_resnet20.yaml \\
        --fast_config=resnet_app/recipes/fashion_mnist_fast.yaml --targets=0.92,0.93 --seeds=0,1,2

Each run is one fresh process, timed from its launch (imports, data loading,
model building, compiling, input, steps and evaluations all count) to the end
of the first evaluation whose top-1 reaches each of --targets (--target is
one target). The evaluations are of the split the trainer evaluates: the
holdout when the recipe sets data.validation_split, else the test split.
Every run trains its recipe to the end with --evals evaluations at even
steps (close enough to see the crossing), so each also reports its final
accuracy. A recipe's steps are rounded down to a multiple of --evals, the
same for every run of it. --dataset replaces every recipe's data.dataset, to
race the recipes on another copy of their data. The runs:
- `fit`: --config's recipe with Keras `fit`, written as a user would
  (`keras_baseline.fit_recipe`: Keras's stock layers, SGD, `tf.data` over
  the dataset held in memory, the recipe's per-step learning rate, the
  evaluated split as `validation_data`);
- `trainer`: `python -m resnet_app.train` on the same --config;
- `fast`: `python -m resnet_app.train` on --fast_config, the trainer's
  fastest recipe (progressive resizing, `train.precision: auto`, ...).
Per target, each kind of run's median time over --seeds (run in rounds so
that a slow spell of the machine hits every run), or that a seed missed it.
Rows, per target: (1) `trainer` against `fit`, the same recipe; (2) `fast`
against `fit`. A ratio is `fit`'s median time over the trainer's, judged
against issue 29's targets on the whole wall time; also shown without the
evaluations, which are this measurement's probes (as many in every run) more
than the recipe's. Each run's time is split into start-up, the first call's
compile, evaluation, input and steps (`run_timing.py`). The CPU line says
which kind of machine this is: compare ratios, never times across machines.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import keras_baseline  # Next to this script, as is run_timing.
import run_timing
from absl import flags, logging

from resnet_app.common import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CONFIG = flags.DEFINE_string("config", "configs/shapes_quickstart.yaml", "The plain recipe.")
_FAST = flags.DEFINE_string("fast_config", "configs/shapes_fast.yaml", "The trainer's fastest.")
_TARGETS = flags.DEFINE_list("targets", ["0.85"], "The top-1s to reach, each in (0, 1).")
_TARGET = flags.DEFINE_float("target", None, "One top-1 to reach: --targets with one value.")
_DATASET = flags.DEFINE_string(
    "dataset", None, "Replaces data.dataset in every run's recipe (e.g. idx:DIR)."
)
_EVALS = flags.DEFINE_integer("evals", 10, "Evaluations per run, at even steps.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Training seeds; every run is repeated per seed.")
_RUNS = flags.DEFINE_list("runs", ["fit", "trainer", "fast"], "Some of: fit, trainer, fast.")
_WORK = flags.DEFINE_string("work_dir", None, "Where the runs go (default: a temp dir).")
_JSON = flags.DEFINE_boolean("json", False, "Print one JSON object instead of a table.")
_EVENTS = flags.DEFINE_string("fit_events", None, "Internal: run `fit`, its events to this file.")
_FIT_SEED = flags.DEFINE_integer("fit_seed", 0, "Internal: the fit run's seed.")

RUNS = ("fit", "trainer", "fast")
# Issue 29's targets: row 1 on any CPU; row 2 by whether bfloat16 is native.
ROW1_TARGET, ROW2_TARGET_NATIVE, ROW2_TARGET = 1.3, 2.0, 1.5


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A config file as the runs train it."""

    path: str
    steps: int
    eval_every: int
    batch_size: int
    examples: int


def resolve_recipe(path: str, seed: int = 0):
    """The recipe's resolved config, with --dataset in place of its data.dataset.

    --dataset goes in as the trainer's own --dataset flag does (a config layer
    of its own, not a `--set` string that YAML would parse).
    """
    from resnet_app import config

    overrides = {"data": {"dataset": _DATASET.value}} if _DATASET.value else None
    return config.resolve(path, sets=[f"train.seed={seed}"], overrides=overrides)


@functools.cache  # The parent loads each recipe's data once for its checks and plan.
def load_recipe(path: str, seed: int = 0):
    """(the resolved config, its `InputPipeline`, its `Recipe`).

    The recipe's steps are rounded down to a multiple of --evals.
    """
    from resnet_app.data import input_pipeline
    from resnet_app.engine.plan import plan_run
    from resnet_app.nets.presets import get_config

    resolved = resolve_recipe(path, seed)
    pipeline = input_pipeline.create_pipeline(
        resolved.data, default_image_size=get_config(resolved.model_name).default_image_size
    )
    examples = pipeline.epoch_examples(resolved.train.batch_size)  # Repeats: the samplers'.
    plan = plan_run(resolved, examples, pipeline.preprocessing.image_size)
    every = plan.total_steps // _EVALS.value
    if every < 1:
        cli.fail(f"--evals={_EVALS.value}: {path} has only {plan.total_steps} steps; use fewer")
    steps = every * _EVALS.value
    return (
        resolved,
        pipeline,
        Recipe(path, steps, every, resolved.train.batch_size, examples),
    )


def fit_worker(path: str, seed: int, events_path: str) -> None:
    resolved, pipeline, recipe = load_recipe(path, seed)
    with open(events_path, "w") as events:

        def write(record: dict) -> None:
            events.write(json.dumps(record) + "\n")
            events.flush()

        keras_baseline.fit_recipe(resolved, pipeline, recipe.steps, recipe.eval_every, write)


def launch(run: str, recipe: Recipe, seed: str, run_dir: str) -> tuple[float, str]:
    """Runs one process to its end; returns (its launch time, the path of its events)."""
    os.makedirs(run_dir, exist_ok=True)
    if run == "fit":
        events = os.path.join(run_dir, "fit_events.jsonl")
        command = [sys.executable, os.path.abspath(__file__), f"--config={recipe.path}"]
        command += [f"--evals={_EVALS.value}", f"--fit_seed={seed}", f"--fit_events={events}"]
    else:
        events = os.path.join(run_dir, "metrics.jsonl")
        command = [sys.executable, "-m", "resnet_app.train", f"--config={recipe.path}"]
        command += [f"--train_steps={recipe.steps}", f"--eval_every={recipe.eval_every}"]
        command += [f"--log_every={recipe.eval_every}", f"--seed={seed}"]
        command += [f"--model_dir={run_dir}", "--restart"]
    if _DATASET.value:
        command.append(f"--dataset={_DATASET.value}")
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    logging.info("%s, seed %s: %s", run, seed, " ".join(command))
    launched = time.time()
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    if completed.returncode:
        tail = " | ".join(completed.stderr.strip().splitlines()[-3:])
        cli.fail(f"the {run} run (seed {seed}) failed: {tail}")
    return launched, events


def _key(target: float) -> str:
    """A target as the report's keys spell it: 0.92 -> "0.92"."""
    return f"{target:g}"


def build_report(work: str, targets: list[float]) -> dict:
    """Runs every kind of run per seed, in rounds, and reads each one's way to every target."""
    from resnet_app.common import hardware

    cpu = hardware.read_cpu_info()
    paths = {run: _FAST.value if run == "fast" else _CONFIG.value for run in _RUNS.value}
    loaded = {path: load_recipe(path)[2] for path in set(paths.values())}
    recipes = {run: loaded[path] for run, path in paths.items()}
    timings = {run: {_key(t): [] for t in targets} for run in _RUNS.value}
    for seed in _SEEDS.value:  # In rounds: a slow spell of the machine hits every run.
        for run in _RUNS.value:
            recipe = recipes[run]
            launched, events = launch(run, recipe, seed, os.path.join(work, f"{run}_{seed}"))
            records = run_timing.read_events(events)
            for target in targets:
                result = run_timing.timing(
                    records, launched, target, recipe.batch_size, recipe.examples
                )
                timings[run][_key(target)].append(result)
                logging.info("%s, seed %s, target %s: %s", run, seed, target, result)
    return {
        "cpu": cpu.describe(),
        "dataset": _DATASET.value,
        "targets": targets,
        "evals": _EVALS.value,
        "seeds": _SEEDS.value,
        "recipes": {run: dataclasses.asdict(r) for run, r in recipes.items()},
        "runs": {
            run: {key: [dataclasses.asdict(t) for t in ts] for key, ts in by_target.items()}
            for run, by_target in timings.items()
        },
        "medians": {
            run: {key: _medians(ts) for key, ts in by_target.items()}
            for run, by_target in timings.items()
        },
        "rows": _rows(timings, targets, cpu.native_bf16),
    }


def _medians(timings: list[run_timing.Timing]) -> dict:
    """The median times over seeds to one target; None when a seed missed it."""
    missed = sum(t.seconds is None for t in timings)

    def median(key: str) -> float | None:
        return None if missed else statistics.median(getattr(t, key) for t in timings)

    return {
        "seconds": median("seconds"),
        "without_evals": median("without_evals"),
        "missed": missed,
    }


def _rows(timings: dict, targets: list[float], native_bf16: bool) -> list[dict]:
    """Issue 29's rows, one per target: each trainer run's speed-up over `fit`."""
    goals = {
        "trainer": ("1: trainer / fit, the same recipe", ROW1_TARGET),
        "fast": ("2: fast / fit", ROW2_TARGET_NATIVE if native_bf16 else ROW2_TARGET),
    }
    rows = []
    for target in targets:
        key = _key(target)
        for run, (name, goal) in goals.items():
            if "fit" not in timings or run not in timings:
                continue
            ours, theirs = timings[run][key], timings["fit"][key]
            ratio = run_timing.speedup(ours, theirs)
            rows.append(
                {
                    "row": name,
                    "accuracy": target,
                    "ratio": ratio,
                    "without_evals": run_timing.speedup(ours, theirs, "without_evals"),
                    "target": goal,
                    "met": None if ratio is None else ratio >= goal,  # On the whole wall time.
                }
            )
    return rows


def _number(value: float | None, form: str = ".1f") -> str:
    return "-" if value is None else format(value, form)


def _percent(target: float) -> str:
    return f"{100 * target:.1f}%"


def format_report(report: dict) -> str:
    """The report as a table: a line per run, seed and target, then the medians and the rows."""
    targets = ", ".join(_percent(t) for t in report["targets"])
    lines = [
        f"CPU: {report['cpu']}",
        *([f"dataset: {report['dataset']}"] if report.get("dataset") else []),
        f"targets: top-1 >= {targets}; {report['evals']} evaluations per run; seconds from "
        "the launch",
        f"{'run':<8}{'recipe':<24}{'seed':>5}{'target':>8}{'to target':>10}{'w/o evals':>10}"
        f"{'step':>6}{'epochs':>7}{'final':>8}{'start':>7}{'compile':>8}{'eval':>6}"
        f"{'input':>6}{'steps':>7}",
    ]
    for run, by_target in report["runs"].items():
        recipe = os.path.basename(report["recipes"][run]["path"])
        for index, seed in enumerate(report["seeds"]):
            for target in report["targets"]:
                t = by_target[_key(target)][index]
                lines.append(
                    f"{run:<8}{recipe:<24}{seed:>5}{_percent(target):>8}"
                    f"{_number(t['seconds']):>10}{_number(t['without_evals']):>10}"
                    f"{_number(t['step'], 'd'):>6}{_number(t['epochs'], '.2f'):>7}"
                    f"{100 * t['final_top1']:>7.2f}%{t['startup']:>7.1f}{t['compile']:>8.1f}"
                    f"{t['evaluation']:>6.1f}{_number(t['input']):>6}{t['steps']:>7.1f}"
                )
    lines.append(f"median over seeds {', '.join(report['seeds'])}, seconds to the target:")
    for target in report["targets"]:
        parts = []
        for run, by_target in report["medians"].items():
            median = by_target[_key(target)]
            if median["missed"]:
                parts.append(f"{run} missed it ({median['missed']} of {len(report['seeds'])})")
            else:
                parts.append(
                    f"{run} {median['seconds']:.1f} ({median['without_evals']:.1f} w/o evals)"
                )
        lines.append(f"  {_percent(target)}: " + ", ".join(parts))
    for row in report["rows"]:
        name = f"row {row['row']}, top-1 >= {_percent(row['accuracy'])}"
        if row["ratio"] is None:
            lines.append(f"{name}: a run missed the target")
            continue
        verdict = "met" if row["met"] else "missed"
        lines.append(
            f"{name}: {row['ratio']:.2f}x to the target, {row['without_evals']:.2f}x "
            f"without the evaluations (target >= {row['target']}x: {verdict})"
        )
    return "\n".join(lines)


def parse_targets() -> list[float]:
    """--targets (or --target, one target) as top-1s in (0, 1), ascending, each once."""
    if _TARGET.value is not None:
        if flags.FLAGS["targets"].present:
            cli.fail("--target and --targets both given; give the targets once, --targets=0.9,0.92")
        if not 0 < _TARGET.value < 1:
            cli.fail(f"--target={_TARGET.value}: give a test top-1 in (0, 1), e.g. 0.85")
        return [_TARGET.value]
    given = ",".join(_TARGETS.value)
    targets = set()
    for item in _TARGETS.value:
        try:
            target = float(item)
        except ValueError:
            target = None
        if target is None or not 0 < target < 1:
            cli.fail(
                f"--targets={given}: {item!r} is not a top-1 in (0, 1); e.g. --targets=0.9,0.92"
            )
        targets.add(target)
    if not targets:
        cli.fail("--targets is empty; give top-1s in (0, 1), e.g. --targets=0.9,0.92")
    return sorted(targets)


def check_fit(path: str) -> None:
    """Refuses a recipe the fit run would not reproduce: its settings first, then its data."""
    missing = keras_baseline.unmirrored(resolve_recipe(path))
    if not missing:  # Only then load the data, for what only it tells.
        resolved, pipeline, _ = load_recipe(path)
        missing = keras_baseline.unmirrored(resolved, pipeline)
    if missing:
        cli.fail(
            f"{path}: the fit run does not reproduce {', '.join(missing)}; "
            "drop them from the recipe, or leave fit out with --runs=trainer,fast"
        )


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if _EVENTS.value:
        fit_worker(_CONFIG.value, _FIT_SEED.value, _EVENTS.value)
        return
    targets = parse_targets()
    if _EVALS.value < 2:
        cli.fail(f"--evals={_EVALS.value}: use 2 or more evaluations per run")
    unknown = sorted(set(_RUNS.value) - set(RUNS))
    if unknown:
        cli.fail(f"--runs: unknown {', '.join(unknown)}; use some of {', '.join(RUNS)}")
    for path in {_CONFIG.value, *([_FAST.value] if "fast" in _RUNS.value else [])}:
        if not os.path.isfile(path):
            cli.fail(
                f"--config: no file {path}; give a recipe such as configs/shapes_quickstart.yaml"
            )
    if "fit" in _RUNS.value:
        check_fit(_CONFIG.value)
    work = _WORK.value or tempfile.mkdtemp(prefix="time_to_accuracy_")
    report = build_report(work, targets)
    sys.stdout.write(
        (json.dumps(report, indent=1) if _JSON.value else format_report(report)) + "\n"
    )


if __name__ == "__main__":
    cli.run(main)
