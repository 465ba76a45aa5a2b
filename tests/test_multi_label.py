"""Multi-label data end to end: a CSV of tags trains with sigmoid BCE, evaluates to mAP and F1,
exports sigmoid probabilities to every format, predicts the tags above the threshold, and
refuses the single-label options in one line."""

import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.data import mixing, shapes
from resnet_app.engine.losses import Loss, create_loss
from resnet_app.engine.losses.cross_entropy import CrossEntropy
from resnet_app.nets.resnet import create_model
from tests import own_data
from tests.commands import error_line, run_command
from tests.runs import read_records
from tests.test_label_metrics import loop_average_precision
from tests.test_losses import numpy_bce


def tags_of(images, labels):
    """Each image's shape, and "bright" for the brighter half: 11 classes, 1 or 2 tags each."""
    bright = images.reshape(len(images), -1).mean(axis=1) > np.median(images)
    return [
        shapes.CLASS_NAMES[label] + (" bright" if light else "")
        for label, light in zip(labels, bright, strict=True)
    ]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    root = tmp_path_factory.mktemp("tags")
    images, labels = shapes.generate("train", 128, seed=9)
    names = own_data.write_pngs(str(root / "images"), images)
    tags = tags_of(images, labels)
    splits = ["train"] * 96 + ["validation"] * 32
    rows = [(f"images/{n}", t, s) for n, t, s in zip(names, tags, splits, strict=True)]
    own_data.write_table(root / "tags.csv", rows)
    return root / "tags.csv", images[96:], tags[96:]


TRAIN = ["--model=tiny", "--batch_size=16", "--set=data.image_size=32", "--log_every=4"]


@pytest.fixture(scope="module")
def run(table, tmp_path_factory):
    path, _, _ = table
    model_dir = tmp_path_factory.mktemp("runs") / "tags"
    result = run_command(
        "resnet_app.train",
        f"--dataset=csv:{path}",
        *TRAIN,
        "--train_steps=12",
        "--eval_every=6",
        "--set=train.keep_best=true",
        f"--model_dir={model_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir, result


def test_the_loss_of_multi_hot_rows_mixed_against_numpy():
    model = create_model("tiny", num_classes=4)
    model.build((None, 8, 8, 3))
    images = np.random.default_rng(2).normal(size=(3, 8, 8, 3)).astype(np.float32)
    rows = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]], np.float32)
    batch = {
        "label": tf.constant(rows),
        "mask": tf.ones([3]),
        "mix_label": tf.constant(rows[::-1].copy()),
        "mix_weight": tf.constant([0.7, 0.5, 0.9]),
    }
    logits = model(images, training=True)
    sums = Loss((CrossEntropy(0.1),))(logits, batch)
    loss_sum, correct = sums["loss"], sums["correct"]
    logits = logits.numpy()
    weight = np.array([0.7, 0.5, 0.9])[:, None]
    targets = (weight * rows + (1 - weight) * rows[::-1]) * 0.9 + 0.1 / 4
    assert float(loss_sum) == pytest.approx(np.sum(numpy_bce(logits, targets)), rel=1e-5)
    top = logits.argmax(axis=1)
    assert float(correct) == np.sum(rows[np.arange(3), top] > 0)
    # Mixing swaps multi-hot rows whole, by each example's dominant share.
    mixed = mixing.mix_with(
        {"image": tf.constant(images), "label": tf.constant(rows)},
        {
            "lam": tf.constant([0.3, 0.8, 0.6]),
            "centre": tf.fill([3, 2], 0.5),
            "cutmix": tf.constant([False, False, False]),
        },
    )
    np.testing.assert_array_equal(mixed["label"].numpy(), [rows[2], rows[1], rows[2]])
    np.testing.assert_array_equal(mixed["mix_label"].numpy(), [rows[0], rows[1], rows[0]])


def reference_scores(model_dir, images, checkpoint):
    """Sigmoid probabilities of the restored network on NumPy-normalized images."""
    from resnet_app import config
    from resnet_app.data import run_pipeline
    from resnet_app.nets import factory

    resolved = config.read_run_config(str(model_dir))
    names, prep = run_pipeline.read_data_info(str(model_dir))
    model = factory.create_run_model(resolved, len(names), prep.image_size)
    tf.train.Checkpoint(model=model).restore(str(model_dir / checkpoint)).expect_partial()
    normalized = (images.astype(np.float32) - np.float32(prep.mean)) / np.float32(prep.std)
    logits = model(normalized, training=False).numpy()
    return names, 1 / (1 + np.exp(-logits.astype(np.float64)))


