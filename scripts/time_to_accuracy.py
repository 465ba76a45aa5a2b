"""Time to accuracy: the trainer against Keras `fit`, timed from the command to a target.

    python scripts/time_to_accuracy.py                          # shapes, test top-1 >= 85%
    python scripts/time_to_accuracy.py --target=0.9 --seeds=0,1,2 --json

Each run is one fresh process, timed from its launch (imports, data loading,
model building, compiling, input, steps and evaluations all count) to the end
of the first evaluation whose test top-1 reaches --target. Every run trains
its recipe to the end with --evals evaluations of the test split at even
steps (close enough to see the crossing), so each also reports its final
accuracy. A recipe's steps are rounded down to a multiple of --evals, the
same for every run of it. The runs:
- `fit`: --config's recipe with Keras `fit`, written as a user would
  (`keras_baseline.fit_recipe`: Keras's stock layers, SGD, `tf.data`, the
  recipe's per-step learning rate, the test split as `validation_data`);
- `trainer`: `python -m resnet_app.train` on the same --config;
- `fast`: `python -m resnet_app.train` on --fast_config, the trainer's
  fastest recipe (progressive resizing, `train.precision: auto`, ...).
Rows: (1) `trainer` against `fit`, the same recipe; (2) `fast` against `fit`.
A ratio is `fit`'s median time over the trainer's (over --seeds, run in
rounds so that a slow spell of the machine hits every run), judged against
issue 29's targets on the whole wall time; also shown without the
evaluations, which are this measurement's probes (as many in every run) more
than the recipe's. Each run's time is split into start-up, the first call's
compile, evaluation, input and steps (`run_timing.py`). The CPU line says
which kind of machine this is: compare ratios, never times across machines.
"""

from __future__ import annotations

import dataclasses
import json
import os
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
_TARGET = flags.DEFINE_float("target", 0.85, "The test top-1 to reach, in (0, 1).")
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


