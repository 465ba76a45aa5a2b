"""`resnet-app lr-find` (`tools/lr_find.py`): the LR range test, against closed forms computed here.

The rates must rise geometrically from --start_lr to --end_lr over --steps, the
smoothed loss must be the bias-corrected moving average of the losses, the
suggestion fastai's rule on it, divergence must stop the test, and the run
directory the config came from must not change by a byte or a timestamp.
"""

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.commands import error_line, run_command

FIXTURE = Path(__file__).parent / "fixtures" / "run_v0_tiny"  # tiny, 64 shapes images, batch 16
STEPS = 40
BETA = 0.98


def lr_find(tmp_path, *args):
    return run_command(
        "resnet_app.tools.lr_find",
        f"--steps={STEPS}",
        f"--csv={tmp_path / 'lr.csv'}",
        f"--plot={tmp_path / 'lr.png'}",
        f"--set=data.data_dir={tmp_path / 'data'}",
        *args,
    )


def read_csv(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    columns = ("step", "learning_rate", "loss", "smoothed_loss")
    return {name: np.array([float(row[name]) for row in rows]) for name in columns}


def expected_rates(start, end, count):
    """Smith's exponential range: start * (end / start) ** (step / (STEPS - 1))."""
    return start * (end / start) ** (np.arange(count) / (STEPS - 1))


def smoothed(losses):
    """The bias-corrected EMA in closed form: sum_j (1-b) b^(i-j) x_j / (1 - b^(i+1))."""
    out = []
    for i in range(len(losses)):
        weights = (1 - BETA) * BETA ** (i - np.arange(i + 1))
        out.append(weights @ losses[: i + 1] / (1 - BETA ** (i + 1)))
    return np.array(out)


def printed(stdout, label):
    """The number after `label` in the output."""
    return float(re.search(rf"{label} ([0-9.e+-]+)", stdout).group(1))


def snapshot(directory):
    """Every file under `directory`: its bytes and modification time."""
    return {
        str(path.relative_to(directory)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(directory.rglob("*"))
    }


def test_geometric_rates_suggestion_and_the_run_untouched(tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, model_dir)  # copy2: times kept; the committed fixture stays safe.
    before = snapshot(model_dir)
    work = tmp_path / "work"
    result = lr_find(tmp_path, f"--model_dir={model_dir}", f"--work_dir={work}", "--start_lr=1e-4")
    assert result.returncode == 0, result.stderr
    assert snapshot(model_dir) == before
    assert not work.exists()  # Deleted without --keep.

    table = read_csv(tmp_path / "lr.csv")
    assert "ran all steps" in result.stdout
    np.testing.assert_array_equal(table["step"], np.arange(STEPS))
    np.testing.assert_allclose(table["learning_rate"], expected_rates(1e-4, 10.0, STEPS), rtol=1e-9)
    ratios = table["learning_rate"][1:] / table["learning_rate"][:-1]
    np.testing.assert_allclose(ratios, (10.0 / 1e-4) ** (1 / (STEPS - 1)), rtol=1e-9)
    np.testing.assert_allclose(table["smoothed_loss"], smoothed(table["loss"]), rtol=1e-9)

    # fastai's window (first tenth and last 5 left out): the minimum / 10, the steepest slope.
    window = slice(STEPS // 10, STEPS - 5)
    rates, losses = table["learning_rate"][window], table["smoothed_loss"][window]
    minimum = rates[np.argmin(losses)]
    steepest = rates[np.argmin(np.diff(losses) / np.diff(np.log(rates)))]
    suggested = printed(result.stdout, "suggested learning rate:")
    assert suggested == pytest.approx(minimum / 10, rel=1e-5)
    assert printed(result.stdout, "minimum smoothed loss [0-9.]+ at learning rate") == (
        pytest.approx(minimum, rel=1e-5)
    )
    steepest_line = "steepest descent of the smoothed loss at learning rate"
    assert printed(result.stdout, steepest_line) == pytest.approx(steepest, rel=1e-5)
    assert 1e-4 <= suggested <= 10.0
    assert (tmp_path / "lr.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stops_at_divergence(tmp_path):
    work = tmp_path / "work"
    result = lr_find(
        tmp_path,
        "--dataset=shapes",
        "--set=model.name=tiny",
        "--set=data.train_examples=64",
        "--set=train.batch_size=16",
        "--start_lr=1e-4",
        "--end_lr=1e6",
        f"--work_dir={work}",
        "--keep",
    )
    assert result.returncode == 0, result.stderr
    table = read_csv(tmp_path / "lr.csv")
    count = len(table["step"])
    assert 10 < count < STEPS, result.stdout
    assert "stopped early: diverged" in result.stdout
    np.testing.assert_allclose(table["learning_rate"], expected_rates(1e-4, 1e6, count), rtol=1e-9)
    # The first row whose smoothed loss exceeds 4 x the lowest before it is the last one.
    ema = smoothed(table["loss"])
    best_before = np.minimum.accumulate(np.concatenate([[np.inf], ema[:-1]]))
    assert np.flatnonzero(ema > 4 * best_before).tolist() == [count - 1]
    suggested = printed(result.stdout, "suggested learning rate:")
    assert table["learning_rate"][0] <= suggested <= table["learning_rate"][-1]
    # Kept: the run's own records show the same rates and losses, one record per step.
    with open(work / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    trained = [record for record in records if "learning_rate" in record]
    assert [record["step"] for record in trained] == list(range(1, count + 1))
    np.testing.assert_allclose([r["learning_rate"] for r in trained], table["learning_rate"])
    np.testing.assert_allclose([r["loss"] for r in trained], table["loss"])


def test_non_finite_loss_ends_the_test(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "run")
    result = lr_find(
        tmp_path,
        f"--model_dir={tmp_path / 'run'}",
        f"--work_dir={tmp_path / 'work'}",
        "--start_lr=1e-4",
        "--end_lr=1e8",
        "--divergence=1e300",  # Never (float32 losses end below 4e38): the loss runs to inf or NaN.
    )
    assert result.returncode == 0, result.stderr
    count = len(read_csv(tmp_path / "lr.csv")["step"])
    assert count < STEPS
    assert f"stopped early: the loss or weights are not finite at step {count}" in result.stdout


def test_bad_flags_are_one_line(tmp_path):
    line = error_line(run_command("resnet_app.tools.lr_find", "--start_lr=0.1", "--end_lr=0.01"))
    assert line == "error: --end_lr must be a number above --start_lr (0.1), got 0.01"
    line = error_line(run_command("resnet_app.tools.lr_find", "--train_steps=5"))
    assert "--train_steps is set by the range test" in line
    line = error_line(run_command("resnet_app.tools.lr_find", f"--model_dir={tmp_path}"))
    assert "has no config.yaml" in line
