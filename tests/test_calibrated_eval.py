"""Calibration, temperature scaling and test-time augmentation in evaluation.

In process: `exact_eval.evaluate`'s collected logits, flip and 10-crop
averages on 1 and 3 towers, against the model called directly on images
flipped and cropped with NumPy. End to end (`python -m resnet_app.evaluate`):
the record's ECE and NLL against the logits of the restored model computed
here, the reliability report, `--fit_temperature` against a brute-force grid
search over the holdout logits, the scaled calibration, and the one-line
refusals.
"""

import dataclasses
import json
import os
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from matplotlib import image as mpimg

from resnet_app.common.distribute import mirrored_strategy
from resnet_app.data import input_pipeline, preprocessing
from resnet_app.data.settings import data_config
from resnet_app.engine import exact_eval
from resnet_app.evaluation import calibration, reports
from resnet_app.nets import factory
from resnet_app.nets.resnet import create_model
from tests import runs
from tests.commands import error_line, run_command
from tests.conftest import EVAL_EXAMPLES

TOWERS = ["/cpu:0", "/cpu:1", "/cpu:2"]
HOLDOUT = 16


# References, computed here with NumPy and direct model calls.


def softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def mean_nll(probabilities, labels):
    return float(-np.mean(np.log(probabilities[np.arange(len(labels)), labels])))


def top_k_accuracy(probabilities, labels, k):
    true = probabilities[np.arange(len(labels)), labels]
    return float(np.mean((probabilities > true[:, None]).sum(axis=1) < k))


def strategy_for(towers):
    if towers == 1:
        return tf.distribute.OneDeviceStrategy("/cpu:0")
    return mirrored_strategy(TOWERS[:towers])


def normalize(images, config):
    """uint8 (or resized float) pixels to the network's input, in NumPy."""
    mean, std = np.array(config.mean, np.float32), np.array(config.std, np.float32)
    return ((np.asarray(images, np.float32) - mean) / std).astype(np.float32)


def mirror(images):
    """NHWC images mirrored left to right."""
    return images[:, :, ::-1, :]


# In process: a tiny network with stretched random weights, so that its
# predictions differ between examples and between views.


def stretched_weights(image_size, images):
    """A random tiny network predicts nearly one class for everything: its logits
    are stretched and centred on `images`, so that predictions vary. Seeded: the
    tests' checks that they discriminate (several classes predicted) hold for
    these weights, not by the luck of the process's random state."""
    keras.utils.set_random_seed(0)
    model = create_model("tiny", num_classes=10)
    model.build((None, image_size, image_size, 3))
    kernel, bias = model.logits.kernel, model.logits.bias
    kernel.assign(tf.random.stateless_normal(kernel.shape, seed=[3, 4]) * 10)
    bias.assign(-tf.reduce_mean(model(images, training=False), axis=0))
    return model.get_weights()


def model_with(weights, image_size, strategy=None):
    with (strategy or tf.distribute.get_strategy()).scope():
        model = create_model("tiny", num_classes=10)
        model.build((None, image_size, image_size, 3))
    model.set_weights(weights)
    return model


@pytest.fixture(scope="module")
def cifar_pipeline(tmp_path_factory):
    return input_pipeline.create_pipeline(
        data_config(
            dataset="shapes",
            data_dir=str(tmp_path_factory.mktemp("cache")),
            train_examples=64,
            eval_examples=EVAL_EXAMPLES,
        )
    )


def by_id(result):
    """The result's per-example arrays in id order."""
    order = np.argsort(result.ids)
    assert result.ids[order].tolist() == list(range(len(order)))  # Each example once.
    return result.labels[order], result.logits[order]


def test_collected_logits_are_the_models_and_off_by_default(cifar_pipeline):
    images = normalize(cifar_pipeline.eval_split().images, cifar_pipeline.preprocessing)
    weights = stretched_weights(32, images)
    model = model_with(weights, 32)
    expected = model(images, training=False).numpy()

    plain = exact_eval.evaluate(model, cifar_pipeline, 16)
    assert plain.logits is None and plain.ids is None and plain.tta is None
    result = exact_eval.evaluate(model, cifar_pipeline, 16, collect_logits=True, temperature=2.5)
    labels, logits = by_id(result)
    assert logits.dtype == np.float32 and logits.shape == (EVAL_EXAMPLES, 10)
    np.testing.assert_array_equal(labels, cifar_pipeline.eval_split().labels)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    scaled = result.scaled_logits[np.argsort(result.ids)]
    np.testing.assert_allclose(softmax(scaled), softmax(expected / 2.5), rtol=1e-5, atol=1e-7)
    assert result.temperature == 2.5
    # Collecting changes no number.
    np.testing.assert_equal(
        *(exact_eval.eval_record(0, "test", r, "fp32") for r in (result, plain))
    )


