"""`scripts/benchmark.py race`: reading a run's way to the target (against sums worked
out by hand), what Keras `fit` reproduces of a recipe and the images it reads (IDX files
written here, against their own bytes), and the race end to end."""

import json
import os
import sys

import numpy as np
import pytest

from resnet_app import config
from tests import own_data
from tests.commands import REPO, error_line, run_command

sys.path.insert(0, os.path.join(REPO, "scripts"))

import keras_baseline  # noqa: E402
import race  # noqa: E402
import timing  # noqa: E402

LAUNCHED = 1000.0


def events(input_wait=None):
    """Launched at 1000, the loop starts at 1010; 100 steps take 20 s the first time
    (10 s of them compiling) and 10 s after; each evaluation takes 2 s."""
    marks = [(100, 1030.0), (200, 1042.0), (300, 1054.0)]
    evals = [(100, 0.50, 1032.0), (200, 0.90, 1044.0), (300, 0.95, 1056.0)]
    records = [{"step": 0, "event": "start", "time": 1010.0}]
    for (step, time), (_, top1, end) in zip(marks, evals):
        mark = {"step": step, "time": time}
        if input_wait is not None:
            mark["input_wait"] = input_wait
        records += [mark, {"step": step, "top1": top1, "time": end, "seconds": 2.0}]
    return records


def test_the_crossing_and_where_the_time_went():
    found = race.time_to_target(events(), LAUNCHED, 0.85, batch=32, examples=6400)
    assert found["seconds"] == 44.0  # The end of the evaluation at step 200.
    assert found["without_evals"] == 40.0  # Less the two evaluations up to it.
    assert (found["step"], found["images"], found["epochs"]) == (200, 6400, 1.0)
    assert found["startup"] == 10.0
    assert found["compile"] == pytest.approx(10.0)  # 20 s for 100 steps at 0.1 s a step.
    assert found["evaluation"] == 4.0
    assert found["input"] is None  # Keras fit's events say nothing of its input.
    assert found["steps"] == pytest.approx(20.0)  # 44 - 10 - 10 - 4.
    assert (found["final_top1"], found["best_top1"], found["total"]) == (0.95, 0.95, 56.0)


def test_the_trainers_input_wait_is_its_share_of_each_interval():
    found = race.time_to_target(events(input_wait=0.1), LAUNCHED, 0.85, 32, 6400)
    # Up to step 200: 0.1 of the first interval's 20 s and of the second's 10 s.
    assert found["input"] == pytest.approx(3.0)
    assert found["steps"] == pytest.approx(17.0)


def test_a_missed_target_reports_the_best_and_no_time():
    found = race.time_to_target(events(), LAUNCHED, 0.99, 32, 6400)
    assert found["seconds"] is None and found["step"] is None and found["epochs"] is None
    assert found["best_top1"] == 0.95
    assert found["evaluation"] == 6.0  # All three, up to the end.
    faster = race.time_to_target(events(), LAUNCHED - 22.0, 0.85, 32, 6400)
    assert race.speedup([faster], [found]) is None


def test_the_speedup_is_a_ratio_of_medians():
    def at(launched):
        return race.time_to_target(events(), launched, 0.85, 32, 6400)

    ours = [at(LAUNCHED), at(LAUNCHED + 4), at(LAUNCHED - 100)]  # 44, 40 and 144 s.
    theirs = [at(LAUNCHED - 44), at(LAUNCHED - 56)]  # 88 and 100 s.
    assert race.speedup(ours, theirs) == pytest.approx(94 / 44)
    assert race.speedup(ours, theirs, "without_evals") == pytest.approx(90 / 40)


def test_fit_reproduces_the_quickstart_and_names_what_it_cannot():
    assert keras_baseline.unmirrored(config.resolve("configs/shapes_quickstart.yaml")) == []
    cutout = config.resolve(
        "configs/shapes_quickstart.yaml",
        sets=["data.augment.cutout_size=8", "train.label_smoothing=0.1"],
    )
    assert keras_baseline.unmirrored(cutout) == []
    other = config.resolve(
        "configs/shapes_quickstart.yaml",
        sets=[
            "train.ema_decay=0.99",
            "data.augment.randaugment_ops=2",
            "data.progressive.sizes=[16,24]",
            "data.progressive.epochs=[0,0.5]",
        ],
    )
    missing = keras_baseline.unmirrored(other)
    assert "train.ema_decay" in missing
    assert "data.augment.randaugment_ops" in missing
    assert any(key.startswith("data.progressive") for key in missing)
    # Page's ResNet-9 recipe: all of it mirrored (cifar10 is held in memory).
    assert keras_baseline.unmirrored(config.resolve("configs/cifar10_resnet9_fast.yaml")) == []


