"""`benchmark.py race`: time to accuracy, the trainer against Keras `fit`, from the command.

Runs, a fresh process per seed each, train their recipe with --evals evaluations:
`fit` (--config through `keras_baseline.fit_recipe`), `trainer` (the trainer on
--config) and `fast` (on --fast_config), timed from the launch to the end of the
first evaluation reaching each of --targets; a row is `fit`'s median time over a
trainer run's (issue 29's targets). Events: metrics.jsonl's records (`fit_recipe`
writes alike), a start, training marks (the trainer's with "input_wait") and
evaluations with their "seconds".
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile
import time

import timing
from timing import REPO, median, number

RUNS = ("fit", "trainer", "fast")
ROW1_TARGET, ROW2_TARGET_NATIVE, ROW2_TARGET = 1.3, 2.0, 1.5


def time_to_target(records, launched: float, target: float, batch: int, examples: int) -> dict:
    """A run's way to `target`, from its events; times in seconds from `launched`.

    Keys: seconds (to the end of the first evaluation at or above the target),
    without_evals (less the evaluations up to it), step, images, epochs (where:
    all None if missed); final_top1, best_top1; startup, compile, evaluation,
    input, steps (`seconds` split, up to the last evaluation if missed); total
    (to the end of the last evaluation). `examples`: training examples per epoch.
    """
    start = next(r["time"] for r in records if r.get("event") == "start")
    evals = [r for r in records if "top1" in r and "time" in r]
    marks = [r for r in records if "time" in r and "event" not in r and "top1" not in r]
    if not evals or len(marks) < 2:
        raise ValueError("a timed run needs evaluations and at least two training marks")
    crossing = next((e for e in evals if e["top1"] >= target), None)
    end = crossing or evals[-1]
    evaluation = sum(e["seconds"] for e in evals if e["step"] <= end["step"])
    intervals, step, clock = [], 0, start  # (mark, steps, its seconds less its evaluations)
    for mark in marks:
        inside = sum(e["seconds"] for e in evals if step <= e["step"] < mark["step"])
        intervals.append((mark, mark["step"] - step, mark["time"] - clock - inside))
        step, clock = mark["step"], mark["time"]
    steady = statistics.median(seconds / steps for _, steps, seconds in intervals[1:])
    compile_seconds = max(0.0, intervals[0][2] - intervals[0][1] * steady)
    waited = None
    if all("input_wait" in mark for mark, _, _ in intervals):
        waited = sum(m["input_wait"] * s for m, _, s in intervals if m["step"] <= end["step"])
    seconds, startup = end["time"] - launched, start - launched
    reached = [seconds, seconds - evaluation, end["step"], end["step"] * batch]
    reached.append(end["step"] * batch / examples)
    found = dict(zip(("seconds", "without_evals", "step", "images", "epochs"), reached))
    return {
        **(found if crossing else dict.fromkeys(found)),
        "final_top1": evals[-1]["top1"],
        "best_top1": max(e["top1"] for e in evals),
        "startup": startup,
        "compile": compile_seconds,
        "evaluation": evaluation,
        "input": waited,
        "steps": seconds - startup - compile_seconds - evaluation - (waited or 0.0),
        "total": evals[-1]["time"] - launched,
    }


def speedup(ours: list[dict], theirs: list[dict], key: str = "seconds") -> float | None:
    """Their median time over ours (`key`: seconds or without_evals); None if one missed."""
    mine, other = median(t[key] for t in ours), median(t[key] for t in theirs)
    return None if mine is None or other is None else other / mine


def resolve_recipe(path: str, dataset: str | None, seed: int = 0, sets: tuple = ()):
    """The recipe's config; `dataset` goes in as the trainer's --dataset does (a layer), and
    `sets` as its --set."""
    from resnet_app import config

    overrides = {"data": {"dataset": dataset}} if dataset else None
    return config.resolve(path, sets=[*sets, f"train.seed={seed}"], overrides=overrides)


@functools.cache  # The parent loads each recipe's data once.
def load_recipe(path: str, dataset: str | None, evals: int, seed: int = 0, sets: tuple = ()):
    """(the resolved config, its `InputPipeline`, how the runs train it: steps rounded
    down to a multiple of `evals`)."""
    from resnet_app.data import input_pipeline
    from resnet_app.engine.plan import plan_run
    from resnet_app.nets.presets import get_config

    resolved = resolve_recipe(path, dataset, seed, sets)
    default = get_config(resolved.model_name).default_image_size
    pipeline = input_pipeline.create_pipeline(resolved.data, default_image_size=default)
    examples = pipeline.epoch_examples(resolved.train.batch_size)
    every = plan_run(resolved, examples, pipeline.preprocessing.image_size).total_steps // evals
    if every < 1:
        timing.fail(f"--evals={evals}: {path} has too few steps for that many; use fewer")
    recipe = dict(path=path, steps=every * evals, eval_every=every, examples=examples)
    return resolved, pipeline, {**recipe, "batch_size": resolved.train.batch_size}


def fit_worker(options: dict) -> dict:
    """The `fit` run, in the worker process: its events to `options["events"]`."""
    import keras_baseline

    recipe = [options[key] for key in ("config", "dataset", "evals", "seed")]
    resolved, pipeline, recipe = load_recipe(*recipe, tuple(options["set"]))
    steps, every, folder = recipe["steps"], recipe["eval_every"], options["fit_input"] == "folder"
    with open(options["events"], "w") as events:
        write = lambda record: print(json.dumps(record), file=events, flush=True)  # noqa: E731
        keras_baseline.fit_recipe(resolved, pipeline, steps, every, write, folder)
    return {}


def launch(run: str, recipe: dict, seed: str, run_dir: str, options: dict) -> tuple[float, str]:
    """Runs one process to its end; (its launch time, the path of its events)."""
    os.makedirs(run_dir, exist_ok=True)
    launched = time.time()
    if run == "fit":
        events = os.path.join(run_dir, "fit_events.jsonl")
        fit = {"config": recipe["path"], "dataset": options["dataset"], "evals": options["evals"]}
        fit.update(seed=int(seed), events=events, set=options["set"])
        fit.update(fit_input=options["fit_input"])
        script = os.path.join(REPO, "scripts", "benchmark.py")
        timing.run_child([script, "worker", "fit", json.dumps(fit)])
        return launched, events
    args = [f"--config={recipe['path']}", f"--train_steps={recipe['steps']}", f"--seed={seed}"]
    args += [f"--eval_every={recipe['eval_every']}", f"--log_every={recipe['eval_every']}"]
    args += [f"--model_dir={run_dir}", "--restart", *(f"--set={s}" for s in options["set"])]
    args += [f"--dataset={options['dataset']}"] if options["dataset"] else []
    timing.run_trainer("fp32", args)
    return launched, os.path.join(run_dir, "metrics.jsonl")


def key(target: float) -> str:
    """A target as the report's keys spell it: 0.92 -> "0.92"."""
    return f"{target:g}"


