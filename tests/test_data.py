"""Input pipelines: sources, order, resumption, sharding, validation split, errors."""

import json
import logging
import os
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.data import image_choices, input_pipeline, run_pipeline, seeds, sources
from resnet_app.data.settings import data_config
from resnet_app.data.sources import image_files as file_reading
from tests import image_files, runs
from tests.tfds_mock import closed_port, mock_tfds


def shapes_config(**overrides):
    fields = dict(dataset="shapes", train_examples=300, eval_examples=100)
    fields.update(overrides)
    return data_config(**fields)


# Each module generates its own `shapes` cache (see conftest.private_shapes_cache).
pytestmark = pytest.mark.usefixtures("private_shapes_cache")


@pytest.fixture(scope="module")
def shapes_pipeline():
    return input_pipeline.create_pipeline(shapes_config())


def take_examples(dataset, count):
    """The first `count` examples of a batched dataset, as NumPy arrays."""
    parts = {"image": [], "label": [], "id": []}
    total = 0
    for batch in dataset:
        for key in parts:
            parts[key].append(batch[key].numpy())
        total += len(batch["id"])
        if total >= count:
            break
    return {key: np.concatenate(value)[:count] for key, value in parts.items()}


# -- order, determinism, resumption ------------------------------------------


def test_an_epoch_visits_every_example_once(shapes_pipeline):
    examples = take_examples(shapes_pipeline.train_dataset(50), 600)
    first, second = examples["id"][:300], examples["id"][300:]
    assert sorted(first) == list(range(300)) and sorted(second) == list(range(300))
    assert not np.array_equal(first, second)  # Each epoch has its own order.
    np.testing.assert_array_equal(first, shapes_pipeline.epoch_order(0))
    np.testing.assert_array_equal(second, shapes_pipeline.epoch_order(1))


def test_labels_follow_the_ids(shapes_pipeline):
    examples = take_examples(shapes_pipeline.train_dataset(50), 300)
    np.testing.assert_array_equal(
        examples["label"], shapes_pipeline.train_split.labels[examples["id"]]
    )


def test_training_images_are_the_per_example_recipe(shapes_pipeline):
    # The pipeline augments whole batches; each image must still be exactly
    # cifar_train(image, seed) with its own seed (seed, epoch * N + id).
    from resnet_app.data import preprocessing

    examples = take_examples(shapes_pipeline.train_dataset(25), 350)
    size = shapes_pipeline.num_train_examples
    for position in (0, 7, 299, 300, 349):
        epoch, example_id = position // size, examples["id"][position]
        seed = seeds.example_seed(0, epoch, example_id)
        image = tf.constant(shapes_pipeline.train_split.images[example_id])
        expected = preprocessing.cifar_train(image, seed, shapes_pipeline.preprocessing)
        np.testing.assert_array_equal(examples["image"][position], expected.numpy())


def test_same_seed_same_stream_other_seed_other_stream():
    one = take_examples(input_pipeline.create_pipeline(shapes_config()).train_dataset(32), 64)
    two = take_examples(input_pipeline.create_pipeline(shapes_config()).train_dataset(32), 64)
    np.testing.assert_array_equal(one["image"], two["image"])
    np.testing.assert_array_equal(one["id"], two["id"])
    other = take_examples(
        input_pipeline.create_pipeline(shapes_config(seed=1)).train_dataset(32), 64
    )
    assert not np.array_equal(one["id"], other["id"])