def load_recipe(path: str, seed: int = 0):
    """(the resolved config, its `InputPipeline`, its `Recipe`).

    The recipe's steps are rounded down to a multiple of --evals.
    """
    from resnet_app import config
    from resnet_app.data import input_pipeline
    from resnet_app.engine.plan import plan_run
    from resnet_app.nets.presets import get_config

    resolved = config.resolve(path, sets=[f"train.seed={seed}"])
    pipeline = input_pipeline.create_pipeline(
        resolved.data, default_image_size=get_config(resolved.model_name).default_image_size
    )
    plan = plan_run(resolved, pipeline.num_train_examples, pipeline.preprocessing.image_size)
    every = plan.total_steps // _EVALS.value
    if every < 1:
        cli.fail(f"--evals={_EVALS.value}: {path} has only {plan.total_steps} steps; use fewer")
    steps = every * _EVALS.value
    return (
        resolved,
        pipeline,
        Recipe(path, steps, every, resolved.train.batch_size, pipeline.num_train_examples),
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
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    logging.info("%s, seed %s: %s", run, seed, " ".join(command))
    launched = time.time()
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    if completed.returncode:
        tail = " | ".join(completed.stderr.strip().splitlines()[-3:])
        cli.fail(f"the {run} run (seed {seed}) failed: {tail}")
    return launched, events


def build_report(work: str) -> dict:
    from resnet_app.common import hardware

    cpu = hardware.read_cpu_info()
    paths = {run: _FAST.value if run == "fast" else _CONFIG.value for run in _RUNS.value}
    loaded = {path: load_recipe(path)[2] for path in set(paths.values())}
    recipes = {run: loaded[path] for run, path in paths.items()}
    timings: dict[str, list[run_timing.Timing]] = {run: [] for run in _RUNS.value}
    for seed in _SEEDS.value:  # In rounds: a slow spell of the machine hits every run.
        for run in _RUNS.value:
            recipe = recipes[run]
            launched, events = launch(run, recipe, seed, os.path.join(work, f"{run}_{seed}"))
            result = run_timing.timing(
                run_timing.read_events(events),
                launched,
                _TARGET.value,
                recipe.batch_size,
                recipe.examples,
            )
            timings[run].append(result)
            logging.info("%s, seed %s: %s", run, seed, result)
    rows = []
    targets = {
        "trainer": ("1: trainer / fit, the same recipe", ROW1_TARGET),
        "fast": (
            "2: fast / fit",
            ROW2_TARGET_NATIVE if cpu.native_bf16 else ROW2_TARGET,
        ),
    }
    for run, (name, target) in targets.items():
        if "fit" in timings and run in timings:
            ratio = run_timing.speedup(timings[run], timings["fit"])
            without = run_timing.speedup(timings[run], timings["fit"], "without_evals")
            met = None if ratio is None else ratio >= target  # On the whole wall time.
            rows.append(
                {
                    "row": name,
                    "ratio": ratio,
                    "without_evals": without,
                    "target": target,
                    "met": met,
                }
            )
    return {
        "cpu": cpu.describe(),
        "target": _TARGET.value,
        "evals": _EVALS.value,
        "seeds": _SEEDS.value,
        "recipes": {run: dataclasses.asdict(r) for run, r in recipes.items()},
        "runs": {run: [dataclasses.asdict(t) for t in ts] for run, ts in timings.items()},
        "rows": rows,
    }


def _number(value: float | None, form: str = ".1f") -> str:
    return "-" if value is None else format(value, form)


def format_report(report: dict) -> str:
    lines = [
        f"CPU: {report['cpu']}",
        f"target: test top-1 >= {100 * report['target']:.1f}%; {report['evals']} evaluations "
        "per run; seconds from the launch",
        f"{'run':<8}{'recipe':<24}{'seed':>5}{'to target':>10}{'w/o evals':>10}{'step':>6}"
        f"{'epochs':>7}{'final':>8}{'start':>7}{'compile':>8}{'eval':>6}{'input':>6}{'steps':>7}",
    ]
    for run, timings in report["runs"].items():
        recipe = os.path.basename(report["recipes"][run]["path"])
        for seed, t in zip(report["seeds"], timings):
            lines.append(
                f"{run:<8}{recipe:<24}{seed:>5}{_number(t['seconds']):>10}"
                f"{_number(t['without_evals']):>10}{_number(t['step'], 'd'):>6}"
                f"{_number(t['epochs'], '.2f'):>7}{100 * t['final_top1']:>7.2f}%"
                f"{t['startup']:>7.1f}{t['compile']:>8.1f}{t['evaluation']:>6.1f}"
                f"{_number(t['input']):>6}{t['steps']:>7.1f}"
            )
    for row in report["rows"]:
        if row["ratio"] is None:
            lines.append(f"row {row['row']}: a run missed the target")
            continue
        verdict = "met" if row["met"] else "missed"
        lines.append(
            f"row {row['row']}: {row['ratio']:.2f}x to the target, {row['without_evals']:.2f}x "
            f"without the evaluations (target >= {row['target']}x: {verdict})"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if _EVENTS.value:
        fit_worker(_CONFIG.value, _FIT_SEED.value, _EVENTS.value)
        return
    if not 0 < _TARGET.value < 1:
        cli.fail(f"--target={_TARGET.value}: give a test top-1 in (0, 1), e.g. 0.85")
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
        from resnet_app import config

        missing = keras_baseline.unmirrored(config.resolve(_CONFIG.value))
        if missing:
            cli.fail(
                f"{_CONFIG.value}: the fit run does not reproduce {', '.join(missing)}; "
                "drop them from the recipe, or leave fit out with --runs=trainer,fast"
            )
    work = _WORK.value or tempfile.mkdtemp(prefix="time_to_accuracy_")
    report = build_report(work)
    sys.stdout.write(
        (json.dumps(report, indent=1) if _JSON.value else format_report(report)) + "\n"
    )


if __name__ == "__main__":
    cli.run(main)