@pytest.mark.parametrize("towers", [1, 3])
def test_flip_averages_the_probabilities_of_each_image_and_its_mirror(cifar_pipeline, towers):
    images = normalize(cifar_pipeline.eval_split().images, cifar_pipeline.preprocessing)
    weights = stretched_weights(32, images)
    reference = model_with(weights, 32)
    labels = cifar_pipeline.eval_split().labels
    single = softmax(reference(images, training=False).numpy())
    flipped = softmax(reference(np.ascontiguousarray(mirror(images)), training=False).numpy())
    expected = (single + flipped) / 2
    # A discriminating check: the mirror changes the probabilities beyond the tolerance.
    assert np.abs(expected - single).max() > 1e-2
    assert len(set(expected.argmax(axis=1).tolist())) > 3

    strategy = strategy_for(towers)
    model = model_with(weights, 32, strategy)
    # 9 a step, 3 a tower: the last batch is mostly padding.
    result = exact_eval.evaluate(
        model, cifar_pipeline, 9, strategy, collect_logits=True, tta="flip", temperature=0.5
    )
    got_labels, logits = by_id(result)
    np.testing.assert_array_equal(got_labels, labels)
    np.testing.assert_allclose(softmax(logits), expected, rtol=1e-4, atol=1e-6)
    assert result.tta == "flip" and result.examples == EVAL_EXAMPLES
    assert result.accuracy == np.mean(expected.argmax(axis=1) == labels)
    assert result.top5_accuracy == top_k_accuracy(expected, labels, 5)
    assert result.loss == pytest.approx(mean_nll(expected, labels), rel=1e-5)
    # At a temperature, each view's logits are divided before the average.
    single_t, flipped_t = (
        softmax(reference(x, training=False).numpy() / 0.5)
        for x in (images, np.ascontiguousarray(mirror(images)))
    )
    scaled = result.scaled_logits[np.argsort(result.ids)]
    np.testing.assert_allclose(softmax(scaled), (single_t + flipped_t) / 2, rtol=1e-4, atol=1e-6)