def test_bad_flags_are_one_line_errors():
    def error(*args):
        return error_line(run_command("scripts/benchmark.py", "race", *args))

    assert "--targets=97: '97' is not a top-1 in (0, 1)" in error("--targets=97")
    assert "--targets=0.9,1.5: '1.5' is not a top-1 in (0, 1)" in error("--targets=0.9,1.5")
    assert "--runs: unknown keras" in error("--runs=fit,keras")
    assert "--evals=1: use 2 or more" in error("--evals=1")
    line = error("--config=configs/cifar10_resnet18_modern.yaml", "--runs=fit,trainer")
    assert "the fit run does not reproduce" in line and "--runs=trainer,fast" in line


@pytest.mark.slow  # the benchmark script end to end
def test_the_script_times_fit_and_the_trainer_to_a_target(tmp_path):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(
        "model: {name: tiny}\n"
        "data: {image_size: 16, train_examples: 512, eval_examples: 200,"
        " augment: {crop_padding: 2, cutout_size: 4}}\n"
        "schedule: {name: cosine, warmup_epochs: 0.5}\n"
        "train: {batch_size: 32, epochs: 2.1}\n"
    )
    result = run_command(
        "scripts/benchmark.py",
        "race",
        f"--config={recipe}",
        f"--fast_config={recipe}",
        "--runs=fit,trainer",
        "--evals=3",
        "--targets=0.01",
        f"--work_dir={tmp_path / 'runs'}",
        "--json",
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    # 2.1 epochs of 512 at batch 32: 34 steps, rounded down to 33 for 3 evaluations.
    assert report["recipes"]["fit"]["steps"] == 33 and report["recipes"]["fit"]["eval_every"] == 11
    assert report["targets"] == [0.01]
    for run in ("fit", "trainer"):
        (found,) = report["runs"][run]["0.01"]
        assert report["medians"][run]["0.01"]["seconds"] == found["seconds"]
        assert found["step"] == 11 and found["images"] == 352  # The first evaluation.
        assert 0 < found["startup"] < found["seconds"] <= found["total"]
    fit_events = timing.read_records(tmp_path / "runs" / "fit_0" / "fit_events.jsonl")
    assert [e["step"] for e in fit_events if "top1" in e] == [11, 22, 33]
    trainer = timing.read_records(tmp_path / "runs" / "trainer_0" / "metrics.jsonl")
    assert [(e["step"], e["num_examples"]) for e in trainer if "top1" in e] == [
        (11, 200),
        (22, 200),
        (33, 200),
    ]
    (row,) = report["rows"]
    assert row["row"].startswith("1: trainer / fit") and row["ratio"] > 0


@pytest.mark.slow  # the benchmark script end to end
def test_fit_reads_the_trainers_images_prepared_alike():
    import numpy as np

    from resnet_app.data import input_pipeline
    from resnet_app.nets.presets import get_config

    resolved = config.resolve(
        "configs/shapes_quickstart.yaml",
        sets=["data.train_examples=96", "data.eval_examples=40", "train.seed=3"],
    )
    pipeline = input_pipeline.create_pipeline(
        resolved.data, default_image_size=get_config(resolved.model_name).default_image_size
    )
    train, test = keras_baseline.fit_datasets(resolved, pipeline)
    # The test split in order, resized to 24 px and normalized as the trainer evaluates it.
    images, labels = (np.concatenate(t) for t in zip(*[(x.numpy(), y.numpy()) for x, y in test]))
    theirs, their_labels = trainer_evaluation(pipeline, 16)
    assert images.shape == theirs.shape == (40, 24, 24, 3)
    np.testing.assert_allclose(images, theirs, rtol=0, atol=1e-5)
    assert labels.tolist() == their_labels.tolist()
    # An epoch of training images (no augmentation in this recipe): the trainer's, reordered.
    seen = np.concatenate([x.numpy() for x, _ in train.take(3)])  # 3 batches of 32.
    trainer = np.concatenate([b["image"].numpy() for b in pipeline.train_dataset(32).take(3)])

    def order(batch):  # By the values to 3 decimals: the same images sort alike.
        return batch[np.lexsort(np.round(batch.reshape(len(batch), -1), 3).T[::-1])]

    np.testing.assert_allclose(order(seen), order(trainer), rtol=0, atol=1e-5)


def test_the_report_gives_each_target_its_medians_and_rows():
    targets = [0.85, 0.99]
    starts = {"fit": LAUNCHED - 44, "trainer": LAUNCHED}  # 88 and 44 s to 85%.
    timings = {
        run: {race.key(t): [race.time_to_target(events(), start, t, 32, 6400)] for t in targets}
        for run, start in starts.items()
    }
    report = {
        "cpu": "a CPU",
        "dataset": "idx:/data/fashion",
        "targets": targets,
        "evals": 3,
        "seeds": ["0"],
        "recipes": {run: {"path": "r.yaml"} for run in starts},
        "runs": timings,
        "medians": {r: {k: race.medians(ts) for k, ts in by.items()} for r, by in timings.items()},
        "rows": race.rows(timings, targets, native_bf16=False),
    }
    text = race.text(report)
    assert report["medians"]["fit"]["0.85"] == {
        "seconds": 88.0,
        "without_evals": 84.0,
        "missed": 0,
    }
    assert report["medians"]["trainer"]["0.99"]["missed"] == 1
    assert report["medians"]["trainer"]["0.99"]["seconds"] is None
    reached, missed = report["rows"]
    assert (reached["accuracy"], reached["ratio"], reached["met"]) == (0.85, 2.0, True)
    assert (missed["accuracy"], missed["ratio"], missed["met"]) == (0.99, None, None)
    assert "row 1: trainer / fit, the same recipe, top-1 >= 99.0%: a run missed" in text
    assert "85.0%: fit 88.0 (84.0 w/o evals), trainer 44.0 (40.0 w/o evals)" in text
    assert "99.0%: fit missed it (1 of 1), trainer missed it (1 of 1)" in text
    assert "dataset: idx:/data/fashion" in text


IDX_SIZE = 12


def idx_recipe(directory, *sets):
    """Random greyscale IDX files (40 training images, 16 test, 4 classes) and a recipe on them."""
    generator = np.random.default_rng(7)
    arrays = {}
    for split, count in (("train", 40), ("test", 16)):
        shape = (count, IDX_SIZE, IDX_SIZE)
        arrays[(split, "images")] = generator.integers(0, 256, shape, dtype=np.uint8)
        arrays[(split, "labels")] = generator.integers(0, 4, count).astype(np.uint8)
    own_data.write_idx(str(directory), arrays)
    sets = [f"data.dataset=idx:{directory}", "data.num_classes=4", "model.name=tiny", *sets]
    return arrays, config.resolve(sets=sets)


def pipeline_of(resolved):
    from resnet_app.data import input_pipeline
    from resnet_app.nets.presets import get_config

    return input_pipeline.create_pipeline(
        resolved.data, default_image_size=get_config(resolved.model_name).default_image_size
    )


def normalized(pixels, pipeline):
    """The NumPy reference: uint8 pixels less the pipeline's mean, over its std."""
    mean = np.asarray(pipeline.preprocessing.mean, np.float32)
    std = np.asarray(pipeline.preprocessing.std, np.float32)
    return (pixels.astype(np.float32) - mean) / std


def trainer_evaluation(pipeline, batch_size):
    """The trainer's evaluation (images, labels), padding dropped, in its order."""
    batches = list(pipeline.eval_dataset(batch_size))
    real = np.concatenate([b["mask"].numpy() for b in batches]) > 0
    images = np.concatenate([b["image"].numpy() for b in batches])[real]
    return images, np.concatenate([b["label"].numpy() for b in batches])[real]


def read_all(dataset):
    """Every (image, label) of a finite dataset, as two arrays."""
    images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in dataset])
    return np.concatenate(images), np.concatenate(labels)