def test_an_example_is_augmented_anew_every_epoch():
    """Its crop and flip are drawn from (seed, epoch, id): the same example in
    two epochs almost never gets the same view (1 in 162 by chance, from 9 x 9
    crops and 2 flips), and each epoch has its own seed."""
    assert (
        seeds.example_seed(0, 0, 5).numpy().tolist() != seeds.example_seed(0, 1, 5).numpy().tolist()
    )
    pipeline = input_pipeline.create_pipeline(shapes_config(train_examples=64))
    stream = take_examples(pipeline.train_dataset(16), 128)  # Epochs 0 and 1.
    views = [{}, {}]
    for index, (example_id, image) in enumerate(zip(stream["id"], stream["image"])):
        views[index // 64][int(example_id)] = image
    assert sorted(views[0]) == sorted(views[1]) == list(range(64))
    same = sum(np.array_equal(views[0][i], views[1][i]) for i in range(64))
    assert same <= 4, f"{same} of 64 examples got the same view in both epochs"


@pytest.mark.parametrize("start", [40, 280])  # mid-epoch, and across the epoch boundary
def test_entering_the_stream_anywhere_gives_the_same_examples(shapes_pipeline, start):
    reference = take_examples(shapes_pipeline.train_dataset(20), start + 60)
    entered = take_examples(shapes_pipeline.train_dataset(20, start_example=start), 60)
    np.testing.assert_array_equal(entered["id"], reference["id"][start:])
    # Bitwise: the augmentation is a function of (seed, epoch, id), not of history.
    np.testing.assert_array_equal(entered["image"], reference["image"][start:])


def test_shards_make_up_the_global_batch(shapes_pipeline):
    whole = take_examples(shapes_pipeline.train_dataset(24), 96)
    shards = [
        take_examples(shapes_pipeline.train_dataset(24, num_shards=3, shard_index=i), 32)
        for i in range(3)
    ]
    for step in range(4):
        expected = whole["id"][24 * step : 24 * (step + 1)]
        got = np.concatenate([shard["id"][8 * step : 8 * (step + 1)] for shard in shards])
        assert sorted(got) == sorted(expected)


def test_global_batch_must_divide_among_shards(shapes_pipeline):
    with pytest.raises(ConfigError, match="not divisible"):
        shapes_pipeline.train_dataset(10, num_shards=3)


def test_batch_structure_and_dtype():
    pipeline = input_pipeline.create_pipeline(shapes_config(dtype="bfloat16"))
    batch = next(iter(pipeline.train_dataset(16)))
    assert batch["image"].shape == (16, 32, 32, 3) and batch["image"].dtype == tf.bfloat16
    assert batch["label"].dtype == tf.int32 and batch["id"].dtype == tf.int64
    np.testing.assert_array_equal(batch["mask"].numpy(), np.ones(16))


def test_normalization_statistics_are_measured_on_the_training_split(shapes_pipeline):
    images = shapes_pipeline.train_split.images.astype(np.float64)
    np.testing.assert_allclose(
        shapes_pipeline.preprocessing.mean, images.mean(axis=(0, 1, 2)), rtol=1e-9
    )
    np.testing.assert_allclose(
        shapes_pipeline.preprocessing.std, images.std(axis=(0, 1, 2)), rtol=1e-9
    )
    assert shapes_pipeline.preprocessing.family == "cifar"


# -- evaluation padding ----------------------------------------------------------


@pytest.mark.parametrize("mixing", [{}, {"mixup_alpha": 0.2}])
def test_pipelines_run_without_the_autotuning_model(mixing):
    # Its thread kept a finished run waiting up to a minute (data/options.py).
    pipeline = input_pipeline.create_pipeline(shapes_config(**mixing))
    for dataset in (pipeline.train_dataset(8), pipeline.eval_dataset(8)):
        assert dataset.options().autotune.enabled is False
        assert dataset.options().deterministic is True


@pytest.mark.parametrize("shards,multiple", [(1, 1), (1, 3), (2, 2)])
def test_eval_dataset_visits_each_example_once_in_full_batches(shapes_pipeline, shards, multiple):
    seen, batches = [], []
    for index in range(shards):
        dataset = shapes_pipeline.eval_dataset(
            16, num_shards=shards, shard_index=index, batches_multiple_of=multiple
        )
        count = 0
        for batch in dataset:
            assert batch["image"].shape[0] == 16
            real = batch["mask"].numpy() > 0
            seen.extend(batch["id"].numpy()[real])
            assert (batch["id"].numpy()[~real] == -1).all()
            count += 1
        assert count % multiple == 0
        batches.append(count)
    assert sorted(seen) == list(range(100))
    assert len(set(batches)) == 1  # Every pipeline steps the same number of times.


def test_eval_images_are_the_normalized_test_images(shapes_pipeline):
    batch = next(iter(shapes_pipeline.eval_dataset(10)))
    split = shapes_pipeline.eval_split()
    config = shapes_pipeline.preprocessing
    expected = (split.images[:10] - np.array(config.mean)) / np.array(config.std)
    np.testing.assert_allclose(batch["image"].numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(batch["label"].numpy(), split.labels[:10])


# -- validation split ---------------------------------------------------------------


def test_validation_split_holds_out_training_examples():
    full = input_pipeline.create_pipeline(shapes_config())
    held = input_pipeline.create_pipeline(shapes_config(validation_split=50))
    assert held.eval_split_name == "holdout"
    assert held.num_train_examples == 250 and held.num_eval_examples() == 50
    train, holdout = held.train_split, held.eval_split()
    # Disjoint, and together exactly the original training set.
    together = {image.tobytes() for image in np.concatenate([train.images, holdout.images])}
    assert len(together) == 300
    assert together == {image.tobytes() for image in full.train_split.images}
    # Model selection never sees the test set, which stays available.
    assert held.num_eval_examples("test") == 100
    # The held-out examples do not depend on the training seed.
    other = input_pipeline.create_pipeline(shapes_config(validation_split=50, seed=9))
    np.testing.assert_array_equal(other.eval_split().images, holdout.images)
    # Normalization statistics come from the remaining training examples only.
    np.testing.assert_allclose(
        held.preprocessing.mean, train.images.astype(np.float64).mean(axis=(0, 1, 2))
    )


def test_validation_split_larger_than_the_training_set_is_an_error():
    with pytest.raises(ConfigError, match="leaves no training examples"):
        input_pipeline.create_pipeline(shapes_config(validation_split=300))


# -- synthetic -----------------------------------------------------------------


def test_synthetic_is_any_shape_and_counts_exactly():
    pipeline = input_pipeline.create_pipeline(
        data_config(dataset="synthetic", image_size=48, num_classes=7, eval_examples=50)
    )
    batch = next(iter(pipeline.train_dataset(8)))
    assert batch["image"].shape == (8, 48, 48, 3)
    assert batch["label"].numpy().min() >= 0 and batch["label"].numpy().max() < 7
    masks = [b["mask"].numpy() for b in pipeline.eval_dataset(16)]
    assert sum(m.sum() for m in masks) == 50 and len(masks) == 4
    # Two workers: every example id exactly once overall.
    assert runs.evaluated_ids(pipeline, 8, num_shards=2) == list(range(50))


# -- image folders ---------------------------------------------------------------


def write(path, payload):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as file:
        file.write(payload)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("images"))
    originals = {}

    def add(path, image, encoder):
        payload = encoder(image)
        write(os.path.join(root, path), payload)
        originals[path] = image
        return payload

    png = lambda image: tf.io.encode_png(image).numpy()  # noqa: E731
    jpeg = lambda image: tf.io.encode_jpeg(image, quality=90).numpy()  # noqa: E731
    for i in range(3):
        add(f"train/dog/dog{i}.png", image_files.few_colour_image(32, 32, i), png)
        add(f"val/dog/dog{i}.png", image_files.few_colour_image(32, 32, 10 + i), png)
    add("val/cat/cat0.png", image_files.few_colour_image(32, 32, 20), png)
    add("train/cat/a.jpg", image_files.few_colour_image(32, 32, 30), jpeg)
    add("train/cat/b.png", image_files.few_colour_image(32, 32, 31), png)
    add("train/cat/c.bmp", image_files.few_colour_image(32, 32, 32), image_files.encode_bmp)
    add("train/cat/d.gif", image_files.few_colour_image(32, 32, 33), image_files.encode_gif)
    add("train/cat/png_named.jpg", image_files.few_colour_image(32, 32, 34), png)
    # Unreadable: random bytes, a truncated JPEG, an empty file. Hidden: ignored.
    write(os.path.join(root, "train/cat/garbage.jpg"), os.urandom(500))
    truncated = jpeg(image_files.few_colour_image(32, 32, 35))
    write(os.path.join(root, "train/cat/truncated.jpg"), truncated[: len(truncated) // 2])
    write(os.path.join(root, "train/dog/empty.png"), b"")
    write(os.path.join(root, "train/cat/.DS_Store"), b"\0\0")
    # An empty class directory still counts as a class; a stray file at the top does not.
    os.makedirs(os.path.join(root, "train/zebra"))
    write(os.path.join(root, "train/README.txt"), b"not a class")
    return root, originals


@pytest.mark.parametrize("disk", ["local", "slow"])
def test_folder_lists_classes_and_skips_unreadable_files(folder, caplog, monkeypatch, disk):
    root, _ = folder
    if disk == "slow":  # Every file "slow": all but the first 3 read on threads, 3 at a time.
        monkeypatch.setattr(file_reading, "PROBE", 3)
        monkeypatch.setattr(file_reading, "SLOW_SECONDS", -1.0)
    with caplog.at_level(logging.WARNING):
        source = sources.load_folder(root)
    assert source.class_names == ["cat", "dog", "zebra"]
    assert set(source.splits) == {"train", "val"}
    train = source.splits["train"]
    names = sorted(os.path.basename(path) for path in train.files)
    assert names == sorted(
        ["a.jpg", "b.png", "c.bmp", "d.gif", "png_named.jpg", "dog0.png", "dog1.png", "dog2.png"]
    )
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 3 of 15 files" in warnings[0]
    for path, held, label in zip(train.files, train.contents, train.labels, strict=True):
        assert held == pathlib.Path(path).read_bytes()
        assert source.class_names[label] == os.path.basename(os.path.dirname(path))


def test_folder_images_decode_to_their_pixels_whatever_the_extension(folder):
    root, originals = folder
    pipeline = input_pipeline.create_pipeline(
        data_config(dataset=f"folder:{root}", image_size=32, mean=(0, 0, 0), std=(1, 1, 1))
    )
    assert pipeline.preprocessing.family == "cifar"
    split = pipeline.eval_split("train")
    batch = next(iter(pipeline.eval_dataset(16, split="train")))
    real = batch["mask"].numpy() > 0
    assert real.sum() == split.num_examples == 8
    for example_id, image in zip(batch["id"].numpy()[real], batch["image"].numpy()[real]):
        relative = os.path.relpath(split.files[example_id], root)
        expected = originals[relative]
        if relative.endswith("a.jpg"):  # Lossy: compare with TF's own JPEG decoding.
            with open(split.files[example_id], "rb") as file:
                expected = tf.io.decode_jpeg(file.read(), channels=3).numpy()
        np.testing.assert_array_equal(image, expected.astype(np.float32), err_msg=relative)


def test_folder_training_stream_at_imagenet_size(folder):
    root, _ = folder
    pipeline = input_pipeline.create_pipeline(data_config(dataset=f"folder:{root}", image_size=96))
    assert pipeline.preprocessing.family == "imagenet"
    examples = take_examples(pipeline.train_dataset(4), 16)
    assert examples["image"].shape == (16, 96, 96, 3)
    assert sorted(examples["id"][:8]) == list(range(8))


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda root: os.path.join(root, "missing"), "is not a directory"),
        (lambda root: os.path.join(root, "train", "cat"), "no train/"),
    ],
)
def test_folder_errors(folder, make, message):
    with pytest.raises(ConfigError, match=message):
        input_pipeline.create_pipeline(data_config(dataset=f"folder:{make(folder[0])}"))


