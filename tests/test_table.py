"""`--dataset=csv:FILE`: tables of paths and labels (CSV, TSV, JSON lines), and their errors."""

import json
import os

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
