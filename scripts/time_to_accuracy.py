"""Time to accuracy: the trainer against Keras `fit`, timed from the command to a target.

    python scripts/time_to_accuracy.py                          # shapes, test top-1 >= 85%
    python scripts/time_to_accuracy.py --target=0.88 --seeds=0,1,2 --json

Each run is one fresh process, timed from its launch (imports, data loading,
model building, compiling, input, steps and evaluations all count) to the end
of the first evaluation whose test top-1 reaches --target. Every run trains
its recipe to the end, with --evals evaluations of the whole test split at
even steps (close enough to see the crossing), so each also reports its final
accuracy. A recipe's steps are rounded down to a multiple of --evals, the
same for every run of that recipe. The runs:
- `fit`: --config's recipe with Keras, written as a user would
  (`fit_worker`): the same network with Keras's stock BatchNormalization
  (`keras_baseline.py`), `keras.optimizers.SGD(momentum, nesterov)`, the
  L2 penalty as the layers' kernel regularizers, from-logits cross-entropy
  (label smoothing through one-hot targets), the training images through
  `tf.data` (shuffle, `map` with resize, normalize, pad and random crop,
  flip and Cutout as the recipe asks, batch, prefetch), `fit` with
  `steps_per_epoch` set to the steps between evaluations and the test split
  as `validation_data`, and Keras's default `jit_compile="auto"`. The
  learning rate is the recipe's, step by step: Keras's `LearningRateScheduler`
  callback sets it once per epoch, which would turn the recipe's per-step
  warmup and decay into a staircase, so `fit` gets the same per-step rates as
  a `LearningRateSchedule` (Keras's form of a per-step schedule). Recipes
  with parts `fit` does not mirror here are refused, naming them.
- `trainer`: `python -m resnet_app.train` on the same --config.
- `fast`: `python -m resnet_app.train` on --fast_config, the trainer's
  fastest recipe (progressive resizing, `train.precision: auto`, ...).
Rows: (1) `trainer` against `fit`, the same recipe; (2) `fast` against
`fit`. A ratio is `fit`'s time over the trainer's; with several --seeds, of
the medians. Also shown without the evaluations, which are this
measurement's probes (the same number in every run) more than the recipe's.

Where the time goes, up to the crossing: start-up (launch to the first step),
the first call's compile (the first interval's excess over the steady
per-step time), evaluation, the trainer's wait for input (its records'
`input_wait`), and the steps (the rest, with later compiles such as a new
image size's). The CPU line says which kind of machine this is: compare
ratios, never absolute times across machines.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # keras_baseline

from absl import flags, logging  # noqa: E402

from resnet_app.common import cli  # noqa: E402

_CONFIG = flags.DEFINE_string("config", "configs/shapes_quickstart.yaml", "The plain recipe.")
_FAST = flags.DEFINE_string("fast_config", "configs/shapes_fast.yaml", "The trainer's fastest.")
_TARGET = flags.DEFINE_float("target", 0.85, "The test top-1 to reach, in (0, 1).")
_EVALS = flags.DEFINE_integer("evals", 10, "Evaluations per run, at even steps.")
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Training seeds; each run is repeated per seed.")
_RUNS = flags.DEFINE_list("runs", ["fit", "trainer", "fast"], "Runs: fit, trainer, fast.")
_WORK = flags.DEFINE_string("work_dir", None, "Where the runs go (default: a temp dir).")
_JSON = flags.DEFINE_boolean("json", False, "Print one JSON object instead of a table.")
_WORKER = flags.DEFINE_string("worker", None, "Internal: `fit`, writing events to this path.")
_STEPS = flags.DEFINE_integer("train_steps", None, "Internal: the fit worker's steps.")
_SEED = flags.DEFINE_integer("seed", 0, "Internal: the fit worker's seed.")

RUNS = ("fit", "trainer", "fast")
# The row targets of issue 29: row 1 at any CPU; row 2 by whether bf16 is native.
ROW1_TARGET, ROW2_TARGET_NATIVE, ROW2_TARGET = 1.3, 2.0, 1.5
# What `fit_worker` mirrors of a recipe: settings outside these, changed from
# their defaults, are refused (`unmirrored`). Model keys go to the same model
# builder; the schedule becomes a table of per-step rates.
MIRRORED = (
    "model.",
    "schedule.",
    "data.dataset",
    "data.image_size",
    "data.mean",
    "data.std",
    "data.dtype",
    "data.seed",
    "data.augment.crop_padding",
    "data.augment.flip",
    "data.augment.cutout_size",
    "optimizer.class",
    "optimizer.learning_rate",
    "optimizer.momentum",
    "optimizer.nesterov",
    "train.batch_size",
    "train.epochs",
    "train.train_steps",
    "train.eval_every",
    "train.log_every",
    "train.steps_per_loop",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.seed",
    "train.label_smoothing",
    "train.precision",
    "train.eval_batch_size",
)


# -- a recipe's length, and what fit can mirror of it --------------------------------


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A config file as the runs train it: its steps and evaluation interval."""

    path: str
    steps: int
    eval_every: int
    batch_size: int
    examples: int


