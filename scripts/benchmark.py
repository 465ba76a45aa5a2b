"""The benchmarks, one command: `python scripts/benchmark.py SUBCOMMAND [options]`.

    step       training images/s: Keras `fit` against the trainer's variants; input; start-up
    revisions  the trainer of a git revision beside the working tree's, in one run
    limit      where the trainer's step goes, by kind of op, against the matmul peak
    race       time to accuracy: the trainer against Keras `fit` (`race.py`)
    sync       all-reduce against local SGD (`sync_costs.py`)
    report     `resnet-app report` against `evaluate`, launch to exit (`report_cost.py`)
    hf         a recipe on IDX files against the same images via `hf:` (`hf_cost.py`)

    python scripts/benchmark.py step --model=resnet50 --image_size=224 --batch_size=32 --steps=3
    python scripts/benchmark.py step --variants=input --set=data.augment.randaugment_ops=2
    python scripts/benchmark.py revisions --before=d94b0ee --variants=fp32,bf16 --rounds=3

A rate is the median of --windows windows of --steps steps after a warm-up
window, each measurement a process of its own, in --rounds rounds (`timing.py`).
`step` rates each variant against `keras_fit` (Keras's stock layers and `fit`, as
a user writes them: `keras_baseline.py`), in GFLOP/s against a matmul peak of the
same run. The trainer's rows run `python -m resnet_app.train`, so `revisions` times
a revision's trainer, each side against a `keras_fit` timed beside it (cancelling
most of the machine's drift), sides alternating round by round.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time

import hf_cost
import keras_baseline
import race
import report_cost
import step_limit
import sync_costs
import timing
from timing import REPO, median, number

import resnet_app

# The trainer's variants: --set assignments on top of the common settings.
TRAINER_VARIANTS = {
    "fp32": [],
    "bf16": ["train.precision=bf16"],
    "fp16": ["train.precision=fp16"],
    "jit": ["train.jit=true"],
    "towers2": ["train.num_towers=2"],
    "ema": ["train.ema_decay=0.999"],
    "drop_path": ["model.drop_path_rate=0.1"],
    "bce": ["train.loss=bce"],
    "last_step": [],  # The copy of the last step multi-worker runs keep, in one process.
}
KERAS_VARIANTS = ("keras_fit", "keras_fit_nojit", "keras_fit_our_layers")
MODEL_PREFIX = "model:"  # The fp32 row of another preset at the same size and batch.
OTHERS = ("input", "startup")
DEFAULT_VARIANTS = ",".join((*KERAS_VARIANTS, "fp32,bf16,jit,towers2", *OTHERS))


def data_sets(options: dict, dataset: str) -> list[str]:
    """The --set assignments of the model and the data every run shares."""
    sets = [f"model.name={options['model']}", f"data.dataset={dataset}"]
    sets += [f"data.image_size={options['image_size']}"] if options["image_size"] else []
    return sets + ([f"data.data_dir={options['data_dir']}"] if options["data_dir"] else [])


def trainer_rate(
    options: dict, variant: str, tree: str = REPO, dataset: str = "synthetic", profile=False
):
    """A trainer variant's images/s and input wait, from its records (`tree`'s code); with
    `profile`, its second window's time by kind of op (`step_limit.breakdown`)."""
    steps, batch = options["steps"], options["batch_size"]
    preset = variant.removeprefix(MODEL_PREFIX) if variant.startswith(MODEL_PREFIX) else None
    sets = data_sets(options, dataset)
    sets += [f"data.eval_examples={batch}", f"train.batch_size={batch}", "train.eval_every=1000000"]
    sets += [f"train.train_steps={steps * (options['windows'] + 1)}", f"train.log_every={steps}"]
    sets += ["schedule.name=constant", *options["set"]]
    sets += [f"model.name={preset}"] if preset else TRAINER_VARIANTS[variant]
    sets += [f"train.profile_steps={steps}"] if profile else []
    with tempfile.TemporaryDirectory(prefix="benchmark_") as model_dir:
        launched = time.time()  # The first window, with the start-up, is dropped.
        args = [*(f"--set={s}" for s in sets), f"--model_dir={model_dir}"]
        found = timing.run_trainer(variant, args, tree)
        records = timing.read_records(os.path.join(model_dir, "metrics.jsonl"))
        if profile:
            found["breakdown"] = step_limit.breakdown(model_dir, steps)
    training = [r for r in records if "accuracy" in r]
    times = [launched, *(r["time"] for r in training)]
    rates = timing.window_rates(times, steps * batch)
    found.update(windows=rates, images_per_sec=median(rates), first_step=times[1] - launched)
    return {**found, "input_wait": median(r.get("input_wait", 0.0) for r in training[1:])}


