"""`--dataset=cifar:PATH`: the CIFAR archives as distributed, the tfds names' offline fallback."""

import importlib
import logging
import os
import pickle
import time

import numpy as np
import pytest

from resnet_app.common.errors import ConfigError
from resnet_app.data.settings import data_config
from resnet_app.data.sources import cifar, registry, tfds_source
from tests import cifar_files
from tests.cifar_files import CIFAR10_NAMES, CIFAR100_COARSE, CIFAR100_FINE, TEST_SIZE
from tests.commands import REPO, blocked_packages, error_line, run_command
from tests.runs import read_records
from tests.tfds_mock import closed_port

FORMATS = [(d, k) for d in ("cifar10", "cifar100") for k in ("binary", "python")]


def load(path, **fields):
    return cifar.load(str(path), data_config(dataset=f"cifar:{path}", **fields))


def refusal(path, **fields):
    with pytest.raises(ConfigError) as raised:
        load(path, **fields)
    message = str(raised.value)
    assert "\n" not in message
    return message


def assert_matches(source, dataset, arrays, coarse=False):
    """Counts, labels and pixels against the archive's bytes read pixel by pixel."""
    assert set(source.splits) == {"train", "test"}
    assert source.default_eval_split() == "test" and source.image_size == 32
    for split in ("train", "test"):
        images, labels = cifar_files.expected(dataset, arrays, split, coarse)
        part = source.split(split)
        assert part.num_examples == len(labels) == part.images.shape[0]
        assert part.images.dtype == np.uint8 and part.images.shape[1:] == (32, 32, 3)
        assert part.labels.dtype == np.int64
        np.testing.assert_array_equal(part.labels, labels)
        np.testing.assert_array_equal(part.images, images)


@pytest.mark.parametrize("tarball", [False, True], ids=["directory", "tarball"])
@pytest.mark.parametrize("dataset, kind", FORMATS, ids=["-".join(f) for f in FORMATS])
def test_every_format_reads_the_archives_bytes(tmp_path, dataset, kind, tarball):
    arrays = cifar_files.make_arrays(dataset)
    path = cifar_files.write_archive(tmp_path, dataset, kind, arrays, tarball=tarball)
    source = load(path)
    assert source.name == f"cifar:{path}"
    assert source.split("train").num_examples == sum(cifar_files.TRAIN_SIZES[dataset])
    assert source.split("test").num_examples == TEST_SIZE
    assert source.class_names == list(CIFAR10_NAMES if dataset == "cifar10" else CIFAR100_FINE)
    assert_matches(source, dataset, arrays)
    # A directory holding the archive (as downloaded, or extracted) reads the same.
    assert_matches(load(tmp_path), dataset, arrays)


def test_pickles_written_by_python_3_read_too(tmp_path):
    arrays = cifar_files.make_arrays("cifar10", seed=1)
    path = cifar_files.write_archive(tmp_path, "cifar10", "python", arrays, python2=False)
    assert_matches(load(path), "cifar10", arrays)


@pytest.mark.parametrize("kind", ["binary", "python"])
def test_cifar100_coarse_labels(tmp_path, kind):
    arrays = cifar_files.make_arrays("cifar100", seed=2)
    path = cifar_files.write_archive(tmp_path, "cifar100", kind, arrays, tarball=True)
    source = load(path, coarse_labels=True)
    assert source.class_names == list(CIFAR100_COARSE)
    assert_matches(source, "cifar100", arrays, coarse=True)


def test_coarse_labels_elsewhere_are_one_line(tmp_path):
    path = cifar_files.write_archive(tmp_path, "cifar10", "binary")
    assert "data.coarse_labels needs CIFAR-100" in refusal(path, coarse_labels=True)
    with pytest.raises(ConfigError, match="--dataset=shapes has no coarse labels"):
        data_config(dataset="shapes", coarse_labels=True)


def test_class_names_setting(tmp_path):
    path = cifar_files.write_archive(tmp_path, "cifar10", "binary")
    names = [f"c{i}" for i in range(10)]
    assert load(path, class_names=names).class_names == names
    assert "lists 3 names, and CIFAR-10 binary has 10" in refusal(path, class_names=["a", "b", "c"])


