"""Training throughput, side by side: plain Keras `fit` against resnet_app's variants.

    python scripts/benchmark.py                              # resnet20, 32 px, batch 128
    python scripts/benchmark.py --model=resnet50 --image_size=224 --batch_size=32 --steps=5
    python scripts/benchmark.py --variants=keras_fit,fp32,bf16 --json

One run measures, on the same model, batch and synthetic data (made once, so
the input costs nothing), each variant in a fresh process of its own (so that
its peak memory is its own):
- keras_fit: the same architecture with Keras's stock layers
  (`keras.layers.BatchNormalization`), `model.compile(SGD(momentum=0.9),
  from_logits cross-entropy, metrics=["accuracy"])` and `model.fit`, as a user
  would write it (Keras's default jit_compile="auto" turns XLA on);
  keras_fit_nojit: the same without XLA; keras_fit_our_layers: `fit` on
  resnet_app's own model (its fused-kernel BatchNorm), which tells the gain of
  the trainer's loop from that of its layers;
- fp32, bf16, fp16, jit (XLA), towers2 (2 logical CPU devices, or 2 GPUs):
  `python -m resnet_app.train`'s trainer, timed between its training records;
  ema, drop_path, bce (ask for them with --variants): the trainer with the
  modern recipe's per-step pieces, the moving average of the weights,
  stochastic depth at 0.1, binary cross-entropy; last_step: the copy of the
  last completed step that multi-worker runs keep (`engine/last_step.py`).
Images/sec are the median of --windows timed windows of --steps steps after a
warm-up window, wall clock, host overhead included; with --repeats=N each
variant runs in N processes, in rounds (every variant once per round), and
the median of their medians is shown: on a shared machine two processes of
the same variant can differ by 10%. Each is shown as a ratio
to keras_fit, with the model's training FLOPs per image (6 x the forward
multiply-accumulates: forward 2, backward 4), the achieved GFLOP/s and their
fraction of a matmul peak measured in the same run (float32, or bfloat16 for
bf16), and the peak resident memory.

Then, for the chosen --dataset: its training pipeline alone (images/sec, and
how many times training's consumption it delivers), the trainer on it against
the trainer on synthetic data (input-bound when it is slower), and the time
from the command to the first training step. Ratios matter, not absolute
numbers: the machines are shared and noisy, and of two kinds. The first line
says which: the CPU model, its instruction sets (AVX2, AVX-512, AVX512_BF16,
AMX-BF16), an `ONEDNN_MAX_CPU_ISA` cap if one is set, and whether bfloat16 is
native; a bf16 row on a CPU without it is marked "emulated" (`--json`: "cpu").
It also says whether TensorFlow runs its oneDNN kernels: TF turns them on only
on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX, so an AVX2 machine
runs TF's Eigen kernels; `TF_ENABLE_ONEDNN_OPTS=0` does the same on a newer
CPU and is the closer AVX2 stand-in (`ONEDNN_MAX_CPU_ISA=AVX2` keeps oneDNN).
And the CPU allocator: resnet_app picks TF's BFC allocator (`resnet_app/__init__.py`);
the Keras rows run with TF's default, as a user's script would, unless
TF_CPU_ALLOCATOR_USE_BFC is set for the whole benchmark.
Under a cap that leaves out bfloat16 (an AVX2 stand-in on an AVX-512 machine),
TF 2.21's bfloat16 kernels crash, so the bf16 peak and variant are skipped.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from absl import flags

import resnet_app
from resnet_app.common import cli, metrics, run_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Variants of the trainer: --set assignments over the common settings.
TRAINER_VARIANTS = {
    "fp32": [],
    "bf16": ["train.precision=bf16"],
    "fp16": ["train.precision=fp16"],
    "jit": ["train.jit=true"],
    "towers2": ["train.num_towers=2"],
    # The modern recipe's per-step costs (not in the default list).
    "ema": ["train.ema_decay=0.999"],
    "drop_path": ["model.drop_path_rate=0.1"],
    "bce": ["train.loss=bce"],
    # The copy of the last step a multi-worker run keeps (`engine/last_step.py`),
    # here in one process (not in the default list).
    "last_step": [],
}
KERAS_VARIANTS = ("keras_fit", "keras_fit_nojit", "keras_fit_our_layers")
# `model:NAME`: the trainer's fp32 row for another preset, at the same size and
# batch (e.g. resnext50_32x4d against --model=resnet50); "x fp32" compares.
MODEL_PREFIX = "model:"
DEFAULT_VARIANTS = (
    "keras_fit,keras_fit_nojit,keras_fit_our_layers,fp32,bf16,jit,towers2,input,startup"
)

_MODEL = flags.DEFINE_string("model", "resnet20", "The model preset.")
_IMAGE_SIZE = flags.DEFINE_integer("image_size", None, "Image size (default: the model's).")
_BATCH = flags.DEFINE_integer("batch_size", 128, "Global batch.")
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per timed window.")
_WINDOWS = flags.DEFINE_integer("windows", 3, "Timed windows after the warm-up one (median).")
_REPEATS = flags.DEFINE_integer(
    "repeats", 1, "Processes per variant, run in rounds (the median of their medians)."
)
_VARIANTS = flags.DEFINE_string(
    "variants",
    DEFAULT_VARIANTS,
    f"Comma-separated: {', '.join((*KERAS_VARIANTS, *TRAINER_VARIANTS))}, input (the "
    "dataset's pipeline against synthetic data), startup (command to first step).",
)
_DATASET = flags.DEFINE_string("dataset", "shapes", "The dataset of the input measurements.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Its data directory.")
_JSON = flags.DEFINE_boolean("json", False, "Print one JSON object instead of a table.")
_WORKER = flags.DEFINE_string("worker", None, "Internal: measure one variant and print JSON.")


# -- workers: one variant each, in its own process ---------------------------------


def bfc_allocator() -> bool:
    """Whether this process's environment asks TensorFlow for its BFC CPU allocator."""
    return os.environ.get(resnet_app.CPU_ALLOCATOR_VARIABLE, "").lower() in ("1", "true")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def window_rates(times: list[float], images_per_window: int) -> list[float]:
    """Images/sec of each window between consecutive timestamps, the first (warm-up) dropped."""
    return [images_per_window / (b - a) for a, b in zip(times[1:], times[2:])]


