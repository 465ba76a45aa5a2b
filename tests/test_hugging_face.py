"""`hf:DIR` against the `datasets` library's own writing and reading of the same files."""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resnet_app.common.errors import ConfigError
from resnet_app.data import input_pipeline, preprocessing, shapes
from resnet_app.data.settings import data_config
from resnet_app.data.sources import hf_layout, hugging_face, sharded_stream
from tests import own_data, runs

os.environ["HF_DATASETS_OFFLINE"] = "1"  # datasets' reading below must not look online.
NAMES = shapes.CLASS_NAMES
TRAIN, TEST = 60, 14
ROWS_PER_GROUP = 7  # Train: 3 files of 20 rows, in row groups of 7, 7 and 6.


def images_of(kind, count, seed):
    images, labels = shapes.generate("train", count, seed=seed)
    images = images[:, :12, :10]  # Not square, so that rows and columns cannot swap.
    if kind == "grey":
        images = images.mean(axis=-1).astype(np.uint8)
    elif kind == "rgba":
        alpha = np.random.default_rng(seed).integers(0, 256, images.shape[:3], np.uint8)
        images = np.concatenate([images, alpha[..., None]], axis=-1)
    return images, labels


def write(root, layout="hub", kind="rgb", multi=False, **options):
    images, labels = images_of(kind, TRAIN + TEST, seed=4)
    if multi:
        labels = [sorted({int(x), (int(x) * 3 + i) % len(NAMES)}) for i, x in enumerate(labels)]
        labels[1] = []  # An image with no label at all.
    splits = {"train": (images[:TRAIN], labels[:TRAIN]), "test": (images[TRAIN:], labels[TRAIN:])}
    options.setdefault("shards", 3)
    options.setdefault("rows_per_group", ROWS_PER_GROUP)
    return own_data.write_hf(str(root), splits, NAMES, layout, **options)


def load(root, **fields):
    return hugging_face.load(str(root), data_config(dataset=f"hf:{root}", **fields))


def read_back(root, layout):
    """The dataset as `datasets` itself reads the directory."""
    import datasets

    return datasets.load_from_disk(str(root)) if layout == "disk" else datasets.load_dataset(root)


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """A Hub repository read as a stream (as if larger than memory): 3 files, 9 row groups."""
    root = tmp_path_factory.mktemp("hub")
    write(root)
    return root, load(root, in_memory_mb=0)


@pytest.mark.parametrize("kind", ["rgb", "grey", "rgba"])
@pytest.mark.parametrize("layout", ["hub", "readme", "disk"])
def test_every_pixel_and_label_is_what_datasets_reads(tmp_path, layout, kind):
    write(tmp_path, layout, kind)
    source = load(tmp_path)
    expected = read_back(str(tmp_path), layout)
    assert source.class_names == list(NAMES)
    assert sorted(source.splits) == ["test", "train"]
    for name, split in source.splits.items():
        reference = expected[name]
        assert split.indexed and split.num_examples == len(reference)
        np.testing.assert_array_equal(split.labels, reference["label"])
        for encoded, row in zip(split.contents, reference):
            pixels = preprocessing.decode_image(encoded, None).numpy()
            np.testing.assert_array_equal(pixels, np.asarray(row["image"]).reshape(pixels.shape))


@pytest.mark.parametrize("layout", ["hub", "disk"])
def test_label_lists_are_multi_hot_rows(tmp_path, layout):
    write(tmp_path, layout, multi=True)
    source = load(tmp_path)
    assert source.multi_label
    for name, split in source.splits.items():
        hot = np.zeros((split.num_examples, len(NAMES)), np.uint8)
        for row, labels in enumerate(read_back(str(tmp_path), layout)[name]["labels"]):
            hot[row, labels] = 1
        np.testing.assert_array_equal(split.labels, hot)
    assert not source.splits["train"].labels[1].any()