def test_folder_with_a_class_unknown_to_train(tmp_path):
    png = tf.io.encode_png(image_files.few_colour_image(8, 8, 0)).numpy()
    write(str(tmp_path / "train/a/x.png"), png)
    write(str(tmp_path / "val/b/y.png"), png)
    with pytest.raises(ConfigError, match="a class that train/ does not have"):
        sources.load_folder(str(tmp_path))


def test_folder_reads_the_subfolders_of_a_class_in_sorted_order(tmp_path):
    png = tf.io.encode_png(image_files.few_colour_image(8, 8, 0)).numpy()
    for path in [
        "train/cat/b.png",
        "train/cat/a.png",
        "train/cat/2019/d.png",
        "train/cat/2019/c.png",
        "train/cat/2019/06/e.png",
        "train/cat/2018/f.png",
        "train/cat/.thumbnails/g.png",  # Hidden: ignored, as hidden files are.
        "train/dog/h.png",
        "val/cat/2019/i.png",
    ]:
        write(str(tmp_path / path), png)
    # A link back up the tree is followed once, not forever.
    os.symlink("..", tmp_path / "train/cat/2019/up")
    source = sources.load_folder(str(tmp_path))
    train = source.splits["train"]
    relative = [os.path.relpath(path, tmp_path) for path in train.files]
    assert relative == [
        "train/cat/a.png",
        "train/cat/b.png",
        "train/cat/2018/f.png",
        "train/cat/2019/c.png",
        "train/cat/2019/d.png",
        "train/cat/2019/06/e.png",
        "train/dog/h.png",
    ]
    assert train.labels.tolist() == [0] * 6 + [1]
    assert [os.path.relpath(p, tmp_path) for p in source.splits["val"].files] == [
        "val/cat/2019/i.png"
    ]