def spawn(variant: str, options: dict) -> dict:
    """A worker process of this script measuring `variant`; its JSON."""
    env = {}
    if variant in KERAS_VARIANTS and resnet_app.CPU_ALLOCATOR_DEFAULTED:
        env[resnet_app.CPU_ALLOCATOR_VARIABLE] = "false"  # As a user's script runs.
    script = os.path.abspath(__file__)
    return timing.run_child([script, "worker", variant, json.dumps(options)], env=env)


def worker(variant: str, options: dict) -> dict:
    """Measures one variant in this process: Keras `fit`, the matmul peak, a pipeline, a race."""
    if variant == "peak":
        found = matmul_peak()
    elif variant in KERAS_VARIANTS:
        found = keras_fit(options, variant != "keras_fit_nojit", variant != "keras_fit_our_layers")
    elif variant == "pipeline":
        found = pipeline_rate(options)
    else:
        found = race.fit_worker(options)
    bfc = os.environ.get(resnet_app.CPU_ALLOCATOR_VARIABLE, "").lower() in ("1", "true")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**found, "peak_rss_mb": peak, "bfc_allocator": bfc}


def matmul_peak() -> dict:
    """GFLOP/s of a 2048^2 matmul in float32 and bfloat16: what the cores can do."""
    import tensorflow as tf

    peaks, n = {"bfloat16": None}, 2048
    # Under an ONEDNN_MAX_CPU_ISA cap below bfloat16, TF 2.21's bfloat16 matmul crashes.
    for dtype in ("float32",) if timing.cpu().bf16_capped else ("float32", "bfloat16"):
        a, b = (tf.cast(tf.random.normal([n, n]), dtype) for _ in range(2))
        matmul = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)))
        matmul(a, b).numpy()
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(8):
                result = matmul(a, b)
            result.numpy()
            seconds.append(time.perf_counter() - start)
        peaks[dtype] = 2 * n**3 * 8 / median(seconds) / 1e9
    return {"peak_gflops": peaks}


def keras_fit(options: dict, jit: bool, stock_layers: bool) -> dict:
    """`model.fit` on synthetic batches, as a user writes it (XLA: Keras's "auto")."""
    import keras
    import tensorflow as tf

    from resnet_app.nets.resnet import create_model

    size, batch, steps = image_size(options), options["batch_size"], options["steps"]
    keras.utils.set_random_seed(0)
    create = lambda: create_model(options["model"], num_classes=10)  # noqa: E731
    model = keras_baseline.baseline_model(create, stock_layers)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    model.compile(optimizer, loss, metrics=["accuracy"], jit_compile="auto" if jit else False)
    images = tf.random.normal([batch, size, size, 3])
    labels = tf.random.uniform([batch], 0, 10, tf.int32)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    times = []

    def clock(index, logs):  # The start of each window.
        if index % steps == 0:
            times.append(time.perf_counter())

    callbacks = [keras.callbacks.LambdaCallback(on_train_batch_end=clock)]
    total = steps * (options["windows"] + 1) + 1
    model.fit(dataset, steps_per_epoch=total, epochs=1, callbacks=callbacks, verbose=0)
    rates = timing.window_rates(times, steps * batch)
    return {"windows": rates, "images_per_sec": median(rates)}


def pipeline_rate(options: dict) -> dict:
    """The --dataset's training pipeline alone (with the --set settings), nothing trained."""
    from resnet_app import config
    from resnet_app.data import input_pipeline
    from resnet_app.nets.presets import get_config

    resolved = config.resolve(sets=[*data_sets(options, options["dataset"]), *options["set"]])
    default = get_config(resolved.model_name).default_image_size
    pipeline = input_pipeline.create_pipeline(resolved.data, default_image_size=default)
    iterator, times = iter(pipeline.train_dataset(options["batch_size"])), []
    for _ in range(options["windows"] + 2):
        times.append(time.perf_counter())
        for _ in range(options["steps"]):
            next(iterator)["image"].numpy()  # Touched: nothing left lazily undone.
    rates = timing.window_rates(times, options["steps"] * options["batch_size"])
    return {"windows": rates, "images_per_sec": median(rates)}


def image_size(options: dict) -> int:
    from resnet_app.nets.presets import get_config

    return options["image_size"] or get_config(options["model"]).default_image_size


