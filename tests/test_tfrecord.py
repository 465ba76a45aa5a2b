"""`--dataset=tfrecord:DIR` against a plain tf.data read: streamed exactly, one-line errors."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common.errors import ConfigError
from resnet_app.data import input_pipeline, shapes
from resnet_app.data.settings import data_config
from resnet_app.data.sources import record_index, sharded_stream, tfrecord
from tests import own_data, runs

TRAIN_SIZES = (13, 9, 16, 11, 7, 14, 10)  # 80 examples in 7 shards of unequal sizes.


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("records")
    own_data.shapes_shards(str(path), TRAIN_SIZES)
    return str(path)


def config(root, tmp_path, **fields):
    fields.setdefault("records", {"label_offset": 1})
    return data_config(dataset=f"tfrecord:{root}", data_dir=str(tmp_path / "cache"), **fields)


def load(root, tmp_path, **fields):
    return tfrecord.load(root, config(root, tmp_path, **fields))


def files(root, split):
    return sorted(
        os.path.join(root, name) for name in os.listdir(root) if name.startswith(split + "-")
    )


def test_the_source_reads_what_a_plain_tf_data_read_reads(root, tmp_path):
    source = load(root, tmp_path)
    assert source.class_names == list(shapes.CLASS_NAMES)  # From image/class/text.
    for split in ("train", "validation"):
        images, labels = own_data.plain_read(files(root, split))
        data = source.split(split)
        assert data.num_examples == len(labels)
        np.testing.assert_array_equal(data.labels, labels)
        read = list(data.stream.evaluation(1, 0).as_numpy_iterator())
        assert [example["id"] for example in read] == list(range(len(labels)))
        assert [example["image"] for example in read] == images
        np.testing.assert_array_equal([example["label"] for example in read], labels)


def epoch_of(stream, count):
    return [int(i) for _, i, _, _ in stream.take(count).as_numpy_iterator()]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_pipeline_reads_its_own_shards_and_together_every_example_once(
    root, tmp_path, workers
):
    split = load(root, tmp_path).split("train")
    sizes = split.shard_sizes(workers)
    assert sum(sizes) == 80
    seen = []
    for index in range(workers):
        stream = split.stream.training(7, 0, workers, index, 50)
        first, second = epoch_of(stream, 2 * sizes[index])[: sizes[index]], None
        second = epoch_of(stream, 2 * sizes[index])[sizes[index] :]
        assert sorted(first) == sorted(second)  # The next epoch: the same examples...
        assert first != second  # ...in another order.
        # Its own shards: shard k goes to pipeline k mod workers.
        shard_of = np.repeat(np.arange(len(TRAIN_SIZES)), TRAIN_SIZES)
        assert {int(shard_of[i]) % workers for i in first} == {index}
        seen += first
    assert sorted(seen) == list(range(80))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("start", [0, 6, 30, 58, 86, 170])
def test_the_stream_entered_at_any_example_continues_the_stream_from_the_start(
    root, tmp_path, monkeypatch, workers, start
):
    # Groups of 2 shards, so that entry points fall in later groups of an epoch.
    monkeypatch.setattr(sharded_stream, "CYCLE_SHARDS", 2)
    split = load(root, tmp_path).split("train")
    for index in range(workers):
        whole = list(split.stream.training(3, 0, workers, index, 20).take(150).as_numpy_iterator())
        entered = split.stream.training(3, start, workers, index, 20)
        local = start // workers
        for got, expected in zip(entered.take(12).as_numpy_iterator(), whole[local : local + 12]):
            assert got[0] == expected[0] and got[1] == expected[1]  # Epoch and id.
            assert got[2] == expected[2] and got[3] == expected[3]  # Image bytes and label.


def test_held_out_and_limited_examples_are_the_ids_of_a_slice(root, tmp_path):
    source = load(root, tmp_path)
    part = source.split("train").slice(20, 70)
    ids = epoch_of(part.stream.training(1, 0, 2, 0, 10), part.shard_sizes(2)[0])
    ids += epoch_of(part.stream.training(1, 0, 2, 1, 10), part.shard_sizes(2)[1])
    assert sorted(ids) == list(range(50))
    _, labels = own_data.plain_read(files(root, "train"))
    np.testing.assert_array_equal(part.labels, labels[20:70])
    read = {e["id"]: e["label"] for e in part.stream.evaluation(1, 0).as_numpy_iterator()}
    assert sorted(read) == list(range(50))
    assert [read[i] for i in range(50)] == labels[20:70].tolist()


def test_the_pipeline_trains_and_evaluates_every_example_once(root, tmp_path):
    pipeline = input_pipeline.create_pipeline(
        config(root, tmp_path, train_examples=64, image_size=32)
    )
    assert pipeline.num_train_examples == 64 and pipeline.eval_split_name == "validation"
    batches = list(pipeline.train_dataset(16).take(8).as_numpy_iterator())
    ids = np.concatenate([batch["id"] for batch in batches])
    assert sorted(ids[:64]) == list(range(64)) and sorted(ids[64:]) == list(range(64))
    assert batches[0]["image"].shape == (16, 32, 32, 3)
    for shards in (1, 3):
        assert runs.evaluated_ids(pipeline, 8, shards) == list(range(25))


def test_labels_that_do_not_fit_say_which_offset_would(root, tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"labels run from 1 to 10.*no class text or example has label 0: "
        r"set data\.records\.label_offset=1",
    ):
        load(root, tmp_path, records={"label_offset": 0})


def test_1_based_labels_without_texts(tmp_path, caplog):
    images, labels = shapes.generate("train", 12, seed=1)
    root = str(tmp_path / "r")
    own_data.write_shards(root, "train", images, labels, [12], texts=False)
    named = data_config(data_dir=str(tmp_path), class_names=shapes.CLASS_NAMES)
    with pytest.raises(ConfigError, match="outside \\[0, 10\\) for 10 names in data.class_names"):
        tfrecord.load(root, named)
    # Without names, the ids name the classes; an unused class 0 is pointed out.
    source = tfrecord.load(root, data_config(data_dir=str(tmp_path)))
    assert source.class_names == [str(i) for i in range(int(labels.max()) + 2)]
    assert any("data.records.label_offset=1" in r.getMessage() for r in caplog.records)
    fixed = tfrecord.load(root, data_config(data_dir=str(tmp_path), records={"label_offset": 1}))
    np.testing.assert_array_equal(fixed.split("train").labels, labels)


def test_a_missing_feature_key_names_the_keys_the_file_has(root, tmp_path):
    with pytest.raises(
        ConfigError, match=r"has no feature 'image/jpeg'.*image/class/label \(int64\)"
    ):
        load(root, tmp_path, records={"image_key": "image/jpeg"})


def test_no_train_shards_and_a_corrupt_shard_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no train-\\* shards in"):
        tfrecord.load(str(tmp_path / "empty"), data_config(data_dir=str(tmp_path)))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train-00000-of-00001").write_bytes(b"not a record file at all" * 10)
    with pytest.raises(ConfigError, match="not a readable TFRecord file"):
        tfrecord.load(str(tmp_path / "bad"), data_config(data_dir=str(tmp_path)))


def test_the_index_is_scanned_once_and_again_when_a_shard_changes(tmp_path, monkeypatch):
    images, labels = shapes.generate("train", 20, seed=2)
    root = str(tmp_path / "r")
    own_data.write_shards(root, "train", images, labels, [10, 10])
    scans = []
    scan = record_index._scan
    monkeypatch.setattr(record_index, "_scan", lambda *a: scans.append(1) or scan(*a))
    settings = data_config(data_dir=str(tmp_path / "cache"), records={"label_offset": 1})
    first = tfrecord.load(root, settings)
    second = tfrecord.load(root, settings)
    assert len(scans) == 1
    np.testing.assert_array_equal(first.split("train").labels, second.split("train").labels)
    own_data.write_shards(root, "train", images[:15], labels[:15], [10, 5])
    assert tfrecord.load(root, settings).split("train").num_examples == 15
    assert len(scans) == 2


@pytest.mark.parametrize("towers", [1, 3])
def test_evaluation_counts_every_record_once_and_matches_numpy(root, tmp_path, towers):
    from resnet_app.engine import exact_eval
    from resnet_app.nets.resnet import create_model
    from tests.test_evaluation import strategy_for

    pipeline = input_pipeline.create_pipeline(config(root, tmp_path, image_size=32))
    strategy = strategy_for(towers)
    with strategy.scope():
        model = create_model("tiny", num_classes=10)
        model.build((None, 32, 32, 3))
    pngs, labels = own_data.plain_read(files(root, "validation"))
    mean = np.array(pipeline.preprocessing.mean, np.float32)
    std = np.array(pipeline.preprocessing.std, np.float32)
    images = np.stack([tf.io.decode_png(png).numpy() for png in pngs]).astype(np.float32)
    images = (images - mean) / std
    # Stretched and centred logits, so that predictions vary (test_evaluation's way).
    kernel, bias = model.logits.kernel, model.logits.bias
    kernel.assign(tf.random.stateless_normal(kernel.shape, seed=[1, 2]) * 30)
    bias.assign(-tf.reduce_mean(model(images, training=False), axis=0))
    result = exact_eval.evaluate(model, pipeline, 8, strategy=strategy, collect=True)
    predictions = model(images, training=False).numpy().argmax(1)
    assert len(set(predictions.tolist())) > 2  # A discriminating check.
    assert result.examples == 25
    order = np.argsort(result.ids)
    assert result.ids[order].tolist() == list(range(25))
    np.testing.assert_array_equal(result.labels[order], labels)
    np.testing.assert_array_equal(result.predictions[order], predictions)


def test_a_mid_epoch_kill_resumes_bitwise(root, tmp_path):

    from tests.test_checkpoint import SMALL, kill_and_resume

    args = [*SMALL, f"--dataset=tfrecord:{root}", f"--data_dir={tmp_path / 'cache'}"]
    args += [
        "--set=data.records.label_offset=1",
        "--set=data.image_size=32",
        "--set=data.shuffle_buffer=20",
    ]
    args += ["--train_steps=14", "--deterministic", "--set=train.checkpoint_every=5"]
    # Epoch 2 of 64 examples, mid-epoch.
    stderr, _ = kill_and_resume(tmp_path, args, runs.fault_rng().randint(6, 9))
    assert "Resumed from step 5 (epoch 1, example 16 of 64)" in stderr


def test_a_damaged_index_cache_is_one_warning_and_scanned_again(tmp_path, caplog):
    images, labels = shapes.generate("train", 20, seed=2)
    root = str(tmp_path / "r")
    own_data.write_shards(root, "train", images, labels, [10, 10])
    settings = data_config(data_dir=str(tmp_path / "cache"), records={"label_offset": 1})
    first = tfrecord.load(root, settings).split("train").labels
    (path,) = (tmp_path / "cache").rglob("*.npz")
    path.write_bytes(path.read_bytes()[:100])  # Cut short, as by a full disk.
    with caplog.at_level(logging.WARNING):
        again = tfrecord.load(root, settings).split("train").labels
    (warning,) = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert warning.startswith(f"The cache file {path} is damaged (")
    np.testing.assert_array_equal(again, first)
    caplog.clear()
    tfrecord.load(root, settings)  # Rebuilt: read again without a word.
    assert not [r for r in caplog.records if "damaged" in r.getMessage()]


@pytest.mark.parametrize("damage", ["flipped byte", "cut short"])
def test_a_corrupt_shard_is_named_not_the_first(tmp_path, damage):
    images, labels = shapes.generate("train", 25, seed=3)
    root = str(tmp_path / "r")
    paths = own_data.write_shards(root, "train", images, labels, [5] * 5)
    bad = paths[3]  # Not the first: that one's keys are read before the scan.
    with open(bad, "rb") as file:
        data = bytearray(file.read())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0xFF  # Inside a record's bytes: its checksum fails.
    else:
        data = data[: len(data) - 7]  # The last record ends early.
    with open(bad, "wb") as file:
        file.write(data)
    settings = data_config(data_dir=str(tmp_path / "cache"), records={"label_offset": 1})
    with pytest.raises(ConfigError) as raised:
        tfrecord.load(root, settings)
    message = str(raised.value)
    assert bad in message and "remove it or write it again" in message
    assert not any(path in message for path in paths if path != bad)
    assert "\n" not in message