def test_the_stream_reads_every_row_group_as_datasets_does(streamed):
    root, source = streamed
    split = source.split("train")
    assert not split.indexed
    assert split.stream.counts.tolist() == [7, 7, 6] * 3  # Row groups are its shards.
    read = {e["id"]: e for e in split.stream.evaluation(1, 0).as_numpy_iterator()}
    assert sorted(read) == list(range(TRAIN))
    reference = read_back(str(root), "hub")["train"]
    for i, row in enumerate(reference):
        assert read[i]["label"] == row["label"]
        pixels = preprocessing.decode_image(read[i]["image"], None).numpy()
        np.testing.assert_array_equal(pixels, np.asarray(row["image"]))


def epoch_of(stream, count):
    return [int(i) for _, i, _, _ in stream.take(count).as_numpy_iterator()]


@pytest.mark.parametrize("workers", [2, 3])
def test_each_worker_reads_its_own_row_groups_and_together_every_example_once(streamed, workers):
    split = streamed[1].split("train")
    sizes, seen = split.shard_sizes(workers), []
    group_of = np.repeat(np.arange(9), split.stream.counts)
    for index in range(workers):
        stream = split.stream.training(5, 0, workers, index, 16)
        both = epoch_of(stream, 2 * sizes[index])
        first, second = both[: sizes[index]], both[sizes[index] :]
        assert sorted(first) == sorted(second) and first != second
        assert {int(group_of[i]) % workers for i in first} == {index}
        seen += first
    assert sorted(seen) == list(range(TRAIN))


@pytest.mark.parametrize("start", [0, 5, 23, 59, 77, 131])
def test_the_stream_entered_at_any_example_continues_the_stream_from_the_start(
    streamed, monkeypatch, start
):
    monkeypatch.setattr(sharded_stream, "CYCLE_SHARDS", 2)  # Entries in later groups too.
    stream = streamed[1].split("train").stream
    for workers in (1, 2):
        for index in range(workers):
            whole = list(stream.training(3, 0, workers, index, 8).take(100).as_numpy_iterator())
            entered = stream.training(3, start, workers, index, 8).take(10)
            local = start // workers
            for got, expected in zip(entered.as_numpy_iterator(), whole[local : local + 10]):
                assert got[:2] == expected[:2] and got[2] == expected[2] and got[3] == expected[3]


def test_the_pipeline_trains_and_evaluates_every_streamed_example_once(streamed):
    root, _ = streamed
    config = data_config(dataset=f"hf:{root}", image_size=16, validation_split=11, in_memory_mb=0)
    pipeline = input_pipeline.create_pipeline(config)
    assert pipeline.num_train_examples == TRAIN - 11 and pipeline.eval_split_name == "holdout"
    batches = list(pipeline.train_dataset(7).take(14).as_numpy_iterator())
    ids = np.concatenate([batch["id"] for batch in batches])
    assert sorted(ids[:49]) == list(range(49)) == sorted(ids[49:])
    for shards in (1, 2):
        assert runs.evaluated_ids(pipeline, 4, shards) == list(range(11))


def test_a_streamed_run_killed_mid_epoch_resumes_bitwise(streamed, tmp_path):
    from tests.test_checkpoint import SMALL, kill_and_resume

    args = [*SMALL, f"--dataset=hf:{streamed[0]}", "--set=data.in_memory_mb=0"]
    args += ["--set=data.image_size=16", "--set=data.shuffle_buffer=10", "--deterministic"]
    args += ["--set=data.train_examples=48", "--train_steps=14", "--set=train.checkpoint_every=5"]
    # 48 examples in batches of 16: step 5 is mid-way through epoch 2.
    stderr, _ = kill_and_resume(tmp_path, args, runs.fault_rng().randint(6, 9))
    assert "Resumed from step 5 (epoch 1, example 32 of 48)" in stderr
    assert "train split: decoded as it is read (streamed from its files)" in stderr


def test_a_test_split_without_labels_is_left_out(tmp_path, caplog):
    write(tmp_path, shards=1)
    path = tmp_path / "data" / "test-00000-of-00001.parquet"
    table = pq.read_table(path)
    unlabelled = pa.array([-1] * table.num_rows, pa.int64())
    pq.write_table(table.set_column(1, "label", unlabelled), path)
    assert sorted(load(tmp_path).splits) == ["train"]
    assert "split 'test' has no labels; it is left out" in caplog.text


