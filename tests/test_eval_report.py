"""The evaluation report in-process: its JSON, the confusion-matrix picture, the files.

The command end to end, against a NumPy reference, is in test_evaluate_cli.py.
"""

import io
import json
import os

import numpy as np
from matplotlib import image as mpimg

from resnet_app.data.shapes import CLASS_NAMES
from resnet_app.evaluation import reports

RECORD = {
    "checkpoint": "ckpt-4",
    "step": 4,
    "split": "test",
    "top1": 0.5,
    "top5": 0.9,
    "loss": 1.25,
    "num_examples": 0,  # Set from the matrix below.
}


def hand_matrix():
    """4 classes, rows = true: class 2 has no examples; two pairs tie at 2."""
    return np.array(
        [
            [5, 2, 0, 1],
            [0, 3, 0, 2],
            [0, 0, 0, 0],
            [4, 0, 1, 0],
        ]
    )


def test_report_per_class_and_most_confused_by_hand():
    names = ["cat", "dog", "emu", "fox"]
    record = {**RECORD, "num_examples": 18}
    report = reports.build_report(record, hand_matrix(), names)
    assert {k: report[k] for k in record} == record
    assert report["classes"] == [
        {"id": 0, "name": "cat", "examples": 8, "correct": 5, "accuracy": 5 / 8, "recall": 5 / 8},
        {"id": 1, "name": "dog", "examples": 5, "correct": 3, "accuracy": 3 / 5, "recall": 3 / 5},
        {"id": 2, "name": "emu", "examples": 0, "correct": 0, "accuracy": None, "recall": None},
        {"id": 3, "name": "fox", "examples": 5, "correct": 0, "accuracy": 0.0, "recall": 0.0},
    ]
    assert report["confusion_matrix"] == hand_matrix().tolist()
    pairs = [(p["true_name"], p["predicted_name"], p["count"]) for p in report["most_confused"]]
    # Largest first, ties in class-id order; no diagonal, no zeros.
    assert pairs == [
        ("fox", "cat", 4),
        ("cat", "dog", 2),
        ("dog", "fox", 2),
        ("cat", "fox", 1),
        ("fox", "emu", 1),
    ]
    assert len(reports.most_confused(hand_matrix(), names, count=2)) == 2
    # Written one entry per line, and read back the same.
    text = reports.to_json(report)
    assert json.loads(text) == report
    emu = '{"id": 2, "name": "emu", "examples": 0, "correct": 0, "accuracy": null, "recall": null}'
    assert f"    {emu}" in text


def test_picture_has_class_names_and_counts():
    rng = np.random.default_rng(0)
    confusion = rng.integers(0, 4, size=(10, 10))
    confusion[3] = 0  # A class without examples: its row stays blank, no division by zero.
    figure = reports.plot_confusion(confusion, CLASS_NAMES, "ckpt-4 on test")
    [axes] = [a for a in figure.axes if a.get_xlabel() == "predicted class"]
    assert [t.get_text() for t in axes.get_xticklabels()] == list(CLASS_NAMES)
    assert [t.get_text() for t in axes.get_yticklabels()] == list(CLASS_NAMES)
    assert axes.get_ylabel() == "true class"
    # The non-zero counts, each in its cell (x = predicted, y = true).
    cells = {(int(t.get_position()[1]), int(t.get_position()[0])): t.get_text() for t in axes.texts}
    assert cells == {(r, c): str(confusion[r, c]) for r, c in zip(*np.nonzero(confusion))}
    # Colours are fractions of the true class: every non-empty row sums to 1.
    fractions = axes.images[0].get_array()
    np.testing.assert_allclose(fractions.sum(axis=1), [1, 1, 1, 0] + [1] * 6, atol=1e-12)
    png = io.BytesIO()
    figure.savefig(png, format="png")
    png.seek(0)
    assert mpimg.imread(png, format="png").shape[2] == 4


def test_picture_of_many_classes_leaves_names_out():
    confusion = np.eye(60, dtype=np.int64) * 3
    figure = reports.plot_confusion(confusion, [f"n{i:08d}" for i in range(60)], "many")
    [axes] = [a for a in figure.axes if a.get_xlabel() == "predicted class"]
    assert axes.get_xticklabels() == [] and axes.get_yticklabels() == []
    assert "60 classes: names left out" in axes.get_title()
    assert len(axes.texts) == 0  # No counts either.
    assert axes.images[0].get_array().shape == (60, 60)  # The matrix is still drawn.


def test_write_report_replaces_files_whole(tmp_path):
    directory = tmp_path / "reports" / reports.report_name("ckpt-4", "test")
    assert directory.name == "ckpt-4-test"
    names = ["cat", "dog", "emu", "fox"]
    record = {**RECORD, "num_examples": 18}
    reports.write_report(str(directory), record, np.zeros((4, 4), np.int64), names)
    report = reports.write_report(str(directory), record, hand_matrix(), names)
    assert sorted(os.listdir(directory)) == ["confusion_matrix.png", "eval_results.json"]
    with open(directory / "eval_results.json") as f:
        assert json.load(f) == report
    assert report["confusion_matrix"] == hand_matrix().tolist()  # The second one.
    assert mpimg.imread(directory / "confusion_matrix.png").ndim == 3


def test_a_picture_that_cannot_be_drawn_leaves_no_stale_one(tmp_path, monkeypatch, caplog):
    directory = tmp_path / "ckpt-4-test"
    names = ["cat", "dog", "emu", "fox"]
    record = {**RECORD, "num_examples": 18}
    reports.write_report(str(directory), record, hand_matrix(), names)
    assert (directory / "confusion_matrix.png").exists()
    for failure, message in [
        (ImportError("no matplotlib"), "it needs matplotlib"),
        (ValueError("bad mathtext"), "Could not draw confusion_matrix.png (bad mathtext)"),
    ]:
        reports.write_report(str(directory), record, hand_matrix(), names)

        def fail(*args, error=failure, **kwargs):
            raise error

        monkeypatch.setattr(reports, "plot_confusion", fail)
        caplog.clear()
        report = reports.write_report(str(directory), record, np.eye(4, dtype=int), names)
        monkeypatch.undo()
        assert os.listdir(directory) == ["eval_results.json"]  # The old picture is gone.
        assert report["confusion_matrix"] == np.eye(4, dtype=int).tolist()
        assert any(message in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_class_names_with_dollars_are_drawn_as_text(tmp_path):
    names = ["$5 or $10", "$\\frac", "coin", "card"]  # Unescaped: math, or a parse error.
    figure = reports.plot_confusion(hand_matrix(), names, "title")
    labels = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert labels == [r"\$5 or \$10", r"\$\frac", "coin", "card"]
    figure.savefig(io.BytesIO(), format="png")