def measure_matmul_peak() -> dict:
    """GFLOP/s of a large matmul in float32 and bfloat16: what the cores can do."""
    import tensorflow as tf

    from resnet_app.common import hardware

    peaks = {"bfloat16": None}
    # Under an ONEDNN_MAX_CPU_ISA cap below bfloat16 (an AVX2 stand-in on an
    # AVX-512 machine), TF 2.21's bfloat16 matmul crashes the process: skipped.
    capped = hardware.read_cpu_info().bf16_capped
    for dtype in ("float32",) if capped else ("float32", "bfloat16"):
        n = 2048
        a = tf.cast(tf.random.normal([n, n]), dtype)
        b = tf.cast(tf.random.normal([n, n]), dtype)
        matmul = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)))
        matmul(a, b).numpy()
        seconds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(8):
                result = matmul(a, b)
            result.numpy()
            seconds.append(time.perf_counter() - start)
        peaks[dtype] = 2 * n**3 * 8 / statistics.median(seconds) / 1e9
    return {"peak_gflops": peaks}


def measure_keras_fit(jit: bool, stock_layers: bool) -> dict:
    import keras
    import tensorflow as tf
    from keras_baseline import baseline_model

    from resnet_app.nets.resnet import create_model

    size, batch, steps = image_size(), _BATCH.value, _STEPS.value
    keras.utils.set_random_seed(0)
    model = baseline_model(lambda: create_model(_MODEL.value, num_classes=10), stock_layers)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile="auto" if jit else False,
    )
    images = tf.random.normal([batch, size, size, 3])
    labels = tf.random.uniform([batch], 0, 10, tf.int32)
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
    times = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, index, logs=None):
            if index % steps == 0:
                times.append(time.perf_counter())

    model.fit(
        dataset,
        steps_per_epoch=steps * (_WINDOWS.value + 1) + 1,
        epochs=1,
        callbacks=[Clock()],
        verbose=0,
    )
    return {"images_per_sec": window_rates(times, steps * batch)}