# -- tfds ------------------------------------------------------------------------


def test_tfds_cifar10_through_mock_data_is_held_in_memory(tmp_path):
    with mock_tfds("cifar10", str(tmp_path), ("train", "test"), 40):
        pipeline = input_pipeline.create_pipeline(
            data_config(dataset="cifar10", data_dir=str(tmp_path))
        )
        assert pipeline.train_split.indexed and not pipeline.train_split.encoded
        assert pipeline.num_train_examples == 40 and pipeline.num_classes == 10
        assert pipeline.eval_split_name == "test"
        examples = take_examples(pipeline.train_dataset(20), 40)
        assert examples["image"].shape == (40, 32, 32, 3)
        assert sorted(examples["id"]) == list(range(40))
        np.testing.assert_array_equal(
            examples["label"], pipeline.train_split.labels[examples["id"]]
        )


def test_tfds_imagenet2012_through_mock_data_is_streamed(tmp_path):
    with mock_tfds("imagenet2012", str(tmp_path), ("train", "validation"), 30):
        pipeline = input_pipeline.create_pipeline(
            data_config(dataset="imagenet2012", data_dir=str(tmp_path), shuffle_buffer=8)
        )
        assert not pipeline.train_split.indexed
        assert pipeline.num_classes == 1000 and pipeline.eval_split_name == "validation"
        assert pipeline.preprocessing.family == "imagenet"
        assert pipeline.preprocessing.eval_resize == 256
        examples = take_examples(pipeline.train_dataset(10), 60)
        assert examples["image"].shape == (60, 224, 224, 3)
        assert sorted(examples["id"][:30]) == list(range(30))
        assert sorted(examples["id"][30:]) == list(range(30))
        assert not np.array_equal(examples["id"][:30], examples["id"][30:])
        # Entering the stream mid-epoch gives the same examples, bitwise.
        entered = take_examples(pipeline.train_dataset(10, start_example=20), 20)
        np.testing.assert_array_equal(entered["id"], examples["id"][20:40])
        np.testing.assert_array_equal(entered["image"], examples["image"][20:40])
        # TF's global seed (the trainer sets it to train.seed, often 0) changes nothing.
        for global_seed in (0, 7):
            tf.random.set_seed(global_seed)
            seeded = take_examples(pipeline.train_dataset(10, start_example=20), 20)
            np.testing.assert_array_equal(seeded["id"], examples["id"][20:40])
        tf.random.set_seed(None)
        batches = list(pipeline.eval_dataset(8, batches_multiple_of=3))
        assert len(batches) == 6
        ids = np.concatenate([b["id"].numpy()[b["mask"].numpy() > 0] for b in batches])
        assert sorted(ids) == list(range(30))