def test_fit_reads_idx_files_as_the_trainer_holds_them(tmp_path):
    arrays, resolved = idx_recipe(tmp_path / "idx")
    pipeline = pipeline_of(resolved)
    assert pipeline.channels == 1 and pipeline.preprocessing.image_size == IDX_SIZE
    train, evaluation = keras_baseline.fit_datasets(resolved, pipeline)
    images, labels = read_all(evaluation)
    assert images.shape == (16, IDX_SIZE, IDX_SIZE, 1)  # One channel: greyscale.
    raw = arrays[("test", "images")][..., None]
    np.testing.assert_allclose(images, normalized(raw, pipeline), rtol=0, atol=1e-5)
    assert labels.tolist() == arrays[("test", "labels")].tolist()
    # The trainer evaluates the same images.
    theirs, _ = trainer_evaluation(pipeline, 16)
    np.testing.assert_allclose(images, theirs, rtol=0, atol=1e-5)
    # Training: every training image, padded and cropped with one channel.
    held, _ = keras_baseline.split_arrays(pipeline.train_split, pipeline)
    np.testing.assert_array_equal(held[..., 0], arrays[("train", "images")])
    batch, _ = next(iter(train))
    assert batch.shape == (resolved.train.batch_size, IDX_SIZE, IDX_SIZE, 1)

    # Held out: fit evaluates the holdout, and trains on the rest only.
    _, resolved = idx_recipe(tmp_path / "idx", "data.validation_split=10")
    pipeline = pipeline_of(resolved)
    holdout = pipeline.eval_split()
    assert (holdout.name, holdout.num_examples) == ("holdout", 10)
    images, labels = read_all(keras_baseline.fit_datasets(resolved, pipeline)[1])
    np.testing.assert_allclose(images, normalized(holdout.images, pipeline), rtol=0, atol=1e-5)
    assert labels.tolist() == holdout.labels.tolist()
    held, _ = keras_baseline.split_arrays(pipeline.train_split, pipeline)
    trained = {image.tobytes() for image in held}
    assert len(held) == 30 and not trained & {image.tobytes() for image in holdout.images}
    everything = {image.tobytes() for image in arrays[("train", "images")][..., None]}
    assert trained | {image.tobytes() for image in holdout.images} == everything

    # Asked for RGB: the grey value in all three channels, as the trainer converts it.
    _, resolved = idx_recipe(tmp_path / "idx", "data.channels=3")
    pipeline = pipeline_of(resolved)
    images, _ = read_all(keras_baseline.fit_datasets(resolved, pipeline)[1])
    rgb = np.repeat(arrays[("test", "images")][..., None], 3, axis=-1)
    np.testing.assert_allclose(images, normalized(rgb, pipeline), rtol=0, atol=1e-5)