def test_training_reports_map_and_f1_and_keeps_the_best_by_map(run, table):
    model_dir, result = run
    _, images, tags = table
    assert "multi-label over 11 classes" in result.stderr
    evaluations = [r for r in read_records(model_dir) if "map" in r and "event" not in r]
    assert [r["step"] for r in evaluations] == [6, 12]
    last = evaluations[-1]
    assert last["num_examples"] == 32 and last["threshold"] == 0.5
    names, scores = reference_scores(model_dir, images, "ckpt-12")
    targets = np.array([[name in t.split() for name in names] for t in tags])
    present = [c for c in range(len(names)) if targets[:, c].any()]
    expected = np.mean([loop_average_precision(scores[:, c], targets[:, c]) for c in present])
    assert last["map"] == pytest.approx(expected, abs=1e-4)
    predicted = scores >= 0.5
    tp, fp = (predicted & targets).sum(), (predicted & ~targets).sum()
    fn = (~predicted & targets).sum()
    assert last["f1_micro"] == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-6)
    assert 0 <= last["f1_macro"] <= 1
    best = json.loads((model_dir / "best" / "best.json").read_text())
    assert best["metric"] == "map" and best["mode"] == "max"
    assert best["value"] == max(r["map"] for r in evaluations)


def test_report_writes_per_class_average_precision_and_the_worst_by_bce(run):
    """`report` is `evaluate`'s pass and report, and a page: its gallery is the highest mean
    BCE of the saved logits (NumPy), its per-class table the report's AP."""
    model_dir, _ = run
    result = run_command("resnet_app.report", f"--model_dir={model_dir}", "--top_losses=5")
    assert result.returncode == 0, result.stderr[-3000:]
    (name,) = os.listdir(model_dir / "reports")
    directory = model_dir / "reports" / name
    report = json.loads((directory / "eval_results.json").read_text())
    trained = [r for r in read_records(model_dir) if r.get("step") == 12 and "map" in r][0]
    assert report["map"] == pytest.approx(trained["map"], abs=1e-6)
    aps = [c["average_precision"] for c in report["classes"] if c["average_precision"] is not None]
    assert report["map"] == pytest.approx(np.mean(aps))
    assert {c["name"] for c in report["classes"]} >= {"bright", "circle"}
    assert "confusion_matrix" not in report
    with np.load(directory / "predictions.npz") as saved:
        ids, labels, logits = saved["id"], saved["label"], saved["logits"]
    losses = numpy_bce(logits, labels)
    worst = ids[np.lexsort((ids, -losses))[:5]]
    text = (directory / "report.html").read_text()
    assert [int(i) for i in re.findall(r'class="card" data-id="(\d+)"', text)] == list(worst)
    rows = re.findall(r"<tr><td>(\d+)</td><td>([^<]+)</td><td>(\d+)</td><td>([^<]*)</td>", text)
    assert [(int(i), n) for i, n, _, _ in rows] == [(c["id"], c["name"]) for c in report["classes"]]
    for (_, _, positives, ap), entry in zip(rows, report["classes"], strict=True):
        assert int(positives) == entry["positives"]
        expected = entry["average_precision"]
        assert ap == ("" if expected is None else f"{expected:.4f}")