def test_tfds_records_on_real_files_with_slicing(tmp_path, monkeypatch):
    # A small dataset that tfds really prepares on disk (3 record files and the
    # dataset info), streamed as ImageNet would be, to check what mocks cannot:
    # ids across record files and tfds's split slicing.
    import tensorflow_datasets as tfds

    builder = tfds.testing.DummyMnist(data_dir=str(tmp_path))
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=3))
    assert len(builder.info.splits["train"].shard_lengths) == 3
    stored = tfds.as_numpy(builder.as_dataset(split="train", batch_size=-1))
    monkeypatch.setattr(sources.tfds_source, "IN_MEMORY_LIMIT_BYTES", 0)
    config = data_config(
        dataset="dummy_mnist",
        data_dir=str(tmp_path),
        image_size=32,
        train_examples=16,
        validation_split=4,
        shuffle_buffer=4,
    )
    pipeline = input_pipeline.create_pipeline(config)
    assert not pipeline.train_split.indexed
    assert pipeline.num_train_examples == 12 and pipeline.num_eval_examples() == 4
    # The holdout is examples 12-15 of the split, with ids 0-3 within it.
    batches = list(pipeline.eval_dataset(3))
    real = np.concatenate([b["mask"].numpy() > 0 for b in batches])
    ids = np.concatenate([b["id"].numpy() for b in batches])[real]
    labels = np.concatenate([b["label"].numpy() for b in batches])[real]
    assert sorted(ids) == [0, 1, 2, 3]
    np.testing.assert_array_equal(labels, stored["label"][12 + ids])
    # Training: every epoch is a permutation of the 12 remaining examples.
    examples = take_examples(pipeline.train_dataset(4), 24)
    assert sorted(examples["id"][:12]) == list(range(12))
    assert sorted(examples["id"][12:]) == list(range(12))
    np.testing.assert_array_equal(examples["label"], stored["label"][examples["id"]])
    entered = take_examples(pipeline.train_dataset(4, start_example=8), 8)
    np.testing.assert_array_equal(entered["id"], examples["id"][8:16])
    np.testing.assert_array_equal(entered["image"], examples["image"][8:16])