def flops(options: dict, model: str) -> float:
    """Training FLOPs per image: forward 2 per multiply-accumulate, backward twice that."""
    from resnet_app.nets.summary import summarize

    return 6.0 * summarize(model, image_size(options))["macs"]


def step(options: dict) -> dict:
    """Every variant asked for, in --rounds rounds; the report."""
    cpu, variants = timing.cpu(), options["variants"]
    timed = [v for v in variants if v not in OTHERS]
    report = {"cpu": cpu.to_dict(), "allocator": allocator(), "model": options["model"]}
    report.update(image_size=image_size(options), batch_size=options["batch_size"])
    report.update(train_flops_per_image=flops(options, options["model"]), variants={})
    report["peak_gflops"] = spawn("peak", options)["peak_gflops"]
    if "bf16" in timed and cpu.bf16_capped:  # TF 2.21 crashes there.
        report["skipped"] = {"bf16": "ONEDNN_MAX_CPU_ISA leaves out bfloat16"}
        timed.remove("bf16")

    def measure(variant):
        keras = variant in KERAS_VARIANTS
        return spawn(variant, options) if keras else trainer_rate(options, variant)

    for variant, results in timing.in_rounds(timed, options["rounds"], measure).items():
        rate = median(r["images_per_sec"] for r in results)
        preset = variant.removeprefix(MODEL_PREFIX) if variant.startswith(MODEL_PREFIX) else None
        gflops = rate * flops(options, preset or options["model"]) / 1e9
        peak = report["peak_gflops"]["bfloat16" if variant == "bf16" else "float32"]
        report["variants"][variant] = {
            **results[0],
            "images_per_sec": rate,
            "windows": [w for r in results for w in r["windows"]],
            "process_rates": [r["images_per_sec"] for r in results],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
            "gflops": gflops,
            "peak_fraction": gflops / peak if peak else None,
        }
    rows = report["variants"]
    for row, base in ((row, base) for row in rows.values() for base in ("keras_fit", "fp32")):
        rate = rows[base]["images_per_sec"] if base in rows else None
        row[f"vs_{base}"] = row["images_per_sec"] / rate if rate else None
    if "input" in variants:
        report["input"] = input_rates(options, rows.get("fp32"))
    if "startup" in variants:  # From the command to the end of the first step on --dataset.
        short = {**options, "steps": 1, "windows": 1}
        found = trainer_rate(short, "fp32", dataset=options["dataset"])
        report["startup_seconds"] = found["first_step"]
    return report


def limit(options: dict) -> dict:
    """Each variant's step by kind of op (medians over --rounds), and this run's peak."""
    model = options["model"]
    report = {"cpu": timing.cpu().to_dict(), "model": model, "image_size": image_size(options)}
    report.update(batch_size=options["batch_size"], flops_per_image=flops(options, model))
    report["peak_gflops"] = spawn("peak", options)["peak_gflops"]
    measure = functools.partial(trainer_rate, options, profile=True)
    found = timing.in_rounds(options["variants"], options["rounds"], measure)
    report["variants"] = {
        variant: {
            kind: median(r["breakdown"][kind] for r in results) for kind in results[0]["breakdown"]
        }
        for variant, results in found.items()
    }
    return report


def input_rates(options: dict, synthetic: dict | None) -> dict:
    """The --dataset's pipeline alone, and the trainer fed by it against synthetic data."""
    synthetic = synthetic or trainer_rate(options, "fp32")
    real = trainer_rate(options, "fp32", dataset=options["dataset"])
    pipeline = spawn("pipeline", options)["images_per_sec"]
    return {
        "dataset": options["dataset"],
        "pipeline_images_per_sec": pipeline,
        "pipeline_vs_training": pipeline / synthetic["images_per_sec"],
        "training_images_per_sec": real["images_per_sec"],
        "training_vs_synthetic": real["images_per_sec"] / synthetic["images_per_sec"],
        "input_wait": real["input_wait"],
    }


def allocator() -> str:
    """The CPU allocator of the trainer's rows and of the Keras rows."""
    if resnet_app.CPU_ALLOCATOR_DEFAULTED:
        return "BFC for resnet_app, TF's default for Keras"
    chosen = os.environ[resnet_app.CPU_ALLOCATOR_VARIABLE].lower() in ("1", "true")
    return f"{'BFC' if chosen else 'default'} for all ({resnet_app.CPU_ALLOCATOR_VARIABLE} set)"


RATES = (("images_per_sec", 1), ("gflops", 1), ("peak_rss_mb", 0))


