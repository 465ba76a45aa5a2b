"""scripts/benchmark.py runs end to end (its numbers are measured, not tested)."""

import json
import os
import statistics
import sys

import pytest

import resnet_app
from resnet_app.nets import presets
from tests.commands import REPO, error_line, run_command
from tests.reference import closed_form_macs

sys.path.insert(0, os.path.join(REPO, "scripts"))

import benchmark  # noqa: E402
import timing  # noqa: E402


@pytest.mark.slow  # the benchmark end to end: 4 and 2 measuring processes
def test_json_report_of_one_trainer_variant(tmp_path):
    result = run_command(
        "scripts/benchmark.py",
        "step",
        "--model=tiny",
        "--batch_size=8",
        "--steps=2",
        "--windows=2",
        "--rounds=2",
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
    line = error_line(run_command("scripts/benchmark.py", "step", "--variants=fp32,turbo"))
    assert "unknown turbo" in line
    line = error_line(
        run_command("scripts/benchmark.py", "revisions", "--before=HEAD", "--variants=keras_fit")
    )
    assert "unknown keras_fit" in line  # A revision's trainer, against this tree's keras_fit.


@pytest.mark.slow  # the benchmark end to end: 4 and 2 measuring processes
def test_keras_variants_measure_the_layers_they_name(tmp_path):
    """keras_fit builds Keras's stock BatchNormalization, keras_fit_our_layers ours.

    Each worker refuses to measure a model built with other layers (the stock
    layers are swapped in where `nets/layers.py` makes its BatchNorms).
    """
    result = run_command(
        "scripts/benchmark.py",
        "step",
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


def test_rounds_below_one_is_one_line():
    line = error_line(run_command("scripts/benchmark.py", "step", "--rounds=0"))
    assert "--rounds=0" in line


@pytest.mark.slow  # a revision's trainer and this tree's, each beside a keras_fit
def test_revisions_times_both_trees_in_one_run_and_divides_their_ratios():
    result = run_command(
        "scripts/benchmark.py",
        "revisions",
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
    progress = [line for line in result.stderr.splitlines() if line.startswith(("before", "after"))]
    assert [line.split(":")[0] for line in progress] == ["before", "after"]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("CPU: ") and "before = HEAD, after = the working tree" in lines[1]
    assert lines[-1].startswith("| fp32 ")


def test_revisions_table_is_the_ratio_of_the_medians():
    before = [
        {"keras_fit": 200.0, "fp32": 300.0},
        {"keras_fit": 100, "fp32": 140},
        {"keras_fit": 100, "fp32": 160},
    ]
    after = [
        {"keras_fit": 200.0, "fp32": 300.0},
        {"keras_fit": 100, "fp32": 165},
        {"keras_fit": 100, "fp32": 180},
    ]
    found = benchmark.comparison(before, after, "fp32")
    assert found["before_vs_keras_fit"] == [1.5, 1.4, 1.6]  # Each round against its keras_fit.
    assert found["after_vs_keras_fit"] == [1.5, 1.65, 1.8]
    assert found["ratio"] == pytest.approx(1.65 / 1.5)
    assert found["images_per_sec_ratio"] == pytest.approx(180 / 160)
    report = {"cpu": timing.cpu().to_dict(), "variants": {"fp32": found}}
    report["options"] = dict(
        before="A", after=None, model="tiny", batch_size=8, steps=2, windows=1, rounds=3
    )
    row = benchmark.revisions_text(report).splitlines()[-1]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[0] == "fp32" and cells[3] == f"{1.65 / 1.5:.3f}"
    assert cells[1:3] == ["1.500 (1.50 1.40 1.60)", "1.650 (1.50 1.65 1.80)"]


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the following arguments are required: --before"),
        (["--before=no_such_revision_here"], "--before=no_such_revision_here: git cannot export"),
        (["--before=HEAD", "--rounds=0"], "--rounds=0: use 1 or more"),
    ],
)
def test_revisions_bad_flags_are_one_line(args, message):
    result = run_command("scripts/benchmark.py", "revisions", *args)
    assert result.returncode == 2 and message in error_line(result)


def test_the_sync_benchmarks_intervals_must_divide_its_steps():
    line = error_line(run_command("scripts/benchmark.py", "sync", "--steps=6", "--intervals=4"))
    assert "--intervals=4: each must divide --steps=6" in line