@pytest.fixture
def offline(monkeypatch):
    # A closed local port: the network probe fails at once, on any machine.
    monkeypatch.setenv(sources.NETWORK_PROBE_ENV, closed_port())


def test_offline_tfds_dataset_fails_fast_with_the_fix(tmp_path, offline, monkeypatch):
    import tensorflow_datasets as tfds

    def no_download(*args, **kwargs):  # tfds would retry it for minutes.
        raise AssertionError("the download was attempted offline")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_download)
    with pytest.raises(ConfigError) as error:
        input_pipeline.create_pipeline(data_config(dataset="cifar10", data_dir=str(tmp_path)))
    message = str(error.value)
    assert "'cifar10'" in message and str(tmp_path) in message
    assert "no network" in message and "--data_dir" in message and "\n" not in message


def test_imagenet_without_its_manual_download_explains_where_files_go(tmp_path, offline):
    with pytest.raises(ConfigError) as error:
        input_pipeline.create_pipeline(data_config(dataset="imagenet2012", data_dir=str(tmp_path)))
    message = str(error.value)
    assert os.path.join(str(tmp_path), "downloads", "manual") in message
    assert "ILSVRC2012_img_train.tar" in message and "\n" not in message


def test_unknown_dataset_names_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset 'cifar11'.*shapes"):
        input_pipeline.create_pipeline(data_config(dataset="cifar11", data_dir=str(tmp_path)))


@pytest.mark.parametrize("name", ["cifar10:9.9.9", "cifar10/nope"])
def test_bad_tfds_version_or_config(tmp_path, name):
    with pytest.raises(ConfigError, match=f"cannot load tfds dataset '{name}'"):
        input_pipeline.create_pipeline(data_config(dataset=name, data_dir=str(tmp_path)))


def test_tfds_dataset_that_is_not_image_classification(tmp_path):
    with pytest.raises(ConfigError, match="not an image-classification dataset"):
        input_pipeline.create_pipeline(data_config(dataset="glue/cola", data_dir=str(tmp_path)))