def test_fit_mirrors_an_idx_recipe_and_names_what_it_cannot(tmp_path):
    _, resolved = idx_recipe(
        tmp_path / "idx",
        "data.validation_split=8",
        "data.channels=1",
        "data.augment.crop_padding=2",
        "optimizer.nesterov=true",
        "schedule.name=cosine",
        "train.precision=auto",
        "train.label_smoothing=0.1",
    )
    assert keras_baseline.unmirrored(resolved) == []
    assert keras_baseline.unmirrored(resolved, pipeline_of(resolved)) == []
    # Past 64 px "auto" picks the ImageNet recipe, which only the loaded data tells.
    _, large = idx_recipe(tmp_path / "idx", "data.image_size=72")
    assert keras_baseline.unmirrored(large) == []
    (found,) = keras_baseline.unmirrored(large, pipeline_of(large))
    assert found.startswith("data.preprocessing=imagenet (chosen for 72 px")
    _, other = idx_recipe(
        tmp_path / "idx",
        "train.ema_decay=0.99",
        "data.sampling=balanced",
        "data.preprocessing=imagenet",
        "train.precision=fp16",
    )
    missing = keras_baseline.unmirrored(other)
    assert {"train.ema_decay", "data.sampling", "train.precision=fp16"} <= set(missing)
    assert "data.preprocessing=imagenet (fit does the CIFAR recipe)" in missing
    streamed = keras_baseline.unmirrored(config.resolve("configs/own_tfrecord_imagenet.yaml"))
    assert "data.dataset=tfrecord:/data/imagenet (streamed: fit holds the images in memory)" in (
        streamed
    )
    synthetic = keras_baseline.unmirrored(config.resolve(sets=["data.dataset=synthetic"]))
    assert synthetic == ["data.dataset=synthetic (fit reads a dataset's images)"]


