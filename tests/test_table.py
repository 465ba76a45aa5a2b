"""`--dataset=csv:FILE`: tables of paths and labels (CSV, TSV, JSON lines), and their errors."""

import json
import os
import sys

import numpy as np
import pytest

from resnet_app.common.errors import ConfigError
from resnet_app.data import input_pipeline, shapes
from resnet_app.data.settings import data_config
from resnet_app.data.sources import table
from tests import own_data


@pytest.fixture(scope="module")
def images():
    return shapes.generate("train", 30, seed=4)


@pytest.fixture
def pngs(tmp_path, images):
    names = own_data.write_pngs(str(tmp_path / "images"), images[0])
    return [os.path.join("images", name) for name in names]


def load(path, **fields):
    return table.load(str(path), data_config(**fields))


def test_names_splits_and_paths_relative_to_the_table(tmp_path, pngs, images):
    labels = images[1]
    names = [shapes.CLASS_NAMES[label] for label in labels]
    splits = ["train"] * 20 + ["val"] * 6 + ["test"] * 4
    rows = list(zip(pngs, names, splits, strict=True))
    rows[3] = (str(tmp_path / pngs[3]), names[3], "train")  # An absolute path.
    own_data.write_table(tmp_path / "labels.csv", rows)
    source = load(tmp_path / "labels.csv")
    assert source.class_names == sorted(set(names))
    assert set(source.splits) == {"train", "validation", "test"}
    train = source.split("train")
    assert train.num_examples == 20
    np.testing.assert_array_equal([source.class_names[i] for i in train.labels], names[:20])
    assert train.files[3] == str(tmp_path / pngs[3])
    assert train.files[0] == os.path.join(str(tmp_path), pngs[0])
    assert train.contents is not None  # Small: read into memory once.
    assert source.split("validation").num_examples == 6
    assert not source.multi_label


def test_integer_ids_index_class_names_or_name_themselves(tmp_path, pngs, images):
    rows = [(path, str(label)) for path, label in zip(pngs, images[1], strict=True)]
    own_data.write_table(tmp_path / "ids.csv", rows, columns=("path", "label"))
    named = load(tmp_path / "ids.csv", class_names=shapes.CLASS_NAMES)
    assert named.class_names == list(shapes.CLASS_NAMES)
    np.testing.assert_array_equal(named.split("train").labels, images[1])
    plain = load(tmp_path / "ids.csv")
    assert plain.class_names == [str(i) for i in range(int(images[1].max()) + 1)]
    np.testing.assert_array_equal(plain.split("train").labels, images[1])


