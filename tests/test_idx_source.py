"""`--dataset=idx:DIR`: the MNIST family's IDX files, gzipped or not, and their errors."""

import gzip
import logging

import numpy as np
import pytest

from resnet_app.common.errors import ConfigError
from resnet_app.data.settings import data_config
from resnet_app.data.sources import idx, registry
from tests import own_data
from tests.commands import error_line, run_command
from tests.own_data import idx_bytes

SIZES = {"train": 50, "test": 20}


def write_set(directory, gzipped=True, prefix="", classes=10, seed=0):
    """Random 28x28 images and labels 0..classes-1, as {(split, what): array}."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count in SIZES.items():
        arrays[(split, "images")] = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8)
        arrays[(split, "labels")] = rng.integers(0, classes, count, dtype=np.uint8)
    own_data.write_idx(str(directory), arrays, gzipped, prefix)
    return arrays


def load(argument, **fields):
    return idx.load(str(argument), data_config(**fields))


def refusal(argument, **fields):
    with pytest.raises(ConfigError) as raised:
        load(argument, **fields)
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("gzipped", [True, False], ids=["gz", "plain"])
def test_images_and_labels_are_the_files_bytes(tmp_path, gzipped):
    arrays = write_set(tmp_path / "mnist", gzipped)
    source = load(tmp_path / "mnist")
    assert source.name == f"idx:{tmp_path / 'mnist'}"
    assert source.class_names == [str(i) for i in range(10)]
    assert source.image_size == 28
    assert set(source.splits) == {"train", "test"}
    assert source.default_eval_split() == "test"
    for split, count in SIZES.items():
        part = source.split(split)
        assert part.num_examples == count
        assert part.labels.dtype == np.int64
        np.testing.assert_array_equal(part.labels, arrays[(split, "labels")])
        assert part.images.shape == (count, 28, 28, 1) and part.images.dtype == np.uint8
        np.testing.assert_array_equal(part.images[..., 0], arrays[(split, "images")])


def test_class_names_fashion_setting_and_number(tmp_path):
    write_set(tmp_path / "fashion-mnist")
    names = load(tmp_path / "fashion-mnist").class_names
    assert names[0] == "T-shirt/top" and names[9] == "Ankle boot" and len(names) == 10
    given = [f"c{i}" for i in range(10)]
    assert load(tmp_path / "fashion-mnist", class_names=given).class_names == given
    write_set(tmp_path / "wide", classes=12)
    assert len(load(tmp_path / "wide", num_classes=12).class_names) == 12
    message = refusal(tmp_path / "wide")
    assert "has label 11, outside the 10 classes" in message
    assert "data.num_classes=12" in message


def test_a_plain_file_is_read_before_its_gzipped_copy(tmp_path, caplog):
    arrays = write_set(tmp_path / "both", gzipped=False)
    for name in own_data.IDX_NAMES.values():
        (tmp_path / "both" / f"{name}.gz").write_bytes(b"not gzip")
    # absl's logger: another test in this process may have set its level.
    with caplog.at_level(logging.INFO, logger="absl"):
        source = load(tmp_path / "both")
    np.testing.assert_array_equal(source.split("train").labels, arrays[("train", "labels")])
    said = [r.getMessage() for r in caplog.records if "not its gzipped copy" in r.getMessage()]
    assert len(said) == 4 and "train-images-idx3-ubyte, not" in said[0]


def test_emnist_sets_are_picked_by_prefix_and_read_upright(tmp_path):
    directory = tmp_path / "emnist"
    arrays = write_set(directory, prefix="emnist-balanced-", classes=47)
    write_set(directory, prefix="emnist-digits-", seed=1)
    message = refusal(directory)
    assert "holds 2 sets of IDX files" in message
    assert f"--dataset=idx:{directory / 'emnist-balanced'}" in message
    source = load(directory / "emnist-balanced", num_classes=47)
    assert len(source.class_names) == 47
    np.testing.assert_array_equal(
        source.split("test").images[..., 0], arrays[("test", "images")].transpose(0, 2, 1)
    )


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-100])


def _bad_magic(path):
    path.write_bytes(b"\x08\x08" + path.read_bytes()[2:])


def _corrupt_gzip(path):
    data = bytearray(gzip.compress(path.read_bytes()))
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    path.with_name(path.name + ".gz").write_bytes(bytes(data))
    path.unlink()


def _cut_gzip(path):
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes())[:-20])
    path.unlink()


def _huge_count(path):
    data = path.read_bytes()
    path.write_bytes(data[:4] + b"\xff" * 4 + data[8:])


def _fewer_labels(path):
    path.write_bytes(idx_bytes(np.zeros(49, np.uint8)))


BROKEN = {
    "truncated": ("train-images-idx3-ubyte", _truncate, "train-images-idx3-ubyte is cut short"),
    "wrong magic": ("t10k-labels-idx1-ubyte", _bad_magic, "is not an IDX file"),
    "corrupt gzip": ("t10k-images-idx3-ubyte", _corrupt_gzip, ".gz is not a readable gzip"),
    "cut gzip": ("train-images-idx3-ubyte", _cut_gzip, ".gz is not a readable gzip"),
    "huge count": ("train-images-idx3-ubyte", _huge_count, "is cut short: 39216 bytes"),
    "counts differ": ("train-labels-idx1-ubyte", _fewer_labels, "holds 50 images but"),
    "missing": ("t10k-labels-idx1-ubyte", lambda path: path.unlink(), "no t10k-labels-idx1"),
    "wrong rank": (
        "train-labels-idx1-ubyte",
        lambda p: p.write_bytes(idx_bytes(np.zeros((50, 1)))),
        "in 2 dimensions",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_files_are_one_line(tmp_path, name):
    file, damage, expected = BROKEN[name]
    write_set(tmp_path, gzipped=False)
    damage(tmp_path / file)
    message = refusal(tmp_path)
    assert expected in message
    assert str(tmp_path) in message


def test_the_check_needs_no_tensorflow_and_names_the_directory(tmp_path):
    config = data_config(dataset=f"idx:{tmp_path}/nowhere")
    with pytest.raises(ConfigError, match="nowhere is not a directory"):
        registry.check_source(config)
    write_set(tmp_path / "ok")
    registry.check_source(data_config(dataset=f"idx:{tmp_path / 'ok'}"))


def test_trains_from_the_command_line(tmp_path):
    write_set(tmp_path / "fashion-mnist")
    result = run_command(
        "resnet_app.train",
        f"--dataset=idx:{tmp_path / 'fashion-mnist'}",
        "--model=tiny",
        "--batch_size=8",
        "--train_steps=2",
        "--eval_every=2",
        "--set=data.eval_examples=12",
        f"--model_dir={tmp_path / 'run'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Ankle boot" in (tmp_path / "run" / "data_info.json").read_text()


def test_a_missing_file_is_one_line_from_the_command_line(tmp_path):
    write_set(tmp_path / "mnist")
    (tmp_path / "mnist" / "train-images-idx3-ubyte.gz").unlink()
    line = error_line(
        run_command("resnet_app.train", f"--dataset=idx:{tmp_path / 'mnist'}", "--model=tiny")
    )
    assert "no train-images-idx3-ubyte (or .gz) in" in line


def test_a_missing_debian_directory_names_the_package():
    message = refusal("/usr/share/datasets/no-such-set")
    assert "is not a directory" in message
    assert "apt-get install dataset-fashion-mnist for Fashion-MNIST" in message