def load_recipe(path: str, evals: int):
    """(the resolved config, its `Recipe`): the steps rounded down to a multiple of `evals`."""
    from resnet_app import config
    from resnet_app.data import input_pipeline
    from resnet_app.engine.plan import plan_run
    from resnet_app.nets.presets import get_config

    resolved = config.resolve(path)
    pipeline = input_pipeline.create_pipeline(
        resolved.data, default_image_size=get_config(resolved.model_name).default_image_size
    )
    plan = plan_run(resolved, pipeline.num_train_examples, pipeline.preprocessing.image_size)
    every = plan.total_steps // evals
    if every < 1:
        cli.fail(f"--evals={evals}: {path} has only {plan.total_steps} steps; use fewer")
    return resolved, pipeline, plan, Recipe(
        path, every * evals, every, resolved.train.batch_size, pipeline.num_train_examples
    )


def unmirrored(resolved) -> list[str]:
    """The recipe's settings that `fit_worker` does not reproduce."""
    from resnet_app import config
    from resnet_app.config.differences import changes

    found = [
        key
        for key in changes(config.resolve(), resolved)
        if not any(key == m or (m.endswith(".") and key.startswith(m)) for m in MIRRORED)
    ]
    if resolved.data.dataset != "shapes":
        found.append(f"data.dataset={resolved.data.dataset} (fit here reads shapes)")
    if resolved.optimizer.to_dict().get("class") not in ("momentum", "sgd"):
        found.append(f"optimizer.class={resolved.optimizer.to_dict().get('class')}")
    if resolved.train.precision == "fp16":
        found.append("train.precision=fp16")
    return found


# -- the fit worker: the recipe written with Keras as a user would ---------------------


