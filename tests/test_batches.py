"""Pixels in memory read a batch at a time (`data/batches.py`, `data/philox.py`).

The batch-wise reads must give what the per-example pipeline gives, bit for
bit: the same examples in the same order, the same crops and flips, the same
padding. The per-example pipeline is the reference (forced by making
`batches.applies` say no); the batched draws are checked against TensorFlow's
own `tf.random.stateless_uniform`, one seed at a time.
"""

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.data import augmentations, batches, input_pipeline, philox
from resnet_app.data.settings import data_config
from tests.test_idx_source import write_set

EDGE_SEEDS = [[0, 0], [-1, -1], [2**63 - 1, -(2**63)], [1, 2], [-(2**40), 2**33 + 7]]


@pytest.mark.parametrize("count", [1, 3, 4, 5, 9])
def test_each_row_is_tensorflows_stateless_uniform_of_its_seed(count):
    rng = np.random.default_rng(count)
    seeds = np.concatenate(
        [EDGE_SEEDS, rng.integers(-(2**63), 2**63 - 1, (300, 2), dtype=np.int64)]
    ).astype(np.int64)
    rows = philox.uniform_rows(seeds, count).numpy()
    expected = np.stack([tf.random.stateless_uniform([count], seed).numpy() for seed in seeds])
    assert rows.dtype == np.float32 and rows.shape == (len(seeds), count)
    np.testing.assert_array_equal(rows.view(np.uint32), expected.view(np.uint32))


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("idx")
    write_set(directory)  # 50 training and 20 test images, 28 px, greyscale.
    return str(directory)


def pipelines(idx_dir, **data):
    """The pipeline, and the same pipeline made to read one example at a time."""
    settings = data_config(dataset=f"idx:{idx_dir}", seed=3, **data)
    return input_pipeline.create_pipeline(settings), input_pipeline.create_pipeline(settings)


def batches_of(dataset, count):
    return [tf.nest.map_structure(np.asarray, b) for b in dataset.take(count).as_numpy_iterator()]


def assert_same(batched, general):
    assert len(batched) == len(general)
    for one, other in zip(batched, general):
        assert sorted(one) == sorted(other)
        for key in one:
            assert one[key].dtype == other[key].dtype, key
            np.testing.assert_array_equal(one[key], other[key], err_msg=key)


def spy(function, calls):
    def called(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    return called


def per_example(monkeypatch):
    monkeypatch.setattr(batches, "applies", lambda *args: False)


CASES = {
    "plain": ({}, {"global_batch_size": 8, "start_example": 12}),
    "two shards": ({}, {"global_batch_size": 8, "num_shards": 2, "shard_index": 1}),
    "no flip, padding 3, rgb": (
        {"augment": {"flip": False, "crop_padding": 3}, "channels": 3},
        {"global_batch_size": 6},
    ),
    "repeats": ({"augment": {"repeats": 2}}, {"global_batch_size": 8, "replicas_per_shard": 2}),
    "balanced, bf16": ({"sampling": "balanced", "dtype": "bfloat16"}, {"global_batch_size": 5}),
    "validation split": ({"validation_split": 10}, {"global_batch_size": 8, "start_example": 32}),
}


@pytest.mark.parametrize("case", CASES)
def test_training_batches_are_the_per_example_pipelines(idx_dir, monkeypatch, case):
    data, call = CASES[case]
    fast, slow = pipelines(idx_dir, **data)
    read = []
    monkeypatch.setattr(batches, "training", spy(batches.training, read))
    batched = batches_of(fast.train_dataset(**call), 15)  # Past two epochs of 50.
    assert read, "the batch-wise reads were not used"
    per_example(monkeypatch)
    general = batches_of(slow.train_dataset(**call), 15)
    assert_same(batched, general)


@pytest.mark.parametrize("shards", [1, 3])
def test_evaluation_batches_and_their_padding_are_the_per_example_pipelines(
    idx_dir, monkeypatch, shards
):
    fast, slow = pipelines(idx_dir, channels=3)
    read = []
    monkeypatch.setattr(batches, "evaluation", spy(batches.evaluation, read))
    batched = [
        batches_of(fast.eval_dataset(8, num_shards=shards, shard_index=i), 99)
        for i in range(shards)
    ]
    assert len(read) == shards, "the batch-wise reads were not used"
    per_example(monkeypatch)
    general = [
        batches_of(slow.eval_dataset(8, num_shards=shards, shard_index=i), 99)
        for i in range(shards)
    ]
    for one, other in zip(batched, general):
        assert_same(one, other)
    ids = np.concatenate([b["id"] for part in batched for b in part])
    assert sorted(ids[ids >= 0]) == list(range(20)) and (ids < 0).any()
    masks = np.concatenate([b["mask"] for part in batched for b in part])
    np.testing.assert_array_equal(masks, ids >= 0)


OPTIONS = {
    "none": {},
    "randaugment": {"randaugment_ops": 2},
    "trivialaugment": {"auto_augment": "ta_wide"},
    "autoaugment": {"auto_augment": "imagenet"},
    "augmix": {"auto_augment": "augmix"},
    "erasing": {"erase_probability": 0.25},
    "cutout": {"cutout_size": 8},
}


@pytest.mark.parametrize("option", OPTIONS)
def test_batches_are_read_whole_only_when_no_example_draws_more(idx_dir, option):
    pipeline, _ = pipelines(idx_dir, augment=OPTIONS[option])
    config = pipeline.training_preprocessing()
    drawn = augmentations.draws(tf.constant([1, 2], tf.int64), config)
    assert bool(augmentations.active(config.augment)) == bool(drawn)
    assert batches.applies(pipeline.train_split, config, False) == (option == "none")
    assert not batches.applies(pipeline.train_split, config, True)  # A resize: per example.
