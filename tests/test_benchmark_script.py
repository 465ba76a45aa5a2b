"""scripts/benchmark.py runs end to end (its numbers are measured, not tested)."""

import json
import statistics

import pytest

import resnet_app
from resnet_app.nets import presets
from tests.commands import error_line, run_command
from tests.reference import closed_form_macs


@pytest.mark.slow  # the benchmark end to end: 4 and 2 measuring processes
def test_json_report_of_one_trainer_variant(tmp_path):
    result = run_command(
        "scripts/benchmark.py",
        "--model=tiny",
        "--batch_size=8",
        "--steps=2",
        "--windows=2",
        "--repeats=2",
        "--variants=keras_fit_our_layers,fp32,last_step",
        f"--data_dir={tmp_path}",
        "--json",
        unset=[resnet_app.CPU_ALLOCATOR_VARIABLE],  # As a user starts it.
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    # Training FLOPs: forward 2 per multiply-accumulate, backward twice that.
    tiny = presets.get_config("tiny", num_classes=10)
    assert report["train_flops_per_image"] == 6 * closed_form_macs(tiny, 32)
    fp32 = report["variants"]["fp32"]
    # Two processes of 2 windows each: the median of the processes' medians.
    assert len(fp32["windows"]) == 4 and fp32["images_per_sec"] > 0
    first, second = fp32["process_rates"]
    assert first == statistics.median(fp32["windows"][:2])
    assert second == statistics.median(fp32["windows"][2:])
    assert fp32["images_per_sec"] == statistics.median([first, second])
    assert fp32["gflops"] == fp32["images_per_sec"] * report["train_flops_per_image"] / 1e9
    peak = report["peak_gflops"]["float32"]
    assert fp32["peak_fraction"] == fp32["gflops"] / peak and fp32["peak_rss_mb"] > 100
    assert fp32["vs_keras_fit"] is None  # keras_fit was not asked for.
    assert report["variants"]["last_step"]["images_per_sec"] > 0  # A copy kept in one process.
    # The trainer on resnet_app's allocator, Keras on TensorFlow's default.
    assert fp32["bfc_allocator"] and not report["variants"]["keras_fit_our_layers"]["bfc_allocator"]
    assert report["allocator"] == "BFC for resnet_app, TF's default for Keras"
    # What it ran on, read from /proc/cpuinfo by the parent process.
    assert set(report["cpu"]) == {
        "model",
        "isa",
        "isa_cap",
        "onednn",
        "onednn_forced",
        "native_bf16",
    }
    assert set(report["cpu"]["isa"]) <= {"AVX2", "AVX-512", "AVX512_BF16", "AMX-BF16"}


def test_unknown_variant_is_one_line():
    line = error_line(run_command("scripts/benchmark.py", "--variants=fp32,turbo"))
    assert "unknown turbo" in line


@pytest.mark.slow  # the benchmark end to end: 4 and 2 measuring processes
def test_keras_variants_measure_the_layers_they_name(tmp_path):
    """keras_fit builds Keras's stock BatchNormalization, keras_fit_our_layers ours.

    Each worker refuses to measure a model built with other layers (the stock
    layers are swapped in where `nets/layers.py` makes its BatchNorms).
    """
    result = run_command(
        "scripts/benchmark.py",
        "--model=tiny",
        "--batch_size=8",
        "--steps=2",
        "--windows=1",
        "--variants=keras_fit,keras_fit_our_layers",
        f"--data_dir={tmp_path}",
        "--json",
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert set(report["variants"]) == {"keras_fit", "keras_fit_our_layers"}


def test_repeats_below_one_is_one_line():
    line = error_line(run_command("scripts/benchmark.py", "--repeats=0"))
    assert "--repeats=0" in line


@pytest.mark.slow  # 2 training runs and a watcher
def test_the_evaluator_benchmark_prints_the_ratio_and_the_watcher_sees_every_checkpoint():
    result = run_command(
        "scripts/evaluator_benchmark.py",
        "--config=shapes_quickstart",
        "--epochs=0.5",  # 782 steps: checkpoints at 300, 600 and the end.
        "--checkpoint_every=300",
        "--rounds=1",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("CPU: ")
    assert "the watcher reported 3 of 3 checkpoints" in result.stdout, result.stdout
    ratio = float(lines[-1].split(": ")[1].split()[0])
    assert ratio > 0


@pytest.mark.slow  # two benchmark runs of two revisions, 2 measuring processes each
def test_compare_revisions_runs_both_trees_and_divides_their_ratios():
    result = run_command(
        "scripts/compare_revisions.py",
        "--before=HEAD",
        "--model=tiny",
        "--batch_size=8",
        "--steps=2",
        "--windows=1",
        "--rounds=1",
        "--variants=fp32",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("round 1 before: {'fp32': ")
    assert lines[1].startswith("round 1 after: {'fp32': ")
    assert lines[2].startswith("CPU: ") and lines[-1].startswith("fp32 ")


def test_compare_revisions_table_is_the_ratio_of_the_medians():
    import sys

    sys.path.insert(0, "scripts")
    import compare_revisions

    report = {
        "variants": {"keras_fit": {"images_per_sec": 200.0}, "fp32": {"images_per_sec": 300.0}}
    }
    assert compare_revisions.ratios(report, ["fp32"]) == {"fp32": 1.5}
    before = [{"fp32": 1.5}, {"fp32": 1.4}, {"fp32": 1.6}]
    after = [{"fp32": 1.5}, {"fp32": 1.65}, {"fp32": 1.8}]
    row = compare_revisions.table(before, after, ["fp32"])[1]
    assert row.split()[0] == "fp32" and row.endswith(f"{1.65 / 1.5:.3f}")
    assert "(1.50 1.40 1.60)" in row and "(1.50 1.65 1.80)" in row


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--before: name the git revision"),
        (["--before=no_such_revision_here"], "--before=no_such_revision_here: git cannot export"),
        (["--before=HEAD", "--rounds=0"], "--rounds=0: use 1 or more"),
    ],
)
def test_compare_revisions_bad_flags_are_one_line(args, message):
    result = run_command("scripts/compare_revisions.py", *args)
    assert result.returncode == 2 and message in error_line(result)
