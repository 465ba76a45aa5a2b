"""`resnet-app show-batch` (`tools/show_batch.py`), run as a user would: picture, errors."""

import pytest
import tensorflow as tf

from resnet_app.data import sources
from tests.commands import error_line, run_command
from tests.tfds_mock import closed_port


def show_batch(*args, env=None):
    return run_command("resnet_app.tools.show_batch", *args, env=env)


def test_writes_a_grid_of_training_images(tmp_path):
    out = tmp_path / "batch.png"
    result = show_batch(
        "--dataset=shapes",
        f"--data_dir={tmp_path}",
        "--train_examples=64",
        "--eval_examples=16",
        "--count=12",
        f"--out={out}",
    )
    assert result.returncode == 0, result.stderr
    picture = tf.io.decode_png(out.read_bytes()).numpy()
    assert picture.shape[0] > 200 and picture.shape[1] > 400
    assert picture[..., :3].std() > 20  # Not blank.


def test_offline_tfds_dataset_is_one_line(tmp_path):
    # No download is attempted: test_data.py's test_offline_tfds_dataset_fails_fast_with_the_fix.
    result = show_batch(
        "--dataset=cifar10",
        f"--data_dir={tmp_path}",
        f"--out={tmp_path / 'b.png'}",
        env={sources.NETWORK_PROBE_ENV: closed_port()},
    )
    line = error_line(result)
    assert "'cifar10'" in line and str(tmp_path) in line and "--data_dir" in line


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--preprocessing=vgg"], "data.preprocessing must be one of: auto, cifar, imagenet"),
        (["--area_range=small,large"], "--area_range=small,large: expected comma-separated"),
        (["--dataset=folder:/no/such/dir"], "/no/such/dir is not a directory"),
        (["--out=/no/such/dir/b.png"], "directory /no/such/dir does not exist"),
        (["--datset=shapes"], "--help"),
        (["--count=0"], "--count must be a whole number >= 1, got 0"),
        (["--area_range=0.1"], "area_range needs 2 values"),
        (["--dataset=cifar10:9.9.9"], "cannot load tfds dataset 'cifar10:9.9.9'"),
    ],
)
def test_user_mistakes_are_one_line_errors(args, expected):
    assert expected in error_line(show_batch(*args))
