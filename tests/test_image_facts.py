"""Measured data facts: size and channel statistics of folders, tables and TFRecords."""

import json
import logging
import os

import numpy as np
import pytest

from resnet_app.common import run_dir
from resnet_app.data import image_facts, preprocessing, sources
from resnet_app.data.input_pipeline import InputPipeline, Recorded
from resnet_app.data.settings import DataConfig, data_config
from tests import own_data

rng = np.random.default_rng(7)
# Grey 20 x 20 photos (like Fashion-MNIST's, smaller) and RGB ones of mixed sizes.
GREY = rng.integers(0, 256, (12, 20, 20, 1), np.uint8).repeat(3, axis=-1)
TEST = rng.integers(0, 256, (4, 20, 20, 3), np.uint8)


def numpy_stats(images):
    """Per-channel mean and std over every pixel of the images, whatever their sizes."""
    pixels = np.concatenate([image.reshape(-1, 3).astype(np.float64) for image in images])
    return pixels.mean(axis=0), pixels.std(axis=0)


def write_folder(root, images, labels, split):
    for k in set(labels.tolist()):
        own_data.write_pngs(os.path.join(root, split, f"c{k}"), images[labels == k], f"{split}{k}_")


def folder_config(root, **fields):
    return DataConfig(dataset=f"folder:{root}", dtype="float32", num_classes=3, **fields)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("grey"))
    write_folder(root, GREY, np.arange(12) % 3, "train")
    write_folder(root, TEST, np.arange(4) % 3, "test")
    return root


def test_a_folder_s_size_and_statistics_are_measured_on_its_training_images(folder, caplog):
    with caplog.at_level(logging.INFO, logger="absl"):
        pipeline = InputPipeline(
            folder_config(folder), default_image_size=32, model_name="resnet20"
        )
    mean, std = numpy_stats(GREY)
    assert pipeline.preprocessing.mean == pytest.approx(tuple(mean), rel=1e-12)
    assert pipeline.preprocessing.std == pytest.approx(tuple(std), rel=1e-12)
    assert pipeline.image_size.size == 20  # Not the preset's 32.
    assert "20 px, the dataset's size, in all 12 images measured" in caplog.text
    assert "measured on all 12 training images" in caplog.text


def test_a_table_measures_as_its_folder_does(folder, tmp_path):
    rows = []
    for split in ("train", "test"):
        for directory, _, names in os.walk(os.path.join(folder, split)):
            rows += [
                (os.path.join(directory, n), os.path.basename(directory), split) for n in names
            ]
    own_data.write_table(tmp_path / "t.csv", rows)
    table = InputPipeline(DataConfig(dataset=f"csv:{tmp_path / 't.csv'}", dtype="float32"))
    mean, std = numpy_stats(GREY)
    assert table.preprocessing.mean == pytest.approx(tuple(mean), rel=1e-12)
    assert table.preprocessing.std == pytest.approx(tuple(std), rel=1e-12)
    assert table.preprocessing.image_size == 20


def test_a_large_split_is_measured_on_a_fixed_sample_whatever_the_run_s_seed(folder, monkeypatch):
    monkeypatch.setattr(image_facts, "SAMPLE_IMAGES", 5)
    first = InputPipeline(folder_config(folder, seed=0)).facts
    other = InputPipeline(folder_config(folder, seed=3)).facts
    assert (first.measured, first.total) == (5, 12)
    assert first == other
    assert first.describe() == "measured on 5 of 12 training images (a fixed sample)"
    # The statistics of some 5 of the 12 images: between the extremes of single images.
    means = [numpy_stats([image])[0][0] for image in GREY]
    assert min(means) < first.mean[0] < max(means)


def test_images_of_several_sizes_keep_the_preset_s_size(tmp_path):
    images = [rng.integers(0, 256, (h, w, 3), np.uint8) for h, w in [(20, 20), (24, 18), (30, 30)]]
    for k, image in enumerate(images):
        own_data.write_pngs(tmp_path / "train" / f"c{k}", [image])
    facts = image_facts.measure(
        sources.load_source(folder_config(tmp_path)).split("train"), preprocessing.decode_image
    )
    assert facts.size is None and facts.sizes == (18, 30)
    mean, std = numpy_stats(images)
    assert facts.mean == pytest.approx(tuple(mean), rel=1e-12)
    assert facts.std == pytest.approx(tuple(std), rel=1e-12)
    pipeline = InputPipeline(folder_config(tmp_path), default_image_size=32, model_name="resnet20")
    assert pipeline.image_size.size == 32
    assert "images vary" in pipeline.image_size.reason


def test_tfrecords_are_measured_on_the_first_images_of_a_seeded_epoch(tmp_path):
    images, labels = own_data.shapes_shards(str(tmp_path), (9, 7), (5,))
    config = data_config(
        dataset=f"tfrecord:{tmp_path}",
        data_dir=str(tmp_path / "cache"),
        records={"label_offset": 1},
    )
    pipeline = InputPipeline(config)
    mean, std = numpy_stats(images[:16])
    assert pipeline.preprocessing.mean == pytest.approx(tuple(mean), rel=1e-12)
    assert pipeline.preprocessing.std == pytest.approx(tuple(std), rel=1e-12)
    assert pipeline.preprocessing.image_size == images.shape[1]


def test_a_run_s_recorded_statistics_are_reused_not_measured_again(folder, tmp_path):
    stats = ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))
    pipeline = InputPipeline(folder_config(folder), recorded=Recorded(20, stats))
    assert pipeline.facts is None
    assert (pipeline.preprocessing.mean, pipeline.preprocessing.std) == stats
    assert pipeline.stats_origin == "as this run recorded them (data_info.json)"
    assert pipeline.image_size.size == 20
    # Set statistics win over recorded ones.
    given = folder_config(folder, mean=(9.0, 9.0, 9.0), std=(2.0, 2.0, 2.0))
    pipeline = InputPipeline(given, recorded=Recorded(20, stats))
    assert pipeline.preprocessing.mean == (9.0, 9.0, 9.0)


def test_the_run_directory_s_data_info_gives_the_recorded_statistics(folder, tmp_path):
    from resnet_app import config as config_lib
    from resnet_app.data import run_pipeline

    model_dir = str(tmp_path / "run")
    os.makedirs(model_dir)
    resolved = config_lib.resolve(sets=[f"data.dataset=folder:{folder}", "data.num_classes=3"])
    first = run_pipeline.create_run_pipeline(resolved, model_dir=model_dir)
    run_pipeline.write_data_info(first, model_dir)
    with open(run_dir.data_info_path(model_dir)) as file:
        info = json.load(file)
    assert info["preprocessing"]["mean"] == pytest.approx(list(numpy_stats(GREY)[0]), rel=1e-12)
    again = run_pipeline.create_run_pipeline(resolved, model_dir=model_dir)
    assert again.facts is None
    assert again.preprocessing == first.preprocessing