def race(options: dict) -> dict:
    """Checks the flags, runs every kind of run per seed, in rounds; the report."""
    targets, runs = parse_targets(options["targets"]), options["runs"]
    if options["evals"] < 2:
        timing.fail(f"--evals={options['evals']}: use 2 or more evaluations per run")
    unknown = sorted(set(runs) - set(RUNS))
    if unknown:
        timing.fail(f"--runs: unknown {', '.join(unknown)}; use some of {', '.join(RUNS)}")
    paths = {run: options["fast_config"] if run == "fast" else options["config"] for run in runs}
    for path in {path for path in paths.values() if not os.path.isfile(path)}:
        timing.fail(f"--config: no file {path}; give a recipe, e.g. configs/shapes_quickstart.yaml")
    dataset, evals, cpu = options["dataset"], options["evals"], timing.cpu()
    sets = tuple(options["set"])
    if "fit" in runs:
        check_fit(options["config"], dataset, evals, sets)
    from resnet_app.data.sources import folder

    if options["fit_input"] == "folder" and not (dataset or "").startswith(folder.PREFIX):
        timing.fail(f"--fit_input=folder reads --dataset={folder.PREFIX}DIR, not {dataset}")
    recipes = {run: load_recipe(path, dataset, evals, 0, sets)[2] for run, path in paths.items()}
    work = options["work_dir"] or tempfile.mkdtemp(prefix="race_")

    def measure(seed, run):  # Seed by seed, every run: a slow spell hits them all.
        recipe, run_dir = recipes[run], os.path.join(work, f"{run}_{seed}")
        launched, events = launch(run, recipe, seed, run_dir, options)
        records = timing.read_records(events)
        return {
            key(t): time_to_target(records, launched, t, recipe["batch_size"], recipe["examples"])
            for t in targets
        }

    found = {(seed, run): measure(seed, run) for seed in options["seeds"] for run in runs}
    timings = {
        run: {key(t): [found[s, run][key(t)] for s in options["seeds"]] for t in targets}
        for run in runs
    }
    report = {"cpu": cpu.describe(), "dataset": dataset, "targets": targets, "evals": evals}
    report.update(seeds=options["seeds"], recipes=recipes, runs=timings)
    report["medians"] = {
        run: {k: medians(ts) for k, ts in by.items()} for run, by in timings.items()
    }
    return {**report, "rows": rows(timings, targets, cpu.native_bf16)}