def measure_trainer(
    sets: list[str], dataset: str = "synthetic", keep_last_step: bool = False
) -> dict:
    from resnet_app import config
    from resnet_app.engine import loop, setup

    steps = _STEPS.value
    model_dir = tempfile.mkdtemp(prefix="benchmark_")
    resolved = config.resolve(
        sets=[
            f"model.name={_MODEL.value}",
            f"data.dataset={dataset}",
            *([f"data.image_size={_IMAGE_SIZE.value}"] if _IMAGE_SIZE.value else []),
            *([f"data.data_dir={_DATA_DIR.value}"] if _DATA_DIR.value else []),
            f"data.eval_examples={_BATCH.value}",
            f"train.batch_size={_BATCH.value}",
            f"train.train_steps={steps * (_WINDOWS.value + 1)}",
            f"train.log_every={steps}",
            "train.eval_every=1000000",
            "schedule.name=constant",
            *sets,
        ]
    )
    started = time.time()
    loop.train(setup.build_run(resolved, model_dir), keep_last_step=keep_last_step or None)
    records = metrics.read_records(run_dir.metrics_path(model_dir))
    training = [r for r in records if "accuracy" in r]
    # The first window starts when the run does: it holds the tracing (warm-up).
    times = [started, *(r["time"] for r in training)]
    return {
        "images_per_sec": window_rates(times, steps * _BATCH.value),
        "input_wait": statistics.median(r["input_wait"] for r in training[1:]),
    }


def measure_pipeline() -> dict:
    """The dataset's training pipeline alone: images/sec, nothing trained."""
    from resnet_app.data import input_pipeline
    from resnet_app.data.settings import DataConfig
    from resnet_app.nets.presets import get_config

    pipeline = input_pipeline.create_pipeline(
        DataConfig(dataset=_DATASET.value, data_dir=_DATA_DIR.value, image_size=_IMAGE_SIZE.value),
        default_image_size=get_config(_MODEL.value).default_image_size,
    )
    iterator = iter(pipeline.train_dataset(_BATCH.value))
    steps, times = _STEPS.value, []
    for _ in range(_WINDOWS.value + 2):
        times.append(time.perf_counter())
        for _ in range(steps):
            next(iterator)["image"].numpy()
    return {"images_per_sec": window_rates(times, steps * _BATCH.value)}


def measure_startup() -> dict:
    """Seconds from the command to the end of the first training step."""
    model_dir = tempfile.mkdtemp(prefix="benchmark_")
    args = [
        f"--model={_MODEL.value}",
        f"--dataset={_DATASET.value}",
        *([f"--data_dir={_DATA_DIR.value}"] if _DATA_DIR.value else []),
        f"--batch_size={_BATCH.value}",
        "--train_steps=2",
        "--log_every=1",
        "--eval_every=1000000",
        "--set=data.eval_examples=1",
        f"--model_dir={model_dir}",
    ]
    started = time.time()
    subprocess.run(
        [sys.executable, "-m", "resnet_app.train", *args],
        cwd=REPO,
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    first = next(
        r for r in metrics.read_records(run_dir.metrics_path(model_dir)) if "accuracy" in r
    )
    return {"seconds": first["time"] - started}


def image_size() -> int:
    from resnet_app.nets.presets import get_config

    return _IMAGE_SIZE.value or get_config(_MODEL.value).default_image_size


def _known_model(name: str) -> bool:
    from resnet_app.nets.presets import model_names

    return name in model_names()


def run_worker(variant: str) -> dict:
    if variant == "peak":
        result = measure_matmul_peak()
    elif variant in KERAS_VARIANTS:
        result = measure_keras_fit(
            jit=variant != "keras_fit_nojit", stock_layers=variant != "keras_fit_our_layers"
        )
    elif variant in TRAINER_VARIANTS:
        result = measure_trainer(TRAINER_VARIANTS[variant], keep_last_step=variant == "last_step")
    elif variant.startswith(MODEL_PREFIX):  # Another preset, trained like fp32.
        result = measure_trainer([f"model.name={variant.removeprefix(MODEL_PREFIX)}"])
    elif variant == "input_trainer":
        result = measure_trainer([], dataset=_DATASET.value)
    elif variant == "pipeline":
        result = measure_pipeline()
    elif variant == "startup":
        result = measure_startup()
    else:
        raise ValueError(variant)
    return {**result, "peak_rss_mb": peak_rss_mb(), "bfc_allocator": bfc_allocator()}


# -- the parent: runs the workers, prints the table ----------------------------------


def spawn(variant: str) -> dict:
    """Runs one worker process; returns its JSON (with the median rate)."""
    argv = [a for a in sys.argv[1:] if not a.startswith("--worker")]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if variant in KERAS_VARIANTS and resnet_app.CPU_ALLOCATOR_DEFAULTED:
        # Keras as a user runs it: TF's default CPU allocator, not resnet_app's choice.
        env[resnet_app.CPU_ALLOCATOR_VARIABLE] = "false"
    completed = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *argv, f"--worker={variant}"],
        capture_output=True,
        text=True,
        env=env,
    )
    if completed.returncode != 0:
        tail = completed.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"variant {variant} failed: {' | '.join(tail)}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    if "images_per_sec" in result:
        result["windows"] = result.pop("images_per_sec")
        result["images_per_sec"] = statistics.median(result["windows"])
    return result


