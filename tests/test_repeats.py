"""Repeated augmentation (`data.augment.repeats`, `data/repeats.py`) against torchvision's
`RASampler`, rewritten here in NumPy from its definition, fed with the epoch's permutation."""

import math

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.config import resolve
from resnet_app.data import input_pipeline, preprocessing, repeats, seeds
from resnet_app.data.settings import data_config
from resnet_app.engine.plan import plan_run
from tests import own_data

pytestmark = pytest.mark.usefixtures("private_shapes_cache")
N, K = 600, 3  # 600 training examples: an epoch of 512 (600 rounded down to 256s).


def _config(**overrides):
    fields = dict(dataset="shapes", train_examples=N, eval_examples=20, augment={"repeats": K})
    fields.update(overrides)
    return data_config(**fields)


@pytest.fixture(scope="module")
def pipeline():
    return input_pipeline.create_pipeline(_config())


def ra_sampler(permutation, repetitions, num_replicas, rank):
    """torchvision's references/classification/sampler.py RASampler.__iter__, for one rank."""
    num_samples = math.ceil(len(permutation) * repetitions / num_replicas)
    total_size = num_samples * num_replicas
    num_selected = len(permutation) // 256 * 256 // num_replicas
    indices = [i for i in permutation for _ in range(repetitions)]
    indices += indices[: total_size - len(indices)]
    return indices[rank:total_size:num_replicas][:num_selected]


def _ids(dataset, count):
    ids, total = [], 0
    for batch in dataset:
        ids.append(batch["id"].numpy())
        total += len(ids[-1])
        if total >= count:
            break
    return np.concatenate(ids)[:count]


@pytest.mark.parametrize("workers,towers", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_each_replica_sees_what_the_samplers_give_its_rank(pipeline, workers, towers):
    """One epoch of 512 in global batches of 64. Workers are the pipeline's shards; a
    worker's towers take consecutive slices of its batch (as the trainer's rebatch does).
    Replica r = worker * towers + tower must see RASampler's rank r list, in order."""
    batch, replicas = 64, workers * towers
    assert pipeline.epoch_examples(batch) == 512
    permutation = list(pipeline.epoch_order(0))
    per_replica = batch // replicas
    for worker in range(workers):
        stream = pipeline.train_dataset(
            batch, num_shards=workers, shard_index=worker, replicas_per_shard=towers
        )
        ids = _ids(stream, 512 // workers).reshape(-1, towers, per_replica)
        for tower in range(towers):
            seen = ids[:, tower, :].reshape(-1)
            expected = ra_sampler(permutation, K, replicas, worker * towers + tower)
            np.testing.assert_array_equal(seen, expected)


def test_the_copies_are_augmented_each_on_its_own(pipeline):
    """The k copies of an example in an epoch: each is the per-example recipe with the
    copy's own key (copy 0's is the key of a run without repeats), and they differ."""
    batch = 48
    examples = {"image": [], "id": [], "copy": []}
    for step, data in enumerate(pipeline.train_dataset(batch)):
        for key in examples:
            examples[key].append(data[key].numpy())
        if step == 1:
            break
    ids, images = (np.concatenate(examples[key]) for key in ("id", "image"))
    assert all(ids[i] == ids[i - i % K] for i in range(len(ids)))  # k in a row.
    # Each knows which copy it is: the stochastic depth keys them apart.
    np.testing.assert_array_equal(np.concatenate(examples["copy"]), np.arange(len(ids)) % K)
    for position in (0, 1, 2, 30, 31, 32):
        copy, example = position % K, ids[position]
        seed = tf.stack([seeds.augment_key(0, 0, copy), tf.constant(example, tf.int64)])
        image = tf.constant(pipeline.train_split.images[example])
        expected = preprocessing.cifar_train(image, seed, pipeline.preprocessing)
        np.testing.assert_array_equal(images[position], expected.numpy())
    # Copy 0, and every run without repeats, keep the key's definition: a uniform int64
    # drawn from the (seed, AUGMENT) stream's seed for the epoch.
    for epoch in (0, 3):
        defined = tf.random.stateless_uniform(
            [], seeds.stream_seed(0, seeds.AUGMENT, epoch), minval=None, maxval=None, dtype=tf.int64
        )
        assert seeds.augment_key(0, epoch).numpy() == defined.numpy()
        assert seeds.augment_key(0, epoch, 0).numpy() == defined.numpy()
        assert seeds.augment_key(0, epoch, 1).numpy() != defined.numpy()
    different = sum(not np.array_equal(images[i], images[i + 1]) for i in range(0, 96, K))
    assert different >= 28  # Of 32 pairs of copies; a flip-only pair may coincide.


@pytest.mark.parametrize("start", [64 * 3, 512 + 64])  # Mid-epoch, and in the next epoch.
def test_entering_the_stream_anywhere_gives_the_same_examples(pipeline, start):
    reference = pipeline.train_dataset(64, replicas_per_shard=2)
    entered = pipeline.train_dataset(64, start_example=start, replicas_per_shard=2)
    first = [b for _, b in zip(range((start + 128) // 64), reference)]
    later = [b for _, b in zip(range(2), entered)]
    for a, b in zip(first[start // 64 :], later):
        np.testing.assert_array_equal(a["id"].numpy(), b["id"].numpy())
        np.testing.assert_array_equal(a["image"].numpy(), b["image"].numpy())


def test_the_plan_counts_the_samplers_epoch(tmp_path):
    config = resolve(
        None,
        [
            "data.dataset=shapes",
            "data.train_examples=600",
            "data.augment.repeats=3",
            "train.batch_size=64",
            "train.epochs=2",
        ],
    )
    examples = repeats.epoch_length(600, 3, 64)
    plan = plan_run(config, examples)
    assert (examples, plan.steps_per_epoch, plan.total_steps) == (512, 8, 16)
    assert repeats.epoch_length(600, 1, 64) == 600  # Without repeats: every example.
    assert repeats.epoch_length(100, 2, 16) == 96  # Under 256: all, in whole batches.
    with pytest.raises(ConfigError, match="a batch of 128 is more: use a smaller batch"):
        repeats.epoch_length(100, 2, 128)


def test_what_repeats_cannot_follow_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="data.sampling=balanced draws its own"):
        _config(sampling="balanced")
    root = tmp_path / "shards"
    own_data.shapes_shards(str(root))
    streamed = input_pipeline.create_pipeline(
        data_config(
            dataset=f"tfrecord:{root}",
            augment={"repeats": 2},
            image_size=32,
            records={"label_offset": 1},
        )
    )
    with pytest.raises(ConfigError, match="needs data read by index"):
        streamed.train_dataset(8)