def step_text(report: dict) -> str:
    from resnet_app.common import hardware

    cpu, peak = hardware.CpuInfo.from_dict(report["cpu"]), report["peak_gflops"]
    header = "variant,img/s,x keras_fit,x fp32,GFLOP/s,% of peak,peak RSS MB,windows (img/s)"
    rows = []
    for name, r in report["variants"].items():
        name = "bf16 (emulated)" if name == "bf16" and not cpu.native_bf16 else name
        ratios = [f"{r[k]:.2f}x" if r[k] else "-" for k in ("vs_keras_fit", "vs_fp32")]
        share = f"{100 * r['peak_fraction']:.1f}%" if r["peak_fraction"] else "-"
        windows = ", ".join(f"{w:.3g}" for w in r["windows"])
        rate, gflops, memory = (f"{r[k]:.{d}f}" for k, d in RATES)
        rows.append([name, rate, *ratios, gflops, share, memory, windows])
    skipped = report.get("skipped", {}).items()
    rows += [[name, f"skipped: {why}", *"------"] for name, why in skipped]
    bf16 = "native" if cpu.native_bf16 else "emulated (slow)"
    lines = [
        f"{timing.cpu_line(report['cpu'])}; bfloat16 {bf16}; CPU allocator: {report['allocator']}",
        f"{report['model']} at {report['image_size']} px, batch {report['batch_size']}: "
        f"{report['train_flops_per_image'] / 1e9:.3f} GFLOP per training image; matmul peak "
        f"{peak['float32']:.0f} GFLOP/s float32, {number(peak['bfloat16'], '.0f')} bfloat16\n",
        timing.markdown_table(header.split(","), rows),
    ]
    if "input" in report:
        found = report["input"]
        bound = "input-bound" if found["training_vs_synthetic"] < 0.95 else "not input-bound"
        lines.append(
            f"\ninput ({found['dataset']}): the pipeline alone gives "
            f"{found['pipeline_images_per_sec']:.0f} img/s, {found['pipeline_vs_training']:.1f}x "
            f"what fp32 training consumes; training on it runs at "
            f"{found['training_images_per_sec']:.1f} img/s, {found['training_vs_synthetic']:.2f}x "
            f"synthetic, waiting for data {100 * found['input_wait']:.0f}% of the time: {bound}"
        )
    if "startup_seconds" in report:
        seconds = report["startup_seconds"]
        lines.append(f"startup: {seconds:.1f} s from the command to the end of the first step")
    return "\n".join(lines)


def export_revision(revision: str, directory: str, name: str) -> str:
    """`revision`'s tree under `directory` (git archive); its path."""
    archive = os.path.join(directory, f"{name}.tar")
    command = ["git", "-C", REPO, "archive", "--format=tar", f"--output={archive}", revision]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        timing.fail(f"--{name}={revision}: git cannot export it ({done.stderr.strip()})")
    with tarfile.open(archive) as tar:
        tar.extractall(os.path.join(directory, name), filter="data")
    return os.path.join(directory, name)


def revisions(options: dict) -> dict:
    """Each side's trainer variants against a `keras_fit` timed beside them, in rounds."""
    variants = options["variants"]
    with tempfile.TemporaryDirectory(prefix="benchmark_revisions_") as directory:
        trees = {"before": export_revision(options["before"], directory, "before")}
        after = options["after"]
        trees["after"] = export_revision(after, directory, "after") if after else REPO

        def measure(side):
            fit = spawn("keras_fit", options)["images_per_sec"]  # This tree's: the reference.
            rates = {v: trainer_rate(options, v, trees[side])["images_per_sec"] for v in variants}
            shown = ", ".join(f"{v} {rate / fit:.3f}x keras_fit" for v, rate in rates.items())
            sys.stderr.write(f"{side}: {shown}\n")
            return {"keras_fit": fit, **rates}

        found = timing.in_rounds(trees, options["rounds"], measure, alternate=True)
    shown = ("before", "after", "model", "batch_size", "steps", "windows", "rounds")
    report = {"cpu": timing.cpu().to_dict(), "options": {k: options[k] for k in shown}}
    report["variants"] = {v: comparison(found["before"], found["after"], v) for v in variants}
    return report


def comparison(before: list[dict], after: list[dict], variant: str) -> dict:
    """One variant: each side's ratios to keras_fit by round, and after / before."""
    ratios = [[r[variant] / r["keras_fit"] for r in side] for side in (before, after)]
    rates = [median(r[variant] for r in side) for side in (before, after)]
    found = {"before_vs_keras_fit": ratios[0], "after_vs_keras_fit": ratios[1]}
    ratio = median(ratios[1]) / median(ratios[0])
    return {**found, "ratio": ratio, "images_per_sec_ratio": rates[1] / rates[0]}