def test_a_readme_chooses_the_files_of_its_configs(tmp_path):
    write(tmp_path / "repo" / "tmp", shards=2)
    for config in ("small", "large"):  # Two configs, in the README's own paths.
        os.renames(tmp_path / "repo" / "tmp" / "data", tmp_path / "repo" / config)
        write(tmp_path / "repo" / "tmp", shards=2)
    (tmp_path / "repo" / "README.md").write_text(
        "---\nconfigs:\n- config_name: small\n  data_files:\n  - split: train\n    path: small/"
        "train-*\n  - split: validation\n    path: small/test-*\n- config_name: large\n"
        "  data_files: large/train-*\n---\n"
    )
    with pytest.raises(ConfigError, match=r"has configs small, large: pass --dataset=hf:.*/<con"):
        load(tmp_path / "repo")
    small = load(tmp_path / "repo" / "small")
    assert sorted(small.splits) == ["train", "validation"]
    assert small.split("validation").num_examples == TEST
    assert sorted(load(tmp_path / "repo" / "large").splits) == ["train"]


def corrupt_labels(root):
    path = root / "data" / "train-00001-of-00003.parquet"
    table = pq.read_table(path)
    labels = table.column("label").to_numpy().copy()
    labels[9] = len(NAMES)  # Row 9: the second row group of 7.
    table = table.set_column(1, "label", pa.array(labels))
    pq.write_table(table, path, row_group_size=ROWS_PER_GROUP)


def garbage_images(root):
    path = root / "data" / "train-00002-of-00003.parquet"
    table = pq.read_table(path)
    images = table.column("image").combine_chunks()
    garbage = pa.array([b"not an image"] * table.num_rows, pa.binary())
    fields = pa.StructArray.from_arrays([garbage, images.field("path")], ["bytes", "path"])
    pq.write_table(table.set_column(0, "image", fields), path, row_group_size=ROWS_PER_GROUP)


def only_images(root):
    for path in (root / "data").iterdir():
        pq.write_table(pq.read_table(path, columns=["image"]), path)


def loading_script(root):
    for path in (root / "data").iterdir():
        path.unlink()
    (root / "fashion.py").write_text("import datasets\n")


@pytest.mark.parametrize(
    "damage, fields, message",
    [
        (corrupt_labels, {}, r"train-00001-of-00003.parquet \(row group 1, column 'label'\) has "
         r"label 10, outside the 10 classes \(0 to 9\)"),
        (garbage_images, {}, r"train-00002-of-00003.parquet \(row group 0, column 'image'\) row 0 "
         r"is not a JPEG, PNG, BMP or GIF image"),
        (only_images, {}, r"train-00000-of-00003.parquet has no ClassLabel column; its columns "
         r"are image \(Image\): set data.label_column=NAME"),
        (lambda root: None, {"label_column": "tags"}, r"has no column 'tags'; its columns are "
         r"image \(Image\), label \(ClassLabel\): set data.label_column=NAME"),
        (loading_script, {}, r"holds a loading script \(fashion.py\) that fetches its data from "
         r"the network; where there is network, run datasets.load_dataset\(...\).save_to_disk"),
    ],
    ids=["label", "image", "no label column", "unknown column", "loading script"],
)  # fmt: skip
def test_a_bad_dataset_is_one_line_naming_the_file_and_row_group(tmp_path, damage, fields, message):
    write(tmp_path)
    damage(tmp_path)
    with pytest.raises(ConfigError, match=message) as error:  # Streamed: checked at load too.
        load(tmp_path, in_memory_mb=0, **fields)
    assert "\n" not in str(error.value)


