"""The report page in a real browser: headless Chromium opens it from disk, for a greyscale
IDX run (Fashion-MNIST's layout) and a multi-label run, and shows no console error, every
image loaded, the N highest losses of the saved logits (NumPy) and one table row per class
with eval_results.json's recall, sortable. Slow tier: .ci/run installs Chromium first."""

import json
import os

import numpy as np
import pytest

from tests import browser
from tests.commands import run_command
from tests.test_losses import numpy_bce
from tests.test_multi_label import run as multi_label_run  # noqa: F401 - fixtures
from tests.test_multi_label import table  # noqa: F401
from tests.test_report import greyscale_idx_run, numpy_losses

pytestmark = pytest.mark.slow  # Chromium, and two runs of their own.
TOP = 12


def open_report(model_dir, tmp_path):
    """`report` on the run: (what the browser shows, eval_results.json, predictions.npz)."""
    result = run_command("resnet_app.report", f"--model_dir={model_dir}", f"--top_losses={TOP}")
    assert result.returncode == 0, result.stderr[-3000:]
    directory = json.loads(result.stdout)["report"]
    shown = browser.read_page(os.path.join(directory, "report.html"), str(tmp_path / "page.png"))
    with open(os.path.join(directory, "eval_results.json")) as f:
        results = json.load(f)
    with np.load(os.path.join(directory, "predictions.npz")) as saved:
        arrays = {key: saved[key] for key in saved.files}
    assert shown["errors"] == []
    assert shown["images"] and all(loaded and width > 0 for loaded, width in shown["images"])
    assert len(shown["classes"]) == len(results["classes"])
    assert os.path.getsize(tmp_path / "page.png") > 0
    return shown, results, arrays


@pytest.fixture
def greyscale_run(tmp_path):
    flags = ("--batch_size=16", "--train_steps=14", "--eval_every=7")
    return greyscale_idx_run(tmp_path, 112, 48, *flags)


def test_a_greyscale_runs_page_in_chromium(greyscale_run, tmp_path):
    shown, results, saved = open_report(greyscale_run, tmp_path)
    losses = numpy_losses(saved["logits"], saved["label"])
    worst = np.lexsort((saved["id"], -losses))[:TOP]
    assert [card["id"] for card in shown["cards"]] == [int(i) for i in saved["id"][worst]]
    names = [entry["name"] for entry in results["classes"]]
    assert [card["true"] for card in shown["cards"]] == [names[i] for i in saved["label"][worst]]
    recall = shown["headings"].index("recall")
    for row, entry in zip(shown["classes"], results["classes"], strict=True):
        assert row[1] == entry["name"]
        assert row[recall] == ("" if entry["recall"] is None else f"{entry['recall']:.4f}")
    # A click on "recall" sorts the rows by it, highest first, the empty ones last.
    sorted_recalls = [row[recall] for row in shown["sorted_by_recall"]]
    measured = [float(value) for value in sorted_recalls if value]
    assert measured == sorted(measured, reverse=True)
    blank = len(results["classes"]) - len(measured)
    assert sorted_recalls == [f"{v:.4f}" for v in measured] + [""] * blank
    assert shown["pairs"] > 0


def test_a_multi_label_runs_page_in_chromium(multi_label_run, tmp_path):  # noqa: F811
    model_dir, _ = multi_label_run
    shown, results, saved = open_report(model_dir, tmp_path)
    losses = numpy_bce(saved["logits"], saved["label"])
    worst = np.lexsort((saved["id"], -losses))[:TOP]
    assert [card["id"] for card in shown["cards"]] == [int(i) for i in saved["id"][worst]]
    names = [entry["name"] for entry in results["classes"]]
    expected_true = ["|".join(names[c] for c in np.flatnonzero(saved["label"][i])) for i in worst]
    assert [card["true"] for card in shown["cards"]] == expected_true
    assert shown["pairs"] == 0  # No confusion matrix for multi-label data.
    ap = shown["headings"].index("average precision")
    for row, entry in zip(shown["classes"], results["classes"], strict=True):
        expected = entry["average_precision"]
        assert row[ap] == ("" if expected is None else f"{expected:.4f}")