def test_every_export_format_gives_sigmoid_probabilities(run, table, tmp_path):
    model_dir, _ = run
    _, images, _ = table
    export_dir = tmp_path / "export"
    result = run_command(
        "resnet_app.export",
        f"--model_dir={model_dir}",
        f"--export_dir={export_dir}",
        "--format=tflite,onnx",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _, scores = reference_scores(model_dir, images, "ckpt-12")
    served = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    probabilities = served(images=tf.constant(images))["probabilities"].numpy()
    np.testing.assert_allclose(probabilities, scores, atol=1e-5)
    assert not np.allclose(probabilities.sum(axis=1), 1, atol=0.05)  # Not a softmax.
    report = json.loads((export_dir / "export_report.json").read_text())
    rows = {row["format"]: row for row in report["formats"]}
    assert set(rows) == {"saved_model", "tflite_none", "onnx"}
    for name in ("tflite_none", "onnx"):
        assert rows[name]["max_prob_diff"] < 1e-4 and rows[name]["agreement"] == 1.0
    info = json.loads((export_dir / "model_info.json").read_text())
    assert info["multi_label"] is True and info["threshold"] == 0.5


def test_predict_prints_every_tag_above_the_threshold(run, table, tmp_path):
    model_dir, _ = run
    _, images, _ = table
    path = tmp_path / "one.png"
    tf.io.write_file(str(path), tf.io.encode_png(images[0]))
    result = run_command("resnet_app.predict", f"--model_dir={model_dir}", "--json", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    line = json.loads(result.stdout)
    names, scores = reference_scores(model_dir, images[:1], "ckpt-12")
    expected = {names[c] for c in np.flatnonzero(scores[0] >= 0.5)}
    assert {label["name"] for label in line["labels"]} == expected
    assert all(label["probability"] >= 0.5 for label in line["labels"])


@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("resnet_app.evaluate", ["--tta=flip"], "multi-label: drop --tta"),
        ("resnet_app.evaluate", ["--fit_temperature"], "this run's data is multi-label"),
    ],
)
def test_softmax_only_tools_refuse_in_one_line(run, command, flags, message):
    model_dir, _ = run
    assert message in error_line(run_command(command, f"--model_dir={model_dir}", *flags))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("train.class_weights=balanced", "is multi-label and train.class_weights needs one class"),
        ("data.sampling=balanced", "needs one class per image"),
        ("data.multi_label=false", "has several labels"),
    ],
)
def test_single_label_options_refuse_before_anything_is_written(table, tmp_path, setting, message):
    path, _, _ = table
    model_dir = tmp_path / "run"
    result = run_command(
        "resnet_app.train",
        f"--dataset=csv:{path}",
        *TRAIN,
        "--train_steps=2",
        f"--set={setting}",
        f"--model_dir={model_dir}",
    )
    assert message in error_line(result)
    # Only the run lock, which stays by design (`common/run_lock.py`).
    assert not model_dir.exists() or set(os.listdir(model_dir)) <= {"trainer.lock"}


def test_tensorboard_has_the_multi_label_scalars(run):
    model_dir, _ = run
    tags = set()
    for name in os.listdir(model_dir / "eval"):
        for event in tf.compat.v1.train.summary_iterator(str(model_dir / "eval" / name)):
            tags |= {value.tag for value in event.summary.value}
    assert {"map", "f1_micro", "f1_macro", "top1", "loss"} <= tags


def test_a_multi_label_run_distills_each_classs_sigmoid_from_a_multi_label_teacher(
    run, table, tmp_path
):
    """The module's run teaches a student on the same table: the tower's loss is the BCE
    of the student's sigmoids against the labels and against the teacher's (NumPy)."""
    from resnet_app import config
    from resnet_app.engine import setup
    from resnet_app.engine.step import Tower
    from tests.test_distill import numpy_distillation

    model_dir, _ = run
    path, images, tags = table
    resolved = config.resolve(
        sets=[
            "model.name=tiny",
            f"data.dataset=csv:{path}",
            "data.image_size=32",
            f"data.data_dir={tmp_path / 'data'}",
            f"train.teacher={model_dir}",
            "train.distill_alpha=0.6",
            "train.distill_temperature=2",
        ]
    )
    student = setup.build_run(resolved, str(tmp_path / "student"))
    try:
        names = student.pipeline.class_names
        labels = np.array([[name in tag.split() for name in names] for tag in tags], np.float32)
        preprocessing = student.pipeline.preprocessing
        batch_images = (images[:8].astype(np.float32) - preprocessing.mean) / preprocessing.std
        batch = {
            "image": tf.constant(batch_images),
            "label": tf.constant(labels[:8]),
            "mask": tf.ones(8),
        }
        loss = create_loss(resolved, teacher=student.teacher)
        _, sums = Tower(student.model, student.optimizer, loss)(batch, tf.constant(8.0), 1)
        logits = student.model(batch["image"], training=True).numpy()
        teacher = student.teacher(batch["image"]).numpy()
    finally:
        student.close()
    expected = numpy_distillation(logits, teacher, labels[:8], np.ones(8), 0.6, 2.0)
    np.testing.assert_allclose(float(sums["loss"]), expected, rtol=1e-5)