def test_missing_and_unreadable_files_are_skipped_and_counted(tmp_path, pngs, images, caplog):
    rows = [(path, "a" if i % 2 else "b") for i, path in enumerate(pngs)]
    rows += [(f"images/gone{i}.png", "a") for i in range(5)]
    (tmp_path / "images" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    rows.append(("images/broken.png", "b"))
    own_data.write_table(tmp_path / "t.csv", rows, columns=("path", "label"))
    source = load(tmp_path / "t.csv")
    assert source.split("train").num_examples == 30
    (missing,) = [r.getMessage() for r in caplog.records if "do not exist" in r.getMessage()]
    assert "5 of 36 files" in missing and "gone0.png" in missing and ", ..." in missing
    assert "\n" not in missing
    assert any("skipped 1 of 31 files" in r.getMessage() for r in caplog.records)


def test_without_a_split_column_validation_split_holds_out(tmp_path, pngs, images):
    rows = [(path, str(label)) for path, label in zip(pngs, images[1], strict=True)]
    own_data.write_table(tmp_path / "ids.csv", rows, columns=("path", "label"))
    pipeline = input_pipeline.create_pipeline(
        data_config(dataset=f"csv:{tmp_path / 'ids.csv'}", validation_split=6, image_size=32)
    )
    assert pipeline.num_train_examples == 24 and pipeline.eval_split_name == "holdout"
    batch = next(iter(pipeline.train_dataset(8)))
    assert batch["image"].shape == (8, 32, 32, 3)


def test_tsv_and_json_lines(tmp_path, pngs, images):
    rows = [(path, shapes.CLASS_NAMES[label]) for path, label in zip(pngs, images[1], strict=True)]
    own_data.write_table(tmp_path / "t.tsv", rows, columns=("path", "label"))
    with open(tmp_path / "t.jsonl", "w") as file:
        for path, label in rows:
            file.write(json.dumps({"path": path, "label": label}) + "\n")
    from_tsv, from_json = load(tmp_path / "t.tsv"), load(tmp_path / "t.jsonl")
    assert from_tsv.class_names == from_json.class_names
    np.testing.assert_array_equal(from_tsv.split("train").labels, from_json.split("train").labels)
    np.testing.assert_array_equal(
        [from_tsv.class_names[i] for i in from_tsv.split("train").labels], [r[1] for r in rows]
    )


def test_space_separated_labels_are_multi_label(tmp_path, pngs):
    tags = ["clear primary", "haze", "clear water road", "primary", "", "water"] * 5
    own_data.write_table(tmp_path / "m.csv", list(zip(pngs, tags)), columns=("path", "label"))
    source = load(tmp_path / "m.csv")
    assert source.multi_label
    assert source.class_names == ["clear", "haze", "primary", "road", "water"]
    labels = source.split("train").labels
    assert labels.shape == (30, 5) and labels.dtype == np.uint8
    np.testing.assert_array_equal(labels[2], [1, 0, 0, 1, 1])
    np.testing.assert_array_equal(labels[4], [0, 0, 0, 0, 0])  # No tag: no class.
    with pytest.raises(ConfigError, match=r"row 1 has several labels .*data\.multi_label=false"):
        load(tmp_path / "m.csv", multi_label=False)
    single = ["haze"] * 30
    own_data.write_table(tmp_path / "s.csv", list(zip(pngs, single)), columns=("path", "label"))
    assert not load(tmp_path / "s.csv").multi_label
    assert load(tmp_path / "s.csv", multi_label=True).split("train").labels.shape == (30, 1)


@pytest.mark.parametrize(
    ("rows", "columns", "message"),
    [
        ([("a.png", "x")], ("file", "label"), r"has no 'path' column; its columns are file, label"),
        ([("a.png",)], ("path",), r"has no 'label' column"),
        ([], ("path", "label"), r"has no rows"),
        ([("images/img0000.png", "x", "dev")], ("path", "label", "split"), "split 'dev' is not"),
        ([("images/img0000.png", "7")], ("path", "label"), r"label '7' is neither one of the 2"),
        ([("nowhere.png", "x")], ("path", "label"), r"none of the 1 files it names exists"),
    ],
)
def test_bad_tables_are_one_line(tmp_path, pngs, rows, columns, message):
    own_data.write_table(tmp_path / "bad.csv", rows, columns=columns)
    with pytest.raises(ConfigError, match=message) as raised:
        load(tmp_path / "bad.csv", class_names=("x", "y"))
    assert "\n" not in str(raised.value)


def test_a_missing_table(tmp_path):
    with pytest.raises(ConfigError, match="is not a file"):
        load(tmp_path / "nope.csv")


# -- integer ids that are not class ids ---------------------------------------------


def test_sparse_integer_ids_are_refused_unless_data_num_classes_confirms_them(tmp_path, pngs):
    ids = ["100234", "100567", "100034"]  # 3 labels; as class ids, 100,568 classes.
    rows = [(path, ids[i % 3]) for i, path in enumerate(pngs)]
    own_data.write_table(tmp_path / "ids.csv", rows, columns=("path", "label"))
    with pytest.raises(ConfigError) as raised:
        load(tmp_path / "ids.csv")
    message = str(raised.value)
    assert "column 'label'" in message and "up to 100567" in message and "\n" not in message
    assert "100568 classes for its 3 distinct labels" in message
    assert "data.num_classes=100568" in message and "data.class_names" in message
    confirmed = load(tmp_path / "ids.csv", num_classes=100568)
    assert len(confirmed.class_names) == 100568
    expected = [int(ids[i % 3]) for i in range(30)]
    np.testing.assert_array_equal(confirmed.split("train").labels, expected)
    with pytest.raises(ConfigError, match="data.num_classes=100568"):
        load(tmp_path / "ids.csv", num_classes=100000)  # Too few for the largest id.
    # Given as names, they are 3 classes.
    named = load(tmp_path / "ids.csv", class_names=("100034", "100234", "100567"))
    assert named.class_names == ["100034", "100234", "100567"]
    names = [named.class_names[label] for label in named.split("train").labels]
    assert names == [ids[i % 3] for i in range(30)]


@pytest.mark.parametrize(
    ("ids", "classes"),
    [
        ([0, 999], 1000),  # A sample of ImageNet's 1,000 classes keeps its ids.
        (list(range(1, 1501)), 1501),  # Dense 1-based ids: class 0 has no example.
        ([0, 1500], None),  # Sparse beyond 1,000: refused.
    ],
)
def test_integer_ids_are_class_ids_while_plausible(tmp_path, pngs, ids, classes):
    rows = [(pngs[i % len(pngs)], str(label)) for i, label in enumerate(ids)]
    own_data.write_table(tmp_path / "ids.csv", rows, columns=("path", "label"))
    if classes is None:
        with pytest.raises(ConfigError, match=f"up to {max(ids)}"):
            load(tmp_path / "ids.csv")
        return
    source = load(tmp_path / "ids.csv")
    assert source.class_names == [str(i) for i in range(classes)]
    np.testing.assert_array_equal(source.split("train").labels, ids)


# -- several labels in a cell, written with another separator -----------------------


def test_labels_joined_by_another_separator_are_one_line_naming_it(tmp_path, pngs):
    tags = ["cat|dog", "cat", "dog", "dog|cat", "bird", "bird|cat"] * 5
    own_data.write_table(tmp_path / "m.csv", list(zip(pngs, tags)), columns=("path", "label"))
    with pytest.raises(ConfigError) as raised:
        load(tmp_path / "m.csv")
    message = str(raised.value)
    assert "'cat|dog'" in message and "--set 'data.label_separator=\"|\"'" in message
    assert "data.multi_label=false" in message and "\n" not in message
    multi = load(tmp_path / "m.csv", label_separator="|")
    assert multi.multi_label and multi.class_names == ["bird", "cat", "dog"]
    labels = multi.split("train").labels
    np.testing.assert_array_equal(
        labels[:6], [[0, 1, 1], [0, 1, 0], [0, 0, 1], [0, 1, 1], [1, 0, 0], [1, 1, 0]]
    )
    # Told single-label, each combination is a class of its own, as asked.
    single = load(tmp_path / "m.csv", multi_label=False)
    assert single.class_names == ["bird", "bird|cat", "cat", "cat|dog", "dog", "dog|cat"]


def test_combinations_of_few_tags_with_commas_are_named(tmp_path, pngs):
    # Planet's way: no tag stands alone, but every tag is in several cells.
    tags = ["clear,primary", "haze,primary", "clear,water", "haze,water", "clear,primary,water"]
    rows = [(path, tags[i % 5]) for i, path in enumerate(pngs)]
    own_data.write_table(tmp_path / "m.csv", rows, columns=("path", "label"))
    with pytest.raises(ConfigError, match=r"data\.label_separator: \",\""):
        load(tmp_path / "m.csv")
    multi = load(tmp_path / "m.csv", label_separator=",")
    assert multi.class_names == ["clear", "haze", "primary", "water"]
    np.testing.assert_array_equal(multi.split("train").labels[4], [1, 0, 1, 1])


def test_names_with_a_comma_or_a_space_stay_names(tmp_path, pngs):
    # Parts that occur once ('Paris') make a name, not a combination of labels.
    names = ["Paris,France", "Lyon,France", "Rome,Italy", "Berlin,Germany", "Oslo,Norway"]
    rows = [(path, names[i % 5]) for i, path in enumerate(pngs)]
    own_data.write_table(tmp_path / "s.csv", rows, columns=("path", "label"))
    source = load(tmp_path / "s.csv")
    assert not source.multi_label and source.class_names == sorted(names)
    # With '|' between labels, a space belongs to a name.
    tags = ["golden retriever|dog", "dog", "tabby cat|cat", "cat", "golden retriever"] * 6
    own_data.write_table(tmp_path / "m.csv", list(zip(pngs, tags)), columns=("path", "label"))
    multi = load(tmp_path / "m.csv", label_separator="|")
    assert multi.class_names == ["cat", "dog", "golden retriever", "tabby cat"]
    np.testing.assert_array_equal(multi.split("train").labels[0], [0, 1, 1, 0])


def test_an_empty_label_separator_says_to_quote_it():
    with pytest.raises(ConfigError, match="label_separator.*quote"):
        data_config(label_separator="")


# -- the missing-file check ----------------------------------------------------------


def test_missing_files_are_found_with_one_listing_per_directory(
    tmp_path, pngs, monkeypatch, caplog
):
    # 30 files in images/, 30 missing from it, 30 more in a directory that does not exist.
    rows = [(path, "a") for path in pngs]
    rows += [(f"images/gone{i}.png", "a") for i in range(30)]
    rows += [(f"nowhere/gone{i}.png", "b") for i in range(30)]
    own_data.write_table(tmp_path / "t.csv", rows, columns=("path", "label"))
    calls = []

    def counted(function):
        def call(*args, **kwargs):
            # Only the table's own calls: each file is opened later anyway, to check it.
            if sys._getframe(1).f_globals.get("__name__") == table.__name__:
                calls.append(function.__name__)
            return function(*args, **kwargs)

        return call

    for module, name in [
        (os, "stat"),
        (os, "lstat"),
        (os, "scandir"),
        (os, "listdir"),
        (os, "access"),
        (os.path, "isfile"),
        (os.path, "exists"),
        (os.path, "lexists"),
    ]:
        monkeypatch.setattr(module, name, counted(getattr(module, name)))
    with caplog.at_level("WARNING"):
        source = load(tmp_path / "t.csv")
    assert source.split("train").num_examples == 30
    (missing,) = [r.getMessage() for r in caplog.records if "do not exist" in r.getMessage()]
    assert "60 of 90 files" in missing
    # The table's file (checked once) and its two directories, not one call per row.
    assert 0 < len(calls) <= 3, calls  # Counted (the table is checked), and few.