def fit_worker(path: str, train_steps: int, seed: int, events_path: str) -> None:
    """Trains `path`'s recipe with `model.fit`, writing events like `metrics.jsonl`'s."""
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_baseline import baseline_model
    from resnet_app.data import shapes
    from resnet_app.nets import factory

    resolved, pipeline, plan, recipe = load_recipe(path, _EVALS.value)
    missing = unmirrored(resolved)
    if missing:
        cli.fail(f"{path}: fit does not mirror {', '.join(missing)}; drop them or use --runs")
    events = open(events_path, "w")

    def write(record: dict) -> None:
        events.write(json.dumps(record) + "\n")
        events.flush()

    prep = pipeline.preprocessing
    size, augment = prep.image_size, prep.augment
    mean, std = np.asarray(prep.mean, np.float32), np.asarray(prep.std, np.float32)
    batch, classes = resolved.train.batch_size, pipeline.num_classes
    smoothing = resolved.train.label_smoothing
    keras.utils.set_random_seed(seed)

    def prepare(image, label):  # Resize and normalize, as the trainer's pipeline does.
        image = tf.image.resize(tf.cast(image, tf.float32), [size, size])
        image = (image - mean) / std
        return image, (tf.one_hot(label, classes) if smoothing else label)

    def random_augment(image, label):
        if augment.crop_padding:
            pad = augment.crop_padding
            image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
            image = tf.image.random_crop(image, [size, size, 3])
        if augment.flip:
            image = tf.image.random_flip_left_right(image)
        if augment.cutout_size:
            side = augment.cutout_size
            top, left = tf.unstack(tf.random.uniform([2], 0, size - side + 1, tf.int32))
            inside = tf.pad(tf.ones([side, side, 1]), [[top, size - side - top], [left, size - side - left], [0, 0]])
            image = image * (1 - inside)
        return image, label

    images, labels = shapes.load("train", seed=resolved.data.seed)
    test_images, test_labels = shapes.load("test", seed=resolved.data.seed)
    train = (
        tf.data.Dataset.from_tensor_slices((images, labels.astype(np.int32)))
        .shuffle(len(images), seed=seed)
        .repeat()
        .map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
        .map(random_augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    test = (
        tf.data.Dataset.from_tensor_slices((test_images, test_labels.astype(np.int32)))
        .map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(resolved.train.eval_batch_size or batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    rates = [plan.schedule(step, plan.steps_per_epoch) for step in range(train_steps)]

    class StepRates(keras.optimizers.schedules.LearningRateSchedule):
        """The recipe's learning rate of each step."""

        def __init__(self, values):
            self.values = tf.constant(values, tf.float32)

        def __call__(self, step):
            last = tf.shape(self.values)[0] - 1
            return tf.gather(self.values, tf.minimum(tf.cast(step, tf.int32), last))

    options = resolved.optimizer.to_dict()
    model = baseline_model(
        lambda: factory.create_run_model(resolved, classes, size, resolved.train.precision)
    )
    cross_entropy = (
        keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing)
        if smoothing
        else keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.compile(
        optimizer=keras.optimizers.SGD(
            StepRates(rates),
            momentum=options.get("momentum", 0.0),
            nesterov=bool(options.get("nesterov")),
        ),
        loss=cross_entropy,
        metrics=["accuracy"],
    )
    every = recipe.eval_every

    class Clock(keras.callbacks.Callback):
        """The events: the start, the first step, each interval's end, each evaluation."""

        def __init__(self):
            super().__init__()
            self.epoch, self.test_started = 0, 0.0

        def on_train_begin(self, logs=None):
            write({"step": 0, "event": "start", "time": time.time()})

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, index, logs=None):
            if (self.epoch == 0 and index == 0) or index == every - 1:
                write({"step": self.epoch * every + index + 1, "time": time.time()})

        def on_test_begin(self, logs=None):
            self.test_started = time.monotonic()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.monotonic() - self.test_started
            top1 = float(logs["val_accuracy"])
            write({"step": (epoch + 1) * every, "top1": top1, "time": time.time(), "seconds": seconds})

    model.fit(
        train,
        epochs=train_steps // every,
        steps_per_epoch=every,
        validation_data=test,
        callbacks=[Clock()],
        verbose=0,
    )
    events.close()


# -- running and reading the runs ----------------------------------------------------


@dataclasses.dataclass
class Timing:
    """One run's way to the target, from its events."""

    run: str
    recipe: str
    seed: str
    seconds: float | None  # Launch to the end of the crossing evaluation (None: missed).
    without_evals: float | None
    step: int | None
    images: int | None
    epochs: float | None
    final_top1: float
    best_top1: float
    startup: float
    compile: float
    evaluation: float
    input: float | None
    steps: float | None
    total: float  # Launch to the end of the run's last evaluation.


def launch(run: str, recipe: Recipe, seed: str, run_dir: str) -> tuple[float, str]:
    """Runs one process; returns (its launch time, the path of its events)."""
    os.makedirs(run_dir, exist_ok=True)
    if run == "fit":
        events = os.path.join(run_dir, "fit_events.jsonl")
        command = [sys.executable, os.path.abspath(__file__), "--worker=fit"]
        command += [f"--config={recipe.path}", f"--train_steps={recipe.steps}"]
        command += [f"--evals={_EVALS.value}", f"--seed={seed}", f"--work_dir={events}"]
    else:
        events = os.path.join(run_dir, "metrics.jsonl")
        command = [sys.executable, "-m", "resnet_app.train", f"--config={recipe.path}"]
        command += [f"--train_steps={recipe.steps}", f"--eval_every={recipe.eval_every}"]
        command += [f"--log_every={recipe.eval_every}", f"--seed={seed}"]
        command += [f"--model_dir={run_dir}", "--restart"]
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"}
    logging.info("%s, seed %s: %s", run, seed, " ".join(command))
    started = time.time()
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
    if completed.returncode:
        tail = " | ".join(completed.stderr.strip().splitlines()[-3:])
        cli.fail(f"the {run} run failed: {tail}")
    return started, events


def timing(run: str, recipe: Recipe, seed: str, launched: float, path: str) -> Timing:
    """Reads a run's events: when it crossed the target, and where its time went."""
    with open(path) as f:
        records = [json.loads(line) for line in f]
    start = next(r["time"] for r in records if r.get("event") == "start")
    marks = [r for r in records if "time" in r and "event" not in r and "top1" not in r]
    evals = [r for r in records if "top1" in r and "time" in r]
    crossing = next((e for e in evals if e["top1"] >= _TARGET.value), None)
    end = crossing or evals[-1]
    evaluation = sum(e["seconds"] for e in evals if e["step"] <= end["step"])
    # Each interval's training seconds: its wall time less the evaluations in it.
    intervals, previous = [], (0, start)
    for mark in marks:
        inside = sum(e["seconds"] for e in evals if previous[0] <= e["step"] < mark["step"])
        steps = mark["step"] - previous[0]
        intervals.append((mark, steps, mark["time"] - previous[1] - inside))
        previous = (mark["step"], mark["time"])
    steady = statistics.median(seconds / steps for _, steps, seconds in intervals[1:])
    first_steps, first_seconds = intervals[0][1], intervals[0][2]
    compile_seconds = max(0.0, first_seconds - first_steps * steady)
    waits = [m.get("input_wait") for m, _, _ in intervals]
    waited = None
    if all(w is not None for w in waits):
        waited = sum(w * s for (m, _, s), w in zip(intervals, waits) if m["step"] <= end["step"])
    seconds = end["time"] - launched
    startup = start - launched
    rest = seconds - startup - compile_seconds - evaluation - (waited or 0.0)
    reached = crossing is not None
    return Timing(
        run=run,
        recipe=os.path.basename(recipe.path),
        seed=seed,
        seconds=seconds if reached else None,
        without_evals=seconds - evaluation if reached else None,
        step=crossing["step"] if reached else None,
        images=crossing["step"] * recipe.batch_size if reached else None,
        epochs=crossing["step"] * recipe.batch_size / recipe.examples if reached else None,
        final_top1=evals[-1]["top1"],
        best_top1=max(e["top1"] for e in evals),
        startup=startup,
        compile=compile_seconds,
        evaluation=evaluation,
        input=waited,
        steps=rest,
        total=evals[-1]["time"] - launched,
    )


def median_of(timings: list[Timing], key: str) -> float | None:
    values = [getattr(t, key) for t in timings]
    return None if any(v is None for v in values) else statistics.median(values)


def row(name: str, fast: list[Timing], base: list[Timing], target: float) -> dict:
    """A row: the base's median time over the run's, with and without evaluations."""
    ratios = {}
    for key in ("seconds", "without_evals"):
        ours, theirs = median_of(fast, key), median_of(base, key)
        ratios[key] = theirs / ours if ours and theirs else None
    met = None if ratios["seconds"] is None else ratios["without_evals"] >= target
    return {"row": name, "ratio": ratios["seconds"], "ratio_without_evals": ratios["without_evals"],
            "target": target, "met": met}


def build_report(work: str) -> dict:
    from resnet_app.common import hardware

    cpu = hardware.read_cpu_info()
    recipes = {}
    for run in _RUNS.value:
        path = _FAST.value if run == "fast" else _CONFIG.value
        recipes[run] = load_recipe(path, _EVALS.value)[3]
    timings: dict[str, list[Timing]] = {run: [] for run in _RUNS.value}
    for seed in _SEEDS.value:  # In rounds, so that a slow spell of the machine hits all runs.
        for run in _RUNS.value:
            launched, events = launch(run, recipes[run], seed, os.path.join(work, f"{run}_{seed}"))
            timings[run].append(timing(run, recipes[run], seed, launched, events))
            logging.info("%s", timings[run][-1])
    rows = []
    if "fit" in timings and "trainer" in timings:
        rows.append(row("1: trainer / fit, same recipe", timings["trainer"], timings["fit"], ROW1_TARGET))
    if "fit" in timings and "fast" in timings:
        target = ROW2_TARGET_NATIVE if cpu.native_bf16 else ROW2_TARGET
        rows.append(row("2: fast / fit", timings["fast"], timings["fit"], target))
    return {
        "cpu": cpu.describe(),
        "target": _TARGET.value,
        "evals": _EVALS.value,
        "recipes": {run: dataclasses.asdict(r) for run, r in recipes.items()},
        "runs": {run: [dataclasses.asdict(t) for t in ts] for run, ts in timings.items()},
        "rows": rows,
    }


def _seconds(value: float | None) -> str:
    return "missed" if value is None else f"{value:.1f}"


def format_report(report: dict) -> str:
    lines = [
        f"CPU: {report['cpu']}",
        f"target: test top-1 >= {100 * report['target']:.1f}%, {report['evals']} evaluations per run",
        f"{'run':<8}{'recipe':<24}{'seed':>5}{'to target s':>12}{'w/o evals':>10}{'step':>6}"
        f"{'epochs':>7}{'final':>8}{'start':>7}{'compile':>8}{'eval':>6}{'input':>6}{'steps':>7}",
    ]
    for run, timings in report["runs"].items():
        for t in timings:
            waited = "-" if t["input"] is None else f"{t['input']:.1f}"
            steps = "-" if t["step"] is None else str(t["step"])
            epochs = "-" if t["epochs"] is None else f"{t['epochs']:.2f}"
            lines.append(
                f"{run:<8}{t['recipe']:<24}{t['seed']:>5}{_seconds(t['seconds']):>12}"
                f"{_seconds(t['without_evals']):>10}{steps:>6}{epochs:>7}"
                f"{100 * t['final_top1']:>7.2f}%{t['startup']:>7.1f}{t['compile']:>8.1f}"
                f"{t['evaluation']:>6.1f}{waited:>6}{t['steps']:>7.1f}"
            )
    for r in report["rows"]:
        if r["ratio"] is None:
            lines.append(f"row {r['row']}: a run missed the target")
            continue
        verdict = "met" if r["met"] else "missed"
        lines.append(
            f"row {r['row']}: {r['ratio']:.2f}x to the target, {r['ratio_without_evals']:.2f}x "
            f"without the evaluations (target >= {r['target']}x: {verdict})"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if _WORKER.value == "fit":
        fit_worker(_CONFIG.value, _STEPS.value, _SEED.value, _WORK.value)
        return
    if not 0 < _TARGET.value < 1:
        cli.fail(f"--target={_TARGET.value}: give a top-1 in (0, 1), e.g. 0.85")
    unknown = sorted(set(_RUNS.value) - set(RUNS))
    if unknown:
        cli.fail(f"--runs: unknown {', '.join(unknown)}; use some of {', '.join(RUNS)}")
    if "fit" in _RUNS.value:
        from resnet_app import config

        missing = unmirrored(config.resolve(_CONFIG.value))
        if missing:
            cli.fail(f"{_CONFIG.value}: fit does not mirror {', '.join(missing)}; drop them")
    import tempfile

    work = _WORK.value or tempfile.mkdtemp(prefix="time_to_accuracy_")
    report = build_report(work)
    text = json.dumps(report, indent=1) if _JSON.value else format_report(report)
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    cli.run(main)