def training_flops_per_image(model: str | None = None) -> float:
    from resnet_app.nets.summary import summarize

    return 6.0 * summarize(model or _MODEL.value, image_size())["macs"]


def allocator() -> str:
    """Which CPU allocator the trainer's rows ran with (and the Keras rows)."""
    if resnet_app.CPU_ALLOCATOR_DEFAULTED:
        return "BFC for resnet_app, TF's default for Keras"
    chosen = "BFC" if bfc_allocator() else "default"
    return f"{chosen} for all ({resnet_app.CPU_ALLOCATOR_VARIABLE} set)"


def combine(results: tuple[dict, ...]) -> dict:
    """One variant's processes as one: the median of their medians, every
    window (in the order run), the highest peak memory."""
    return {
        **results[0],
        "images_per_sec": statistics.median(r["images_per_sec"] for r in results),
        "windows": [w for r in results for w in r["windows"]],
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "process_rates": [r["images_per_sec"] for r in results],
    }


def build_report(variants: list[str]) -> dict:
    from resnet_app.common import hardware

    cpu = hardware.read_cpu_info()
    report = {
        "cpu": cpu.to_dict(),
        "allocator": allocator(),
        "model": _MODEL.value,
        "image_size": image_size(),
        "batch_size": _BATCH.value,
        "train_flops_per_image": training_flops_per_image(),
        "peak_gflops": spawn("peak")["peak_gflops"],
        "variants": {},
    }
    flops = report["train_flops_per_image"]
    timed = [
        v
        for v in variants
        if v in (*KERAS_VARIANTS, *TRAINER_VARIANTS) or v.startswith(MODEL_PREFIX)
    ]
    if "bf16" in timed and cpu.bf16_capped:  # TF 2.21 crashes there.
        report["skipped"] = {"bf16": "ONEDNN_MAX_CPU_ISA leaves out bfloat16"}
        timed.remove("bf16")
    # --repeats rounds, each variant once per round in turn: a slow spell of
    # the machine then falls on every variant rather than on one.
    rounds = [[spawn(variant) for variant in timed] for _ in range(_REPEATS.value)]
    for variant, results in zip(timed, zip(*rounds, strict=True), strict=True):
        result = combine(results)
        model = variant.removeprefix(MODEL_PREFIX) if variant.startswith(MODEL_PREFIX) else None
        gflops = (
            result["images_per_sec"] * (training_flops_per_image(model) if model else flops) / 1e9
        )
        peak = report["peak_gflops"]["bfloat16" if variant == "bf16" else "float32"]
        fraction = gflops / peak if peak else None
        report["variants"][variant] = {**result, "gflops": gflops, "peak_fraction": fraction}
    base = report["variants"].get("keras_fit")
    trainer = report["variants"].get("fp32")
    for result in report["variants"].values():
        result["vs_keras_fit"] = result["images_per_sec"] / base["images_per_sec"] if base else None
        result["vs_fp32"] = (
            result["images_per_sec"] / trainer["images_per_sec"] if trainer else None
        )
    if "input" in variants:
        synthetic = report["variants"].get("fp32") or spawn("fp32")
        real = spawn("input_trainer")
        pipeline = spawn("pipeline")
        report["input"] = {
            "dataset": _DATASET.value,
            "pipeline_images_per_sec": pipeline["images_per_sec"],
            "pipeline_vs_training": pipeline["images_per_sec"] / synthetic["images_per_sec"],
            "training_images_per_sec": real["images_per_sec"],
            "training_vs_synthetic": real["images_per_sec"] / synthetic["images_per_sec"],
            "input_wait": real["input_wait"],
        }
    if "startup" in variants:
        report["startup_seconds"] = spawn("startup")["seconds"]
    return report