def test_trains_from_the_command_line_and_refuses_a_wrong_column_in_one_line(tmp_path):
    from tests.commands import error_line, run_command

    write(tmp_path / "hub", "disk", "grey")
    args = ["resnet_app.train", f"--dataset=hf:{tmp_path / 'hub'}", "--model=tiny"]
    args += ["--batch_size=8", "--train_steps=2", "--eval_every=2"]
    result = run_command(*args, f"--model_dir={tmp_path / 'run'}")
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((tmp_path / "run" / "data_info.json").read_text())
    assert info["class_names"] == list(NAMES) and len(info["preprocessing"]["mean"]) == 1
    line = error_line(run_command(*args, "--set=data.image_column=picture"))
    assert "has no column 'picture'; its columns are image (Image), label (ClassLabel)" in line


@pytest.mark.parametrize(
    "names, splits",
    [
        (["data/train-00000-of-00002.parquet", "data/valid-00000-of-00001.parquet"],
         {"train": 1, "validation": 1}),
        (["cifar10_training.parquet", "cifar10_eval.parquet"], {"train": 1, "test": 1}),
        (["default/partial-train/0000.parquet", "default/partial-train/0001.parquet",
          "default/test/0000.parquet"], {"train": 2, "test": 1}),
        (["data/00000.parquet", "data/00001.parquet"], {"train": 2}),
    ],
    ids=["hub", "keywords", "parquet conversion branch", "no keyword"],
)  # fmt: skip
def test_split_names_are_found_as_datasets_finds_them(tmp_path, names, splits):
    from datasets.data_files import get_data_patterns

    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    layout = hf_layout.check(str(tmp_path))
    assert {split: len(files) for split, files in layout.splits.items()} == splits
    found = get_data_patterns(str(tmp_path))  # datasets' own inference, on the same files.
    assert {hf_layout.split_of(str(s)) or str(s) for s in found} == set(splits)


def test_text_labels_name_the_classes_and_path_only_images_are_read_as_files(tmp_path):
    images, labels = images_of("rgb", 20, seed=2)
    names = own_data.write_pngs(str(tmp_path / "data" / "images"), images)
    texts = [NAMES[label] for label in labels]

    def table(rows, kinds):  # Paths are relative to the data file's directory.
        paths = pa.array([f"images/{names[i]}" for i in rows])
        image = pa.StructArray.from_arrays(
            [pa.nulls(len(rows), pa.binary()), paths], ["bytes", "path"]
        )
        return pa.table({"image": image, "kind": pa.array(kinds).dictionary_encode()})

    pq.write_table(table(range(20), texts), tmp_path / "data" / "train-00000-of-00001.parquet")
    test = tmp_path / "data" / "test-00000-of-00001.parquet"
    pq.write_table(table(range(5), texts[:5]), test)
    source = load(tmp_path, label_column="kind")
    assert source.class_names == sorted(set(texts))
    train = source.split("train")
    np.testing.assert_array_equal(train.labels, [source.class_names.index(t) for t in texts])
    for i, encoded in enumerate(train.contents):
        np.testing.assert_array_equal(preprocessing.decode_image(encoded, None), images[i])
    pq.write_table(table(range(2), ["zebra", texts[0]]), test)  # A class train does not have.
    with pytest.raises(ConfigError, match=r"test-00000-of-00001.parquet \(row group 0, column "
                       r"'kind'\) has label 'zebra', outside the \d+ classes"):  # fmt: skip
        load(tmp_path, label_column="kind")


def test_a_split_without_the_label_column_is_left_out(tmp_path, caplog):
    write(tmp_path, shards=1)
    path = tmp_path / "data" / "test-00000-of-00001.parquet"
    pq.write_table(pq.read_table(path, columns=["image"]), path)
    assert sorted(load(tmp_path).splits) == ["train"]
    assert "split 'test' has no column 'label'; it is left out" in caplog.text


def test_a_single_saved_dataset_is_the_train_split(tmp_path):
    import datasets

    images, labels = images_of("grey", 9, seed=6)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=list(NAMES))}
    )
    data = datasets.Dataset.from_dict({"image": list(images), "label": labels.tolist()}, features)
    data.save_to_disk(str(tmp_path))
    source = load(tmp_path)
    assert list(source.splits) == ["train"] and source.class_names == list(NAMES)
    np.testing.assert_array_equal(source.split("train").labels, labels)