# -- config ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value,message",
    [
        (
            "preprocessing",
            "vgg",
            "data.preprocessing must be one of: auto, cifar, imagenet, got",
        ),
        ("dtype", "int8", "data.dtype must be one of: float32, bfloat16, float16, got 'int8'"),
        ("area_range", (0.5, 0.1), "data.augment.area_range=(0.5, 0.1); need low <= high"),
        (
            "area_range",
            (0.1, 1.5),
            "of data.augment.area_range must be in (0, 1], got 1.5",
        ),
        ("std", (1.0, 0.0, 1.0), "an entry of data.std must be a number > 0, got 0.0"),
        ("mean", (1.0, 2.0), "mean has 2 values; give one per channel: 1 or 3"),
        ("validation_split", -1, "data.validation_split must be a whole number >= 0, got -1"),
        ("image_size", 4, "data.image_size must be a whole number >= 8, got 4"),
        ("area_range", (0.1,), "area_range needs 2 values"),
        ("aspect_ratio_range", (0.5, 1.0, 2.0), "aspect_ratio_range needs 2 values"),
        ("eval_resize", 0, "data.eval_resize must be a whole number >= 8, got 0"),
    ],
)
def test_bad_config_values_name_the_field(field, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        data_config(**{field: value})


def test_eval_resize_below_the_crop_is_an_error(folder):
    config = data_config(dataset=f"folder:{folder[0]}", image_size=96, eval_resize=64)
    with pytest.raises(ConfigError, match="eval_resize=64 is smaller than the evaluation size 96"):
        input_pipeline.create_pipeline(config)


def test_unknown_eval_split_lists_the_splits():
    with pytest.raises(ConfigError, match="no split 'valid'; it has train, test"):
        input_pipeline.create_pipeline(shapes_config(eval_split="valid"))


# -- image size: the one rule -------------------------------------------------------


def run_config(tmp_path, *sets):
    from resnet_app import config

    return config.resolve(sets=[f"data.data_dir={tmp_path}", *sets])


def test_resnet18_on_cifar10_trains_at_the_datasets_32_px_with_the_cifar_recipe(tmp_path):
    """The preset (224 px) no longer wins over the dataset's own size."""
    with mock_tfds("cifar10", str(tmp_path), ("train", "test"), 8):
        resolved = run_config(tmp_path, "model.name=resnet18", "data.dataset=cifar10")
        pipeline = run_pipeline.create_run_pipeline(resolved)
        assert (pipeline.preprocessing.image_size, pipeline.preprocessing.family) == (32, "cifar")
        assert pipeline.describe() == "32 px, the dataset's size; CIFAR recipe (auto: up to 64 px)"
        assert take_examples(pipeline.train_dataset(4), 4)["image"].shape == (4, 32, 32, 3)
        # The plain factory follows the same rule: the model's size is a fallback.
        direct = input_pipeline.create_pipeline(resolved.data, default_image_size=224)
        assert direct.preprocessing.image_size == 32


def test_data_without_a_size_takes_the_model_presets(folder):
    root = folder[0]
    # Its images are all 32 x 32: measured, that is the dataset's size (images
    # of several sizes take the preset's: test_image_facts.py).
    resolved = run_config(root, "model.name=resnet18", f"data.dataset=folder:{root}")
    pipeline = run_pipeline.create_run_pipeline(resolved)
    assert (pipeline.preprocessing.image_size, pipeline.preprocessing.family) == (32, "cifar")
    assert pipeline.describe() == (
        "32 px, the dataset's size, in all 8 images measured; CIFAR recipe (auto: up to 64 px)"
    )
    resolved = run_config(root, "model.name=resnet18", "data.dataset=synthetic")
    pipeline = run_pipeline.create_run_pipeline(resolved)
    assert (pipeline.preprocessing.image_size, pipeline.preprocessing.family) == (224, "imagenet")
    resolved = run_config(root, "model.name=resnet20", f"data.dataset=folder:{root}")
    assert run_pipeline.create_run_pipeline(resolved).preprocessing.image_size == 32


def test_data_image_size_and_preprocessing_always_win(tmp_path):
    resolved = run_config(
        tmp_path,
        "model.name=resnet50",
        "data.dataset=synthetic",
        "data.image_size=48",
        "data.preprocessing=imagenet",
    )
    pipeline = run_pipeline.create_run_pipeline(resolved)
    assert (pipeline.preprocessing.image_size, pipeline.preprocessing.family) == (48, "imagenet")
    assert pipeline.describe() == (
        "48 px, set by data.image_size; ImageNet recipe (set by data.preprocessing)"
    )
    resolved = run_config(tmp_path, "model.name=resnet50", "data.dataset=synthetic")
    pipeline = run_pipeline.create_run_pipeline(resolved)
    assert pipeline.describe() == (
        "224 px, the resnet50 preset's input size (synthetic images have none); ImageNet "
        "recipe (auto: above 64 px)"
    )


@pytest.mark.parametrize(
    "data, dataset_size, model_size, recorded, expected",
    [
        (dict(image_size=40), 32, 224, 224, (40, "set by data.image_size")),
        ({}, 32, 224, None, (32, "the dataset's size")),
        ({}, 32, 224, 32, (32, "the dataset's size")),
        ({}, None, 224, None, (224, "the m preset's input size (images vary)")),
        ({}, None, None, None, (224, "the default (images vary)")),
        (dict(dataset="synthetic"), None, 32, None, (32, "the m preset's input size (synthetic")),
        ({}, 32, 224, 224, (224, "as this run was trained (its run directory says), not 32 px")),
    ],
)
def test_choose_image_size(data, dataset_size, model_size, recorded, expected):
    config = data_config(**data)
    chosen = image_choices.choose_image_size(config, dataset_size, model_size, "m", recorded)
    assert chosen.size == expected[0]
    assert chosen.reason.startswith(expected[1])


def test_a_run_keeps_the_size_its_data_info_records(tmp_path, caplog):
    """A run trained before the rule (resnet18 on shapes at 224 px) keeps 224 px;
    data_info.json of another dataset, or a damaged one, records nothing."""
    resolved = run_config(
        tmp_path, "model.name=resnet18", "data.train_examples=300", "data.eval_examples=100"
    )
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    info = {"dataset": "shapes", "class_names": [], "preprocessing": {"image_size": 224}}
    (model_dir / "data_info.json").write_text(json.dumps(info))
    pipeline = run_pipeline.create_run_pipeline(resolved, model_dir=str(model_dir))
    assert (pipeline.preprocessing.image_size, pipeline.preprocessing.family) == (224, "imagenet")
    assert (
        "224 px, as this run was trained (its run directory says), not 32 px" in pipeline.describe()
    )
    assert run_pipeline.create_run_pipeline(resolved).preprocessing.image_size == 32

    (model_dir / "data_info.json").write_text(json.dumps({**info, "dataset": "cifar10"}))
    pipeline = run_pipeline.create_run_pipeline(resolved, model_dir=str(model_dir))
    assert pipeline.preprocessing.image_size == 32
    (model_dir / "data_info.json").write_text('{"dataset": ')
    with caplog.at_level(logging.WARNING):
        pipeline = run_pipeline.create_run_pipeline(resolved, model_dir=str(model_dir))
    assert pipeline.preprocessing.image_size == 32
    assert "data_info.json is damaged" in caplog.text

    # No data_info.json: with checkpoints, a run from before the file, when
    # the model preset's size won (224 px); without, a new run (32 px).
    (model_dir / "data_info.json").unlink()
    assert (
        run_pipeline.create_run_pipeline(
            resolved, model_dir=str(model_dir)
        ).preprocessing.image_size
        == 32
    )
    (model_dir / "ckpt-3.index").write_bytes(b"")
    pipeline = run_pipeline.create_run_pipeline(resolved, model_dir=str(model_dir))
    assert pipeline.preprocessing.image_size == 224


def test_the_start_up_log_line_says_the_size_and_recipe_and_why(tmp_path):
    from tests.commands import run_command

    result = run_command(
        "resnet_app.train",
        "--model=tiny",
        f"--model_dir={tmp_path / 'run'}",
        f"--data_dir={tmp_path / 'data'}",
        "--set=data.train_examples=32",
        "--set=data.eval_examples=8",
        "--batch_size=16",
        "--train_steps=1",
    )
    assert result.returncode == 0, result.stderr
    started = [line for line in result.stderr.splitlines() if "Training tiny on shapes" in line]
    assert len(started) == 1, result.stderr
    assert "Training tiny on shapes (32 px, the dataset's size; CIFAR recipe " in started[0]