def test_a_directory_with_both_datasets_asks_for_one(tmp_path):
    cifar_files.write_archive(tmp_path, "cifar10", "python", tarball=True)
    cifar_files.write_archive(tmp_path, "cifar100", "binary")
    message = refusal(tmp_path)
    assert "holds both CIFAR-10 and CIFAR-100" in message
    assert f"--dataset=cifar:{tmp_path / 'cifar-100-binary'}" in message


class Payload:
    """Pickles as a call of `function(argument)`: what a malicious file does."""

    def __init__(self, function, argument):
        self.function, self.argument = function, argument

    def __reduce__(self):
        return self.function, (self.argument,)


@pytest.mark.parametrize("target", ["os.system", "builtins.eval", "subprocess.Popen"])
def test_a_pickle_that_runs_code_is_refused_and_not_run(tmp_path, target):
    marker = tmp_path / "MARKER"
    module, name = target.split(".")
    # Looked up by name: the test itself starts no process (tests/tiers.py reads its names).
    function = getattr(importlib.import_module(module), name)
    argument = {
        "os.system": f"touch {marker}",
        "builtins.eval": f"open({str(marker)!r}, 'w')",
        "subprocess.Popen": ["touch", str(marker)],
    }[target]
    batch = pickle.dumps({b"data": Payload(function, argument), b"labels": []}, protocol=2)
    path = cifar_files.write_archive(
        tmp_path, "cifar10", "python", tarball=True, extra={"data_batch_3": batch}
    )
    message = refusal(path)
    # As the file names it: protocol 2 writes Python 2's names (posix.system, __builtin__.eval).
    assert "data_batch_3 is not a CIFAR archive's pickle: it asks for " in message
    assert f".{target.split('.')[1]}, and" in message
    assert "read without running code" in message
    assert not marker.exists()


