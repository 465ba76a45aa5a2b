"""`resnet-app report` on a tiny run: the page's gallery, pairs and per-class table against
NumPy on the saved logits (themselves against plain model calls) and eval_results.json;
Grad-CAM against the closed form behind a global average pool; the streamed gallery against
one sort of the whole split; a 1000-class page's size; refusals in one line.

The page in a real browser: tests/test_report_browser.py (slow tier).
"""

import base64
import json
import os
import re
import shutil
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from resnet_app import config
from resnet_app.data import shapes
from resnet_app.data.shapes import CLASS_NAMES
from resnet_app.evaluation import gallery as gallery_lib
from resnet_app.evaluation import gradcam, page, reports
from resnet_app.nets import factory
from resnet_app.nets.resnet import create_model
from tests import own_data
from tests.commands import error_line, run_command
from tests.conftest import EVAL_EXAMPLES
from tests.test_losses import numpy_cross_entropy

TOP = 7


def numpy_losses(logits, labels):
    """Softmax cross-entropy of each row against its class id, in float64."""
    return numpy_cross_entropy(logits, np.eye(logits.shape[1])[labels])


@pytest.fixture(scope="module")
def report(tiny_run, tmp_path_factory):
    """(record, report directory, page text) of `report` on the tiny run's latest checkpoint."""
    _, model_dir = tiny_run
    reports_root = tmp_path_factory.mktemp("reports")
    result = run_command(
        "resnet_app.report",
        f"--model_dir={model_dir}",
        f"--report_dir={reports_root}",
        f"--top_losses={TOP}",
        "--batch_size=16",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(result.stdout)
    directory = record["report"]
    with open(os.path.join(directory, page.PAGE_FILE)) as f:
        return record, directory, f.read()


def saved(directory):
    with np.load(os.path.join(directory, page.PREDICTIONS_FILE)) as arrays:
        return {key: arrays[key] for key in arrays.files}


def test_the_saved_logits_are_the_models_on_every_example(report, tiny_run):
    resolved, model_dir = tiny_run
    _, directory, _ = report
    found = saved(directory)
    assert sorted(found["id"]) == list(range(EVAL_EXAMPLES))  # Each example once.
    from resnet_app.data import input_pipeline

    pipeline = input_pipeline.create_pipeline(resolved.data)
    model = factory.create_run_model(resolved, pipeline.num_classes, 32)
    tf.train.Checkpoint(model=model).restore(str(model_dir / "ckpt-4")).expect_partial()
    logits, labels, ids = [], [], []
    for batch in pipeline.eval_dataset(16):
        real = batch["mask"].numpy() > 0
        logits.append(model(batch["image"], training=False).numpy()[real])
        labels.append(batch["label"].numpy()[real])
        ids.append(batch["id"].numpy()[real])
    order = np.argsort(found["id"])
    expected_order = np.argsort(np.concatenate(ids))
    np.testing.assert_array_equal(found["label"][order], np.concatenate(labels)[expected_order])
    np.testing.assert_allclose(
        found["logits"][order], np.concatenate(logits)[expected_order], rtol=1e-5, atol=1e-5
    )


def test_the_gallery_shows_the_highest_losses_of_the_saved_logits(report):
    record, directory, text = report
    found = saved(directory)
    losses = numpy_losses(found["logits"], found["label"])
    worst = np.lexsort((found["id"], -losses))[:TOP]
    cards = re.findall(
        r'class="card" data-id="(\d+)" data-loss="([^"]+)" data-true="([^"]*)"', text
    )
    assert [int(card[0]) for card in cards] == [int(i) for i in found["id"][worst]]
    np.testing.assert_allclose([float(card[1]) for card in cards], losses[worst], rtol=1e-9)
    assert [card[2] for card in cards] == [CLASS_NAMES[found["label"][i]] for i in worst]
    # Two images per card (the image, its Grad-CAM), each a data URI: no file, no network.
    sources = re.findall(r'<img class="thumb" src="([^"]+)"', text)
    assert len(sources) >= 2 * TOP and all(s.startswith("data:image/") for s in sources)
    assert len(re.findall(r'src="', text)) == len(sources) and "href=" not in text


def test_the_per_class_table_and_the_pairs_agree_with_eval_results(report):
    _, directory, text = report
    with open(os.path.join(directory, reports.RESULTS_FILE)) as f:
        results = json.load(f)
    recalls = re.findall(r'<td data-recall="([^"]*)">', text)
    assert len(recalls) == len(CLASS_NAMES)
    expected = [str(entry["recall"]) if entry["recall"] is not None else "None"
                for entry in results["classes"]]  # fmt: skip
    assert recalls == expected
    confusion = np.array(results["confusion_matrix"])
    off = confusion - np.diag(np.diag(confusion))
    pair = r'<div class="card pair"><b>([^<]+)</b> taken for <b>([^<]+)</b>: (\d+) times<br>'
    pairs = re.findall(pair + r"\s*((?:<img [^>]*>)*)</div>", text)
    assert len(pairs) == min(page.MAX_PAIRS, np.count_nonzero(off))
    for *_, count, images in pairs:  # Its three highest-loss examples, or all it has.
        assert images.count("<img ") == min(int(count), 3)
    true, predicted = np.unravel_index(np.argmax(off), off.shape)  # The first largest cell.
    assert pairs[0][:3] == (CLASS_NAMES[true], CLASS_NAMES[predicted], str(off.max()))


@pytest.mark.parametrize("name, size", [("tiny", 32), ("resnet18", 96)])
def test_grad_cam_is_the_class_activation_map_behind_the_global_average_pool(name, size):
    """d logit_c / d A[i, j, k] = scale * W[k, c] / (h * w) for every position: so Grad-CAM is
    ReLU(A . W[:, c]) scaled to a peak of 1, computed here in NumPy from the activations."""
    keras.utils.set_random_seed(0)
    model = create_model(name, num_classes=10)
    images = np.random.default_rng(0).normal(size=(4, size, size, 3)).astype(np.float32)
    classes = model(images, training=False).numpy().argmax(axis=1)  # As the page: predicted.
    activations, gradients = gradcam.activations_and_gradients(model, images, classes)
    kernel = model.logits.kernel.numpy().astype(np.float64)
    _, height, width, _ = activations.shape
    scale = model.config.logit_scale
    expected_gradients = np.broadcast_to(
        scale * kernel.T[classes][:, None, None, :] / (height * width), gradients.shape
    )
    np.testing.assert_allclose(gradients, expected_gradients, rtol=1e-5, atol=1e-9)
    cam = np.maximum(np.einsum("bhwk,bk->bhw", activations, kernel.T[classes]), 0)
    assert height * width > 1 and (cam.max(axis=(1, 2)) > 0).all()  # A map worth comparing.
    cam /= cam.max(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(gradcam.maps(activations, gradients), cam, rtol=1e-4, atol=1e-6)


def test_the_streamed_gallery_equals_one_sort_of_the_whole_split():
    rng = np.random.default_rng(1)
    count, classes, examples = 9, 6, 300
    logits = rng.normal(size=(examples, classes)).astype(np.float32) * 3
    labels = rng.integers(0, classes, examples)
    images = rng.normal(size=(examples, 8, 8, 1)).astype(np.float32)
    gallery = gallery_lib.Gallery(count, mean=[100.0], std=[50.0], multi_label=False)
    start = 0
    for size in rng.integers(1, 40, 100):
        stop = min(start + size, examples)
        part = slice(start, stop)
        gallery.add(
            {
                "id": np.arange(examples)[part],
                "label": labels[part],
                "prediction": logits[part].argmax(axis=1),
                "logits": logits[part],
                "image": images[part],
            }
        )
        start = stop
    assert start == examples
    losses = numpy_losses(logits, labels)
    worst = np.argsort(-losses, kind="stable")[:count]
    np.testing.assert_array_equal(gallery.worst["id"], worst)
    np.testing.assert_array_equal(gallery.worst["image"], images[worst])
    predictions = logits.argmax(axis=1)
    for (true, predicted), kept in gallery.pairs.items():
        members = np.flatnonzero((labels == true) & (predictions == predicted))
        expected = members[np.argsort(-losses[members], kind="stable")][:3]
        assert [example_id for _, example_id, _ in kept] == list(expected)
        pixels = np.clip(np.rint(images[expected] * 50 + 100), 0, 255).astype(np.uint8)
        np.testing.assert_array_equal(np.stack([image for *_, image in kept]), pixels)
    wrong = {(t, p) for t, p in zip(labels, predictions, strict=True) if t != p}
    assert set(gallery.pairs) == wrong


def test_a_thousand_class_page_stays_small(tmp_path):
    """1000 classes, 224-pixel colour images: the page holds at most 50 pairs and is <= 5 MB."""
    rng = np.random.default_rng(2)
    classes, examples, size = 1000, 1200, 224
    names = [f"class {i} <{i}>" for i in range(classes)]  # Escaped on the page.
    labels = rng.integers(0, classes, examples)
    logits = rng.normal(size=(examples, classes)).astype(np.float32)
    predictions = logits.argmax(axis=1)
    # Smooth images, as photographs are: 8x8 noise scaled up.
    coarse = rng.normal(size=(64, 8, 8, 3)).astype(np.float32)
    images = tf.image.resize(coarse, [size, size]).numpy()
    gallery = gallery_lib.Gallery(25, mean=[120.0] * 3, std=[60.0] * 3, multi_label=False)
    for start in range(0, examples, 64):
        part = slice(start, start + 64)
        gallery.add(
            {
                "id": np.arange(examples)[part],
                "label": labels[part],
                "prediction": predictions[part],
                "logits": logits[part],
                "image": images[: len(labels[part])],
            }
        )
    confusion = np.zeros((classes, classes), np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    record = {"checkpoint": "ckpt-1", "step": 1, "split": "validation", "top1": 0.001,
              "top5": 0.005, "loss": 7.0, "num_examples": examples, "precision": "fp32",
              "balanced_accuracy": 0.001, "weights": "raw", "ece": 0.1, "nll": 7.0}  # fmt: skip
    report = reports.build_report(record, confusion, names)
    model = create_model("tiny", num_classes=classes)
    model(images[:1], training=False)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "event": "start", "total_steps": 1}\n')
    pipeline = types.SimpleNamespace(
        class_names=names,
        num_classes=classes,
        channels=3,
        preprocessing=types.SimpleNamespace(eval_size=size),
    )
    session = types.SimpleNamespace(
        model_dir=str(run_dir), run_config=config.Config(), pipeline=pipeline, model=model
    )
    result = types.SimpleNamespace(
        ids=np.arange(examples), labels=labels, logits=logits, confusion=confusion,
        multi_label=False,
    )  # fmt: skip
    (tmp_path / "report").mkdir()
    path = page.write_page(session, str(tmp_path / "report"), report, result, gallery)
    with open(path) as f:
        text = f.read()
    assert os.path.getsize(path) <= 5 * 2**20
    assert text.count('<div class="card" data-id=') == 25
    pair = r'<div class="card pair"><b>class \d+ &lt;\d+&gt;</b> taken for <b>class \d+ &lt;'
    assert len(re.findall(pair, text)) == page.MAX_PAIRS
    assert text.count("<td data-recall=") == classes
    assert "<details>" in text  # The per-class table starts folded.


def greyscale_idx_run(root, train, test, *flags):
    """A tiny run on greyscale shapes written as IDX files (Fashion-MNIST's layout) under
    root/data: `train` and `test` images; `flags` for the trainer. Its run directory."""
    images, labels = shapes.generate("train", train + test, seed=5)
    grey, labels = images.mean(axis=-1).astype(np.uint8), labels.astype(np.uint8)
    arrays = {}
    for split, part in (("train", slice(0, train)), ("test", slice(train, None))):
        arrays[(split, "images")], arrays[(split, "labels")] = grey[part], labels[part]
    own_data.write_idx(str(root / "data"), arrays)
    model_dir = root / "run"
    dataset = f"--dataset=idx:{root / 'data'}"
    result = run_command(
        "resnet_app.train", dataset, "--model=tiny", *flags, f"--model_dir={model_dir}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return model_dir


@pytest.fixture
def idx_run(tmp_path):
    """A bf16 run of 2 steps on 36 training and 12 test images, under tmp_path."""
    flags = ("--batch_size=8", "--train_steps=2", "--set=data.image_size=16")
    return greyscale_idx_run(tmp_path, 36, 12, *flags, "--set=train.precision=bf16")


def test_refusals_are_one_line(tiny_run, idx_run, tmp_path):
    _, model_dir = tiny_run

    def report_error(*args):
        return error_line(run_command("resnet_app.report", f"--model_dir={model_dir}", *args))

    assert "--top_losses must be in [1, 200], got 0" in report_error("--top_losses=0")
    line = report_error("--split=bogus")
    assert "no split 'bogus'" in line
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(model_dir / "config.yaml", empty / "config.yaml")
    line = error_line(run_command("resnet_app.report", f"--model_dir={empty}"))
    assert "checkpoint" in line
    shared = tmp_path / "shared"
    (shared / "ckpt-4-test").mkdir(parents=True)
    (shared / "ckpt-4-test" / reports.RESULTS_FILE).write_text('{"model_dir": "/another/run"}')
    line = report_error(f"--report_dir={shared}")
    assert "another run (/another/run)" in line and "--report_dir" in line
    shutil.move(tmp_path / "data", tmp_path / "moved")
    line = error_line(run_command("resnet_app.report", f"--model_dir={idx_run}"))
    assert "--data_dir" in line


def test_a_bf16_greyscale_run_on_two_towers_with_its_data_moved(idx_run, tmp_path):
    """Greyscale stays grey; the towers gather bfloat16 images; --data_dir finds the data."""
    shutil.move(tmp_path / "data", tmp_path / "moved")
    args = [f"--model_dir={idx_run}", "--num_towers=2", "--top_losses=12"]
    result = run_command("resnet_app.report", *args, f"--data_dir={tmp_path / 'moved'}")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(json.loads(result.stdout)["report"], page.PAGE_FILE)) as f:
        text = f.read()
    first = re.search(r'<img class="thumb" src="data:image/png;base64,([^"]+)"', text)
    image = tf.io.decode_png(base64.b64decode(first.group(1))).numpy()
    assert image.shape == (16, 16, 1)  # The model's input as it is: one channel, 16 px.
    with np.load(os.path.join(json.loads(result.stdout)["report"], page.PREDICTIONS_FILE)) as f:
        ids, labels, logits = f["id"], f["label"], f["logits"]
    assert sorted(ids) == list(range(12))  # Each test example once, over both towers.
    worst = ids[np.lexsort((ids, -numpy_losses(logits, labels)))]
    assert [int(i) for i in re.findall(r'class="card" data-id="(\d+)"', text)] == list(worst)