def medians(timings: list[dict]) -> dict:
    """The median times over seeds to one target; None when a seed missed it."""
    found = {k: median(t[k] for t in timings) for k in ("seconds", "without_evals")}
    return {**found, "missed": sum(t["seconds"] is None for t in timings)}


def rows(timings: dict, targets: list[float], native_bf16: bool) -> list[dict]:
    """Issue 29's rows, one per target: each trainer run's speed-up over `fit`."""
    goals = {
        "trainer": ("1: trainer / fit, the same recipe", ROW1_TARGET),
        "fast": ("2: fast / fit", ROW2_TARGET_NATIVE if native_bf16 else ROW2_TARGET),
    }
    found = []
    for target in targets:
        for run, (name, goal) in goals.items():
            if "fit" not in timings or run not in timings:
                continue
            ours, theirs = timings[run][key(target)], timings["fit"][key(target)]
            ratio, without = speedup(ours, theirs), speedup(ours, theirs, "without_evals")
            met = None if ratio is None else ratio >= goal  # On the whole wall time.
            row = dict(row=name, accuracy=target, ratio=ratio, without_evals=without, met=met)
            found.append({**row, "target": goal})
    return found


def percent(target: float) -> str:
    return f"{100 * target:.1f}%"


HEADER = "run,recipe,seed,target,to target,w/o evals,step,epochs,final"
HEADER += ",start,compile,eval,input,steps"
FORMS = {"seconds": ".1f", "without_evals": ".1f", "step": "d", "epochs": ".2f"}