def test_wrong_contents_are_one_line(tmp_path):
    wide = pickle.dumps({b"data": np.zeros((2, 3072), np.int64), b"labels": [0, 1]}, protocol=2)
    path = cifar_files.write_archive(
        tmp_path / "a", "cifar10", "python", extra={"test_batch": wide}
    )
    assert "test_batch's data is a int64 array of shape (2, 3072), not uint8" in refusal(path)
    labels = pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 12]}, protocol=2)
    path = cifar_files.write_archive(
        tmp_path / "b", "cifar10", "python", extra={"test_batch": labels}
    )
    assert "test_batch has label 12, outside the 10 classes" in refusal(path)
    junk = {"data_batch_2": b"\x80\x02not a pickle"}
    path = cifar_files.write_archive(tmp_path / "c", "cifar10", "python", extra=junk)
    assert "data_batch_2 is not a readable pickle" in refusal(path)
    cut = cifar_files.write_archive(tmp_path / "d", "cifar10", "binary", tarball=True)
    with open(cut, "rb") as file:
        data = file.read()
    with open(cut, "wb") as file:
        file.write(data[: len(data) // 2])
    assert "is not a readable tar archive" in refusal(cut)


def check(path, **fields):
    """The TF-free check's one line, and that it took well under a second."""
    start = time.perf_counter()
    with pytest.raises(ConfigError) as raised:
        registry.check_source(data_config(dataset=f"cifar:{path}", **fields))
    assert time.perf_counter() - start < 0.5
    message = str(raised.value)
    assert "\n" not in message and str(path) in message
    return message


def test_the_check_refuses_fast_in_one_line(tmp_path):
    assert "does not exist" in check(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    message = check(tmp_path / "empty")
    assert "holds no CIFAR archive" in message
    assert "cifar-10-python.tar.gz" in message and "cifar-100-binary" in message
    path = cifar_files.write_archive(tmp_path, "cifar10", "binary")
    batch = os.path.join(path, "data_batch_2.bin")
    with open(batch, "rb+") as file:
        file.truncate(5 * 3073 - 100)
    assert "data_batch_2.bin is cut short: 15265 bytes" in check(path)
    path = cifar_files.write_archive(tmp_path / "again", "cifar10", "binary")
    os.unlink(os.path.join(path, "batches.meta.txt"))
    assert "has no batches.meta.txt" in check(path)
    good = cifar_files.write_archive(tmp_path / "good", "cifar100", "python", tarball=True)
    registry.check_source(data_config(dataset=f"cifar:{good}", coarse_labels=True))


def test_the_check_runs_without_tensorflow(tmp_path):
    path = cifar_files.write_archive(tmp_path, "cifar100", "binary")
    with open(os.path.join(path, "test.bin"), "ab") as file:
        file.write(b"\0")
    blocked = f"{blocked_packages(tmp_path / 'blocked', 'tensorflow')}{os.pathsep}{REPO}"
    result = run_command("resnet_app.train", f"--dataset=cifar:{path}", env={"PYTHONPATH": blocked})
    assert "test.bin is cut short" in error_line(result)


@pytest.fixture
def offline_home(tmp_path, monkeypatch):
    """No network, an empty tfds data directory, HOME (Keras's ~/.keras) in tmp_path."""
    monkeypatch.setenv(tfds_source.NETWORK_PROBE_ENV, closed_port())
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KERAS_HOME", raising=False)
    return tmp_path / "home" / ".keras" / "datasets"


@pytest.mark.parametrize("keras", ["keras2", "keras3"])
def test_offline_cifar10_reads_the_archive_keras_downloaded(offline_home, keras, caplog):
    arrays = cifar_files.make_arrays("cifar10", seed=3)
    if keras == "keras2":  # ~/.keras/datasets/cifar-10-batches-py/
        cifar_files.write_archive(offline_home, "cifar10", "python", arrays)
    else:  # ~/.keras/datasets/cifar-10-batches-py-target/cifar-10-batches-py/
        cifar_files.write_archive(
            offline_home / "cifar-10-batches-py-target", "cifar10", "python", arrays
        )
    config = data_config(dataset="cifar10")
    registry.check_source(config)
    with caplog.at_level(logging.INFO, logger="absl"):
        source = registry.load_source(config)
    assert source.name == "cifar10" and source.class_names == list(CIFAR10_NAMES)
    assert_matches(source, "cifar10", arrays)
    said = [
        r.getMessage() for r in caplog.records if "reading CIFAR's own archive" in r.getMessage()
    ]
    assert len(said) == 1 and str(offline_home) in said[0]


def test_offline_cifar100_from_data_dir_and_manual_dir(offline_home, tmp_path):
    arrays = cifar_files.make_arrays("cifar100", seed=4)
    data_dir = tmp_path / "data"
    cifar_files.write_archive(
        data_dir / "downloads" / "manual", "cifar100", "binary", arrays, tarball=True
    )
    config = data_config(dataset="cifar100", data_dir=str(data_dir), coarse_labels=True)
    registry.check_source(config)
    source = registry.load_source(config)
    assert source.class_names == list(CIFAR100_COARSE)
    assert_matches(source, "cifar100", arrays, coarse=True)
    # A CIFAR-10 archive there is not CIFAR-100's.
    cifar_files.write_archive(data_dir, "cifar10", "binary")
    assert (
        registry.load_source(data_config(dataset="cifar10", data_dir=str(data_dir))).name
        == "cifar10"
    )


def test_offline_without_an_archive_says_where_to_put_one(offline_home, tmp_path):
    for config in (data_config(dataset="cifar10"), data_config(dataset="cifar100")):
        for attempt in (registry.check_source, registry.load_source):
            with pytest.raises(ConfigError) as raised:
                attempt(config)
            message = str(raised.value)
            classes = 10 if config.dataset == "cifar10" else 100
            assert f"'{config.dataset}' is not prepared in {tmp_path / 'tfds'}" in message
            assert f"cifar-{classes}-python.tar.gz or cifar-{classes}-binary.tar.gz" in message
            assert str(offline_home) in message and "downloads/manual" in message
            assert "\n" not in message


def test_trains_and_evaluates_every_test_example_once(tmp_path):
    path = cifar_files.write_archive(tmp_path, "cifar10", "binary", tarball=True)
    run = tmp_path / "run"
    result = run_command(
        "resnet_app.train",
        f"--dataset=cifar:{path}",
        "--model=tiny",
        "--batch_size=8",
        "--train_steps=2",
        "--eval_every=2",
        f"--model_dir={run}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    evaluations = [r for r in read_records(run) if "top1" in r]
    # 11 test examples in batches of 8: the padding of the last batch is not counted.
    assert [(r["num_examples"], r["split"]) for r in evaluations] == [(TEST_SIZE, "test")]
    assert "automobile" in (run / "data_info.json").read_text()