def ten_crops(image, config):
    """The 10 views of one uint8 image, written out with NumPy slices: resize the
    shorter side to eval_resize (TensorFlow's bilinear resize, as evaluation does),
    then the centre, top-left, top-right, bottom-left and bottom-right crops, then
    the same mirrored."""
    height, width = image.shape[:2]
    scale = config.eval_resize / min(height, width)
    new_height, new_width = round(height * scale), round(width * scale)
    resized = tf.image.resize(image.astype(np.float32), [new_height, new_width]).numpy()
    size = config.image_size
    down, across = new_height - size, new_width - size
    corners = [(down // 2, across // 2), (0, 0), (0, across), (down, 0), (down, across)]
    crops = np.stack([resized[t : t + size, x : x + size] for t, x in corners])
    crops = normalize(crops, config)
    return np.concatenate([crops, mirror(crops)])


def test_crops_are_the_centre_and_corners_of_the_resized_image():
    # Not square: the corners differ in both directions.
    image = np.random.default_rng(0).integers(0, 256, size=(40, 50, 3), dtype=np.uint8)
    config = preprocessing.Preprocessing(
        family="imagenet", image_size=24, mean=(120, 110, 100), std=(60, 50, 40), eval_resize=28
    )
    crops = preprocessing.imagenet_eval_crops(tf.constant(image), config).numpy()
    assert crops.shape == (5, 24, 24, 3)
    np.testing.assert_allclose(crops, ten_crops(image, config)[:5], rtol=1e-5, atol=1e-5)
    centre = preprocessing.imagenet_eval(tf.constant(image), config).numpy()
    np.testing.assert_array_equal(crops[0], centre)  # The single view is the first crop.


@pytest.mark.parametrize("towers", [1, 3])
def test_ten_crops_average_the_views_of_an_imagenet_style_pipeline(tmp_path_factory, towers):
    pipeline = input_pipeline.create_pipeline(
        data_config(
            dataset="shapes",
            data_dir=str(tmp_path_factory.getbasetemp() / "crops_cache"),
            train_examples=64,
            eval_examples=11,
            preprocessing="imagenet",
            image_size=24,
            eval_resize=30,
        )
    )
    config = pipeline.preprocessing
    assert config.family == "imagenet" and config.eval_resize == 30
    split = pipeline.eval_split()
    views = np.stack([ten_crops(image, config) for image in split.images])  # [n, 10, ...]
    weights = stretched_weights(24, views.reshape(-1, 24, 24, 3))
    reference = model_with(weights, 24)
    probabilities = softmax(reference(views.reshape(-1, 24, 24, 3), training=False).numpy())
    expected = probabilities.reshape(len(views), 10, 10).mean(axis=1)
    centre_only = probabilities.reshape(len(views), 10, 10)[:, 0]
    assert np.abs(expected - centre_only).max() > 1e-2  # The other views matter.

    strategy = strategy_for(towers)
    model = model_with(weights, 24, strategy)
    result = exact_eval.evaluate(model, pipeline, 6, strategy, collect_logits=True, tta="crops")
    labels, logits = by_id(result)
    np.testing.assert_array_equal(labels, split.labels)
    np.testing.assert_allclose(softmax(logits), expected, rtol=1e-4, atol=1e-6)
    assert result.accuracy == np.mean(expected.argmax(axis=1) == labels)
    # Without TTA the same pipeline evaluates the centre crop alone.
    single = exact_eval.evaluate(model, pipeline, 6, strategy, collect_logits=True)
    np.testing.assert_allclose(softmax(by_id(single)[1]), centre_only, rtol=1e-4, atol=1e-6)


def test_unknown_tta_is_refused_in_process(cifar_pipeline):
    model = model_with(stretched_weights(32, np.zeros((1, 32, 32, 3), np.float32)), 32)
    with pytest.raises(ValueError, match="unknown test-time augmentation 'mirror'"):
        exact_eval.evaluate(model, cifar_pipeline, 16, tta="mirror")


def test_the_report_holds_the_reliability_bins_and_diagram(tmp_path):
    rng = np.random.default_rng(1)
    probabilities = softmax(rng.normal(size=(50, 4)) * 3)
    labels = rng.integers(0, 4, size=50)
    bins = calibration.reliability(probabilities, labels)
    record = {"checkpoint": "ckpt-4", "step": 4, "split": "test", "top1": 0.5}
    record.update(top5=1.0, loss=1.0, num_examples=50, tta="flip", ece=bins["ece"], nll=1.0)
    confusion = np.ones((4, 4), np.int64)
    directory = tmp_path / reports.report_name("ckpt-4", "test", "flip")
    assert directory.name == "ckpt-4-test-flip"
    report = reports.write_report(str(directory), record, confusion, list("abcd"), bins)
    assert sorted(os.listdir(directory)) == [
        "confusion_matrix.png",
        "eval_results.json",
        "reliability.png",
    ]
    assert mpimg.imread(directory / "reliability.png").ndim == 3
    with open(directory / "eval_results.json") as f:
        assert json.load(f) == report
    rows = report["reliability"]
    assert [row["bin"] for row in rows] == list(range(15))
    assert sum(row["count"] for row in rows) == 50
    for row in rows:  # Each bin against the examples whose confidence falls in it.
        confidence = probabilities.max(axis=1)
        inside = (confidence > row["lower"]) & (confidence <= row["upper"])
        if row["bin"] == 0:
            inside |= confidence == 0
        assert row["count"] == inside.sum()
        if row["count"]:
            correct = probabilities.argmax(axis=1)[inside] == labels[inside]
            assert row["accuracy"] == pytest.approx(correct.mean())
            assert row["confidence"] == pytest.approx(confidence[inside].mean())
        else:
            assert row["accuracy"] is None and row["confidence"] is None
    # Without calibration, an older diagram is removed rather than left to disagree.
    reports.write_report(str(directory), record, confusion, list("abcd"))
    assert "reliability.png" not in os.listdir(directory)


# End to end, on trained runs.


def restored_logits(resolved, model_dir, name, split=None, eval_examples=EVAL_EXAMPLES):
    """The logits and labels of checkpoint `name` on a split, from plain model calls."""
    data = dataclasses.replace(resolved.data, eval_examples=eval_examples)
    pipeline = input_pipeline.create_pipeline(data)
    model = factory.create_run_model(resolved, pipeline.num_classes, 32)
    tf.train.Checkpoint(model=model).restore(str(model_dir / name)).expect_partial()
    images, labels = [], []
    for batch in pipeline.eval_dataset(16, split):
        real = batch["mask"].numpy() > 0  # Drop the padding.
        images.append(batch["image"].numpy()[real])
        labels.append(batch["label"].numpy()[real])
    images, labels = np.concatenate(images), np.concatenate(labels)
    return model, images, model(images, training=False).numpy(), labels


def evaluate_cli(model_dir, *args):
    return run_command("resnet_app.evaluate", f"--model_dir={model_dir}", *args)


def json_lines(result):
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def read_report(record):
    with open(os.path.join(record["report"], "eval_results.json")) as f:
        return json.load(f)


def test_the_record_measures_calibration_from_every_examples_logits(tiny_run, tmp_path):
    resolved, model_dir = tiny_run
    [record] = json_lines(evaluate_cli(model_dir, f"--report_dir={tmp_path}"))
    _, _, logits, labels = restored_logits(resolved, model_dir, "ckpt-4")
    probabilities = softmax(logits)
    assert record["num_examples"] == len(labels) == EVAL_EXAMPLES
    assert record["tta"] is None
    assert "ece_scaled" not in record and "temperature" not in record  # No temperature.json.
    assert record["ece"] == pytest.approx(
        calibration.expected_calibration_error(probabilities, labels), abs=1e-6
    )
    assert record["nll"] == pytest.approx(mean_nll(probabilities, labels), rel=1e-5)
    assert record["nll"] == pytest.approx(record["loss"], rel=1e-5)  # Two ways to one number.
    assert record["report"] == str(tmp_path / "ckpt-4-test")
    assert sorted(os.listdir(record["report"])) == [
        "confusion_matrix.png",
        "eval_results.json",
        "reliability.png",
    ]
    report = read_report(record)
    bins = calibration.reliability(probabilities, labels)
    assert [row["count"] for row in report["reliability"]] == bins["count"]
    assert {k: report[k] for k in record if k != "report"} == {
        k: v for k, v in record.items() if k != "report"
    }


def test_flip_on_three_towers_matches_the_average_over_the_mirror(tiny_run, tmp_path):
    resolved, model_dir = tiny_run
    result = evaluate_cli(
        model_dir, "--tta=flip", "--num_towers=3", "--batch_size=9", f"--report_dir={tmp_path}"
    )
    [record] = json_lines(result)
    model, images, logits, labels = restored_logits(resolved, model_dir, "ckpt-4")
    flipped = model(np.ascontiguousarray(mirror(images)), training=False).numpy()
    expected = (softmax(logits) + softmax(flipped)) / 2
    assert record["tta"] == "flip"
    assert record["report"] == str(tmp_path / "ckpt-4-test-flip")
    assert record["top1"] == np.mean(expected.argmax(axis=1) == labels)
    assert record["top5"] == top_k_accuracy(expected, labels, 5)
    assert record["loss"] == pytest.approx(mean_nll(expected, labels), rel=1e-5)
    assert record["nll"] == pytest.approx(mean_nll(expected, labels), rel=1e-5)
    assert record["ece"] == pytest.approx(
        calibration.expected_calibration_error(expected, labels), abs=1e-6
    )
    single = mean_nll(softmax(logits), labels)
    assert abs(single - record["loss"]) > 1e-4  # Not the single view's numbers.
    assert read_report(record)["tta"] == "flip"
    assert "(flip: views averaged)" in result.stderr


def test_crops_of_an_imagenet_style_run_match_the_ten_view_average(tiny_run, tmp_path):
    """The tiny run, its config switched to the ImageNet recipe (eval_resize 36, crops
    of 32): the record against the 10 views made here with NumPy slices."""
    resolved, model_dir = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    tree = yaml.safe_load((copy / "config.yaml").read_text())
    tree["data"].update(preprocessing="imagenet", eval_resize=36)
    (copy / "config.yaml").write_text(yaml.safe_dump(tree))
    result = evaluate_cli(copy, "--tta=crops", "--num_towers=3", "--batch_size=9")
    [record] = json_lines(result)

    data = dataclasses.replace(resolved.data, preprocessing="imagenet", eval_resize=36)
    pipeline = input_pipeline.create_pipeline(data)
    model = factory.create_run_model(resolved, pipeline.num_classes, 32)
    tf.train.Checkpoint(model=model).restore(str(model_dir / "ckpt-4")).expect_partial()
    split = pipeline.eval_split()
    views = np.stack([ten_crops(image, pipeline.preprocessing) for image in split.images])
    probabilities = softmax(model(views.reshape(-1, 32, 32, 3), training=False).numpy())
    expected = probabilities.reshape(len(views), 10, -1).mean(axis=1)
    labels = split.labels
    assert record["tta"] == "crops" and record["report"].endswith("/ckpt-4-test-crops")
    assert record["num_examples"] == EVAL_EXAMPLES
    assert record["top1"] == np.mean(expected.argmax(axis=1) == labels)
    assert record["loss"] == pytest.approx(mean_nll(expected, labels), rel=1e-5)
    assert record["ece"] == pytest.approx(
        calibration.expected_calibration_error(expected, labels), abs=1e-6
    )
    centre = probabilities.reshape(len(views), 10, -1)[:, 0]
    assert abs(mean_nll(centre, labels) - record["loss"]) > 1e-4  # Not the centre crop alone.


def test_a_fitted_temperature_is_reported_scaled(tiny_run, tmp_path):
    resolved, model_dir = tiny_run
    copy = runs.copy_with_temperature(model_dir, tmp_path / "run", 0.25, step=2)
    result = evaluate_cli(copy)
    [record] = json_lines(result)
    _, _, logits, labels = restored_logits(resolved, model_dir, "ckpt-4")
    scaled = softmax(logits / 0.25)
    assert record["temperature"] == 0.25
    assert record["ece_scaled"] == pytest.approx(
        calibration.expected_calibration_error(scaled, labels), abs=1e-6
    )
    assert record["nll_scaled"] == pytest.approx(mean_nll(scaled, labels), rel=1e-5)
    # The raw numbers are the raw model's, and a temperature changes no prediction.
    assert record["nll"] == pytest.approx(mean_nll(softmax(logits), labels), rel=1e-5)
    assert record["top1"] == np.mean(scaled.argmax(axis=1) == labels)
    assert abs(record["nll_scaled"] - record["nll"]) > 1e-3
    assert "was fitted on ckpt-2, not ckpt-4" in result.stderr


def grid_search_temperature(logits, labels):
    """The T minimizing the NLL, by brute force: a grid over [0.05, 20], then a finer
    grid around its best point."""

    def nll(temperatures):
        scaled = logits[None] / temperatures[:, None, None]
        shifted = scaled - scaled.max(axis=2, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=2, keepdims=True))
        return -log_probs[:, np.arange(len(labels)), labels].mean(axis=1)

    coarse = np.arange(0.05, 20.0, 0.005)
    best = coarse[np.argmin(nll(coarse))]
    fine = np.arange(best - 0.01, best + 0.01, 1e-5)
    return float(fine[np.argmin(nll(fine))])


@pytest.fixture(scope="module")
def holdout_run(tmp_path_factory):
    """The tiny network trained 8 steps on 64 - 16 shapes images, 16 held out."""
    from resnet_app.engine import loop

    root = tmp_path_factory.mktemp("holdout_run")
    resolved = runs.small_config(
        root,
        f"data.validation_split={HOLDOUT}",
        "schedule.name=constant",  # 0.1 throughout: overconfident enough to calibrate.
        train_steps=8,
        eval_every=8,
        log_every=8,
    )
    model_dir = root / "run"
    loop.train_and_evaluate(resolved, str(model_dir))
    return resolved, model_dir


def test_fit_temperature_matches_a_grid_search_over_the_holdout(holdout_run, tmp_path):
    resolved, model_dir = holdout_run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    result = evaluate_cli(copy, "--fit_temperature", "--num_towers=3", "--batch_size=6")
    [record] = json_lines(result)
    with open(copy / "temperature.json") as f:
        assert json.load(f) == record
    assert list(record) == list(calibration.TEMPERATURE_FIELDS)
    _, _, logits, labels = restored_logits(resolved, model_dir, "ckpt-8", "holdout")
    logits = logits.astype(np.float64)
    assert len(labels) == HOLDOUT == record["num_examples"]
    assert record["checkpoint"] == "ckpt-8" and record["step"] == 8
    assert record["split"] == "holdout"
    temperature = grid_search_temperature(logits, labels)
    assert 0.06 < temperature < 19.9  # A minimum inside the interval, not at an end.
    assert record["temperature"] == pytest.approx(temperature, abs=1e-3)
    assert calibration.read_temperature(str(copy)) == record["temperature"]
    for suffix, t in (("before", 1.0), ("after", record["temperature"])):
        probabilities = softmax(logits / t)
        assert record[f"nll_{suffix}"] == pytest.approx(mean_nll(probabilities, labels), rel=1e-5)
        assert record[f"ece_{suffix}"] == pytest.approx(
            calibration.expected_calibration_error(probabilities, labels), abs=1e-6
        )
    assert record["nll_after"] < record["nll_before"]
    assert "fitted on 16 holdout examples" in result.stderr

    # The run evaluates on its holdout by default: the scaled numbers are the fit's.
    [evaluated] = json_lines(evaluate_cli(copy, f"--report_dir={tmp_path / 'reports'}"))
    assert evaluated["split"] == "holdout" and evaluated["temperature"] == record["temperature"]
    assert evaluated["nll_scaled"] == pytest.approx(record["nll_after"], rel=1e-5)
    assert evaluated["ece_scaled"] == pytest.approx(record["ece_after"], abs=1e-6)
    assert evaluated["nll"] == pytest.approx(record["nll_before"], rel=1e-5)


@pytest.mark.parametrize(
    "which_run, args, message",
    [
        ("tiny", ["--fit_temperature"], "train with --set data.validation_split=N"),
        ("holdout", ["--fit_temperature", "--checkpoint=all"], "fits one checkpoint"),
        ("holdout", ["--fit_temperature", "--tta=flip"], "drop --tta"),
        ("holdout", ["--fit_temperature", "--split=test"], "drop --split"),
        ("tiny", ["--tta=crops"], "uses the cifar recipe, whose images are not cropped: use"),
        ("tiny", ["--tta=mirror"], "flag --tta=mirror: value should be one of <flip|crops>"),
    ],
)
def test_mistakes_are_one_line(tiny_run, holdout_run, which_run, args, message):
    _, model_dir = tiny_run if which_run == "tiny" else holdout_run
    metrics_before = (model_dir / "metrics.jsonl").read_text()
    assert message in error_line(evaluate_cli(model_dir, *args))
    assert not (model_dir / "temperature.json").exists()
    assert (model_dir / "metrics.jsonl").read_text() == metrics_before  # Refused before work.


def test_a_damaged_temperature_file_is_one_line(tiny_run, tmp_path):
    _, model_dir = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    (copy / "temperature.json").write_text('{"temperature": ')
    line = error_line(evaluate_cli(copy))
    assert f"{copy / 'temperature.json'} is damaged" in line
    assert line.endswith(f"--model_dir={copy} --fit_temperature")


def test_two_workers_gather_every_examples_logits(tiny_run, tmp_path):
    """2 workers, 4 examples each per step, flip and a temperature: each worker's
    calibration covers all 37 examples (the logits are gathered), and matches NumPy."""
    from tests.test_evaluate_cli import evaluate_on_two_workers

    resolved, model_dir = tiny_run
    copy = runs.copy_with_temperature(model_dir, tmp_path / "run", 0.5, step=4)
    records = []
    for status, output, errors in evaluate_on_two_workers(
        copy, "--batch_size=8", "--tta=flip", f"--report_dir={tmp_path / 'reports'}"
    ):
        assert status == 0, errors[-3000:]
        records.append(json.loads(output))
    assert records[0] == records[1]
    model, images, logits, labels = restored_logits(resolved, model_dir, "ckpt-4")
    flipped = model(np.ascontiguousarray(mirror(images)), training=False).numpy()
    expected = (softmax(logits) + softmax(flipped)) / 2
    scaled = (softmax(logits / 0.5) + softmax(flipped / 0.5)) / 2
    record = records[0]
    assert record["num_examples"] == EVAL_EXAMPLES and record["tta"] == "flip"
    assert record["ece"] == pytest.approx(
        calibration.expected_calibration_error(expected, labels), abs=1e-6
    )
    assert record["nll"] == pytest.approx(mean_nll(expected, labels), rel=1e-5)
    assert record["ece_scaled"] == pytest.approx(
        calibration.expected_calibration_error(scaled, labels), abs=1e-6
    )
    assert record["nll_scaled"] == pytest.approx(mean_nll(scaled, labels), rel=1e-5)
    bins = calibration.reliability(expected, labels)
    assert [row["count"] for row in read_report(record)["reliability"]] == bins["count"]