def text(report: dict) -> str:
    """A table of every run, seed and target; then the medians and the rows."""
    table = []
    for run, by_target in report["runs"].items():
        recipe = os.path.basename(report["recipes"][run]["path"])
        for index, seed in enumerate(report["seeds"]):
            for target in report["targets"]:
                t = by_target[key(target)][index]
                reached = [number(t[k], form) for k, form in FORMS.items()]
                split = [number(t[k]) for k in ("startup", "compile", "evaluation", "input")]
                final = f"{100 * t['final_top1']:.2f}%"
                row = [run, recipe, seed, percent(target), *reached, final, *split]
                table.append([*row, number(t["steps"])])
    targets = ", ".join(percent(t) for t in report["targets"])
    lines = [f"CPU: {report['cpu']}"]
    lines += [f"dataset: {report['dataset']}"] if report.get("dataset") else []
    lines += [
        f"targets: top-1 >= {targets}; {report['evals']} evaluations per run; "
        "seconds from the launch",
        "",
        timing.markdown_table(HEADER.split(","), table),
        f"\nmedian over seeds {', '.join(report['seeds'])}, seconds to the target:",
    ]
    for target in report["targets"]:
        parts = []
        for run, by_target in report["medians"].items():
            found, seeds = by_target[key(target)], len(report["seeds"])
            seconds, without = found["seconds"], found["without_evals"]
            missed = f"{run} missed it ({found['missed']} of {seeds})"
            parts.append(
                missed if found["missed"] else f"{run} {seconds:.1f} ({without:.1f} w/o evals)"
            )
        lines.append(f"  {percent(target)}: " + ", ".join(parts))
    for row in report["rows"]:
        name = f"row {row['row']}, top-1 >= {percent(row['accuracy'])}"
        if row["ratio"] is None:
            lines.append(f"{name}: a run missed the target")
            continue
        lines.append(
            f"{name}: {row['ratio']:.2f}x to the target, {row['without_evals']:.2f}x without the "
            f"evaluations (target >= {row['target']}x: {'met' if row['met'] else 'missed'})"
        )
    return "\n".join(lines)


def parse_targets(given: str) -> list[float]:
    """--targets as top-1s in (0, 1), ascending, each once."""
    targets = set()
    for item in given.split(","):
        try:
            target = float(item)
        except ValueError:
            target = None
        if target is None or not 0 < target < 1:
            timing.fail(f"--targets={given}: {item!r} is not a top-1 in (0, 1); e.g. 0.9,0.92")
        targets.add(target)
    return sorted(targets)


def check_fit(path: str, dataset: str | None, evals: int, sets: tuple = ()) -> None:
    """Refuses a recipe `fit` would not reproduce: its settings first, then its data."""
    import keras_baseline

    missing = keras_baseline.unmirrored(resolve_recipe(path, dataset, 0, sets))
    if not missing:  # Only then load the data, for what only it tells.
        resolved, pipeline, _ = load_recipe(path, dataset, evals, 0, sets)
        missing = keras_baseline.unmirrored(resolved, pipeline)
    if missing:
        timing.fail(
            f"{path}: the fit run does not reproduce {', '.join(missing)}; "
            "drop them from the recipe, or leave fit out with --runs=trainer,fast"
        )


def add_parser(commands) -> None:
    sub = commands.add_parser("race", help="time to accuracy: the trainer against Keras fit")
    listed = lambda text: text.split(",")  # noqa: E731
    sub.add_argument("--config", default="configs/shapes_quickstart.yaml", help="the recipe")
    sub.add_argument("--fast_config", default="configs/shapes_fast.yaml", help="the fastest")
    sub.add_argument("--targets", default="0.85", help="the top-1s to reach, each in (0, 1)")
    sub.add_argument("--dataset", help="replaces data.dataset in every run's recipe")
    sub.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    sub.add_argument(
        "--fit_input",
        choices=("arrays", "folder"),
        default="arrays",
        help="fit's input: the trainer's decoded splits, or folder:DIR read by "
        "Keras's image_dataset_from_directory and .cache()",
    )
    sub.add_argument("--evals", type=int, default=10, help="evaluations per run, at even steps")
    sub.add_argument("--seeds", type=listed, default=["0"], help="training seeds, in rounds")
    sub.add_argument("--runs", type=listed, default=list(RUNS), help="some of fit, trainer, fast")
    sub.add_argument("--work_dir", help="where the runs go (default: a temp dir)")
    sub.add_argument("--json", action="store_true", help="one JSON object, not a table")
    sub.set_defaults(rounds=1)