def format_report(report: dict) -> str:
    from resnet_app.common import hardware

    peak, cpu = report["peak_gflops"], hardware.CpuInfo.from_dict(report["cpu"])
    bf16_peak = f"{peak['bfloat16']:.0f}" if peak["bfloat16"] else "n/a"
    lines = [
        f"CPU: {cpu.describe()}; "
        f"bfloat16 {'native' if cpu.native_bf16 else 'emulated (slow)'}; "
        f"CPU allocator: {report['allocator']}",
        f"{report['model']} at {report['image_size']} px, batch {report['batch_size']}: "
        f"{report['train_flops_per_image'] / 1e9:.3f} GFLOP per training image; matmul peak "
        f"{peak['float32']:.0f} GFLOP/s float32, {bf16_peak} bfloat16",
        "",
        f"{'variant':<26}{'img/s':>8}{'x keras_fit':>13}{'x fp32':>8}{'GFLOP/s':>9}"
        f"{'% of peak':>11}{'peak RSS MB':>13}   windows (img/s)",
    ]
    for name, result in report["variants"].items():
        ratio, fraction = result["vs_keras_fit"], result["peak_fraction"]
        trainer_ratio = result.get("vs_fp32")
        if name == "bf16" and not cpu.native_bf16:
            name = "bf16 (emulated)"
        lines.append(
            f"{name:<26}{result['images_per_sec']:>8.1f}"
            f"{(f'{ratio:.2f}x' if ratio else '-'):>13}"
            f"{(f'{trainer_ratio:.2f}x' if trainer_ratio else '-'):>8}{result['gflops']:>9.1f}"
            f"{(f'{100 * fraction:.1f}%' if fraction else '-'):>11}"
            f"{result['peak_rss_mb']:>13.0f}   " + ", ".join(f"{w:.3g}" for w in result["windows"])
        )
    for name, why in report.get("skipped", {}).items():
        lines.append(f"{name:<26}skipped: {why}")
    if "input" in report:
        found = report["input"]
        verdict = "input-bound" if found["training_vs_synthetic"] < 0.95 else "not input-bound"
        lines += [
            "",
            f"input ({found['dataset']}): the pipeline alone gives "
            f"{found['pipeline_images_per_sec']:.0f} img/s, "
            f"{found['pipeline_vs_training']:.1f}x what fp32 training consumes; training on it "
            f"runs at {found['training_images_per_sec']:.1f} img/s, "
            f"{found['training_vs_synthetic']:.2f}x synthetic, waiting for data "
            f"{100 * found['input_wait']:.0f}% of the time: {verdict}",
        ]
    if "startup_seconds" in report:
        lines.append(
            f"startup: {report['startup_seconds']:.1f} s from the command to the end of the "
            "first training step"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if _WORKER.value:
        sys.stdout.write(json.dumps(run_worker(_WORKER.value)) + "\n")
        return
    if _REPEATS.value < 1:
        cli.fail(f"--repeats={_REPEATS.value}: use 1 or more processes per variant")
    variants = [v.strip() for v in _VARIANTS.value.split(",") if v.strip()]
    known = {*KERAS_VARIANTS, *TRAINER_VARIANTS, "input", "startup"}
    unknown = sorted(
        v
        for v in set(variants) - known
        if not (v.startswith(MODEL_PREFIX) and _known_model(v.removeprefix(MODEL_PREFIX)))
    )
    if unknown:
        cli.fail(
            f"--variants: unknown {', '.join(unknown)}; use some of {', '.join(sorted(known))}, "
            f"or {MODEL_PREFIX}NAME for a model preset"
        )
    report = build_report(variants)
    sys.stdout.write(
        (json.dumps(report, indent=1) if _JSON.value else format_report(report)) + "\n"
    )


if __name__ == "__main__":
    cli.run(main)