def test_fit_computes_in_the_trainers_precision():
    from types import SimpleNamespace

    from resnet_app.common import auto_precision, precision

    chosen = auto_precision.auto_choice().precision
    recipe = config.resolve("configs/cifar10_resnet9_fast.yaml")  # train.precision: auto
    assert recipe.train.precision == chosen  # What the trainer computes in here.
    assert keras_baseline.fit_precision(recipe) == chosen and chosen in precision.PRECISIONS
    unresolved = SimpleNamespace(train=SimpleNamespace(precision="auto"))
    assert keras_baseline.fit_precision(unresolved) == chosen
    bf16 = config.resolve(sets=["train.precision=bf16"])
    assert keras_baseline.fit_precision(bf16) == "bf16"


def test_fit_decodes_a_table_of_files_once_as_the_trainer_does(tmp_path):
    # PNGs of two sizes, one of them greyscale: decoded to RGB and resized to 16 px.
    generator = np.random.default_rng(3)
    rows = []
    for split, count in (("train", 12), ("test", 6)):
        images = [
            generator.integers(0, 256, (20 if i % 3 else 16, 16 if i % 3 else 20, 3), np.uint8)
            for i in range(count)
        ]
        images[1] = images[1][..., :1]
        names = own_data.write_pngs(str(tmp_path / split), images, prefix=split)
        rows += [(f"{split}/{name}", f"c{i % 3}", split) for i, name in enumerate(names)]
    own_data.write_table(tmp_path / "labels.csv", rows)
    table = f"data.dataset=csv:{tmp_path / 'labels.csv'}"
    resolved = config.resolve(sets=[table, "data.image_size=16", "model.name=tiny"])
    pipeline = pipeline_of(resolved)
    assert pipeline.channels == 3 and pipeline.train_split.encoded
    assert keras_baseline.unmirrored(resolved, pipeline) == []
    images, labels = read_all(keras_baseline.fit_datasets(resolved, pipeline)[1])
    theirs, their_labels = trainer_evaluation(pipeline, 4)
    assert images.shape == theirs.shape == (6, 16, 16, 3)
    np.testing.assert_allclose(images, theirs, rtol=0, atol=1e-5)
    assert labels.tolist() == their_labels.tolist()


def test_fit_reads_class_folders_as_a_keras_user_does(tmp_path):
    """`--fit_input=folder`: Keras's `image_dataset_from_directory` (greyscale PNGs at the
    training size, so its resize leaves them) gives the trainer's evaluation images."""
    generator = np.random.default_rng(5)
    for split, count in (("train", 9), ("test", 7)):
        for label in ("coat", "dress", "shirt"):
            images = list(generator.integers(0, 256, (count, 16, 16, 1), np.uint8))
            own_data.write_pngs(str(tmp_path / split / label), images, prefix=f"{split}{label}")
    sets = [f"data.dataset=folder:{tmp_path}", "data.image_size=16", "model.name=tiny"]
    resolved = config.resolve(sets=sets)
    pipeline = pipeline_of(resolved)
    assert pipeline.channels == 1
    images, labels = read_all(keras_baseline.fit_datasets(resolved, pipeline, True)[1])
    theirs, their_labels = trainer_evaluation(pipeline, 4)
    assert images.shape == theirs.shape == (21, 16, 16, 1)

    def order(found, classes):  # By label, then pixels: both read a class folder by name.
        keys = np.round(found.reshape(len(found), -1), 3).T[::-1]
        return np.lexsort([*keys, classes])

    ours, keras_order = order(theirs, their_labels), order(images, labels)
    np.testing.assert_allclose(images[keras_order], theirs[ours], rtol=0, atol=1e-5)
    assert labels[keras_order].tolist() == their_labels[ours].tolist()
    train = next(iter(keras_baseline.fit_datasets(resolved, pipeline, True)[0]))
    assert train[0].shape == (resolved.train.batch_size, 16, 16, 1)