def revisions_text(report: dict) -> str:
    options, rows = report["options"], []
    for variant, found in report["variants"].items():
        sides = (found["before_vs_keras_fit"], found["after_vs_keras_fit"])
        shown = [f"{median(r):.3f} ({' '.join(f'{x:.2f}' for x in r)})" for r in sides]
        ratios = [f"{found[k]:.3f}" for k in ("ratio", "images_per_sec_ratio")]
        rows.append([variant, *shown, *ratios])
    header = ["variant", "before x keras_fit (rounds)", "after x keras_fit (rounds)"]
    header += ["after / before", "img/s after / before"]
    return (
        f"{timing.cpu_line(report['cpu'])}\n{options['model']}, batch {options['batch_size']}, "
        f"{options['steps']} steps x {options['windows']} windows, {options['rounds']} rounds; "
        f"before = {options['before']}, after = {options['after'] or 'the working tree'}\n\n"
        + timing.markdown_table(header, rows)
    )


def parser() -> timing.Parser:
    common = timing.Parser(add_help=False)
    common.add_argument("--model", default="resnet20", help="the model preset")
    common.add_argument("--image_size", type=int, help="image size (default: the model's)")
    common.add_argument("--batch_size", type=int, default=128, help="global batch")
    common.add_argument("--steps", type=int, default=20, help="steps per timed window")
    common.add_argument("--windows", type=int, default=3, help="timed windows (their median)")
    common.add_argument("--rounds", type=int, default=1, help="processes per measurement")
    common.add_argument("--dataset", default="shapes", help="the data of input and startup")
    common.add_argument("--data_dir", help="its data directory")
    common.add_argument("--set", action="append", default=[], help="KEY=VALUE for every run")
    common.add_argument("--json", action="store_true", help="one JSON object, not a table")
    top = timing.Parser(prog="benchmark.py", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    known = ", ".join((*KERAS_VARIANTS, *TRAINER_VARIANTS, *OTHERS))
    sub = commands.add_parser("step", parents=[common], help="training images/s and input")
    sub.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"some of {known}, model:NAME")
    sub = commands.add_parser("revisions", parents=[common], help="a revision beside this tree")
    sub.add_argument("--before", required=True, help="the git revision to compare against")
    sub.add_argument("--after", help="the revision to compare (default: the working tree)")
    sub.add_argument("--variants", default="fp32,bf16", help=", ".join(TRAINER_VARIANTS))
    sub.set_defaults(rounds=3)
    sub = commands.add_parser("limit", parents=[common], help="the step by kind of op")
    sub.add_argument("--variants", default="fp32", help=", ".join(TRAINER_VARIANTS))
    race.add_parser(commands)
    sync_costs.add_parser(commands)
    report_cost.add_parser(commands)
    hf_cost.add_parser(commands)
    return top


def main(argv: list[str]) -> None:
    if argv[:1] == ["worker"]:  # Internal: one measurement, as one JSON line.
        sys.stdout.write(json.dumps(worker(argv[1], json.loads(argv[2]))) + "\n")
        return
    options = vars(parser().parse_args(argv))
    if options["rounds"] < 1:
        timing.fail(f"--rounds={options['rounds']}: use 1 or more processes per measurement")
    command = options.pop("command")
    if "variants" in options:
        options["variants"] = [v.strip() for v in options["variants"].split(",") if v.strip()]
        check_variants(options["variants"], command)
    build, text = {
        "step": (step, step_text),
        "revisions": (revisions, revisions_text),
        "limit": (limit, step_limit.text),
        "race": (race.race, race.text),
        "sync": (sync_costs.sync, sync_costs.text),
        "report": (report_cost.report, report_cost.text),
        "hf": (hf_cost.hf, hf_cost.text),
    }[command]
    timing.emit(build(options), text, options["json"])


def check_variants(variants: list[str], command: str) -> None:
    from resnet_app.nets.presets import model_names

    known = {*TRAINER_VARIANTS}
    if command == "step":
        known |= {*KERAS_VARIANTS, *OTHERS, *(MODEL_PREFIX + name for name in model_names())}
    unknown = sorted(set(variants) - known)
    if unknown:
        names = ", ".join(v for v in sorted(known) if not v.startswith(MODEL_PREFIX))
        more = f", or {MODEL_PREFIX}NAME for a model preset" if command == "step" else ""
        timing.fail(f"--variants: unknown {', '.join(unknown)}; use some of {names}{more}")


if __name__ == "__main__":
    main(sys.argv[1:])
