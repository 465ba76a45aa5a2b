"""A disk that fills during a save: one line, nothing left behind, the last checkpoint resumes.

The disk is a 2 MiB tmpfs when the machine allows mounting one (CI runs as
root); elsewhere the save's op is made to fail as a full disk makes it fail.
"""

import errno
import functools
import os
import subprocess
import uuid

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import checkpoint, disk_space
from resnet_app.engine import loop
from resnet_app.engine.actions import Action
from tests import runs

# Training runs (not in --fast); `train.deterministic` runs in this process.
pytestmark = pytest.mark.usefixtures("op_determinism_off_after")


@functools.cache
def real_out_of_memory() -> tf.errors.ResourceExhaustedError:
    """The allocator's own error for 4 TiB, made once: TensorFlow waits about 10 s
    for memory to be freed before it raises it."""
    try:
        tf.zeros([2**40])
    except tf.errors.ResourceExhaustedError as error:
        return error
    raise AssertionError("4 TiB were allocated")


@pytest.fixture
def small_disk(tmp_path):
    """A directory on a 2 MiB filesystem of its own, or None when none can be mounted."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
            capture_output=True,
        ).returncode
        == 0
    )
    yield mount_point if mounted else None
    if mounted:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


class FillTheDisk(Action):
    """At `step`, fills the disk but for `left` bytes (or makes the next save fail so)."""

    def __init__(self, disk, step, left=8192):
        self.disk, self.step, self.left = disk, step, left
        self.filler = None

    def __call__(self, boundary):
        if boundary.step != self.step or self.filler:
            return
        self.filler = os.path.join(self.disk, "filler")
        free = os.statvfs(self.disk).f_bavail * os.statvfs(self.disk).f_frsize
        with open(self.filler, "wb") as f:
            f.write(b"\0" * max(free - self.left, 0))


def _fail_saves_as_a_full_disk(monkeypatch):
    """The file-layer fault where no tmpfs can be mounted: SaveV2 fails as ENOSPC makes it."""
    original = tf.train.CheckpointManager.save

    def save(manager, checkpoint_number=None, **kwargs):
        if checkpoint_number and checkpoint_number >= 4 and not os.environ.get("DISK_FREED"):
            open(f"{manager.directory}/ckpt-{checkpoint_number}.data-00000-of-00001", "w").close()
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{{{{function_node SaveV2}}}} ...; {os.strerror(errno.ENOSPC)}"
            )
        return original(manager, checkpoint_number=checkpoint_number, **kwargs)

    monkeypatch.setattr(tf.train.CheckpointManager, "save", save)


def test_a_full_disk_stops_in_one_line_and_the_last_checkpoint_resumes(
    tmp_path, small_disk, monkeypatch
):
    disk = small_disk or tmp_path
    if small_disk is None:
        _fail_saves_as_a_full_disk(monkeypatch)
    model_dir = str(disk / "run")
    settings = ("train.checkpoint_every=2", "train.deterministic=true")
    resolved = runs.small_config(tmp_path, *settings, train_steps=8, log_every=2)
    fill = FillTheDisk(str(disk), step=4)
    with pytest.raises(disk_space.DiskFullError) as full:
        loop.train_and_evaluate(resolved, model_dir, actions=[fill])
    message = str(full.value)
    assert message.startswith(f"no space left in {model_dir} to save ckpt-4 at step 4: "), message
    assert "free, a checkpoint takes" in message
    assert "the last checkpoint, ckpt-2, is intact" in message
    assert "\n" not in message
    # Nothing half-written is left; ckpt-2 reads back whole.
    left = sorted(os.listdir(model_dir))
    assert not [name for name in left if "ckpt-4" in name or "temp" in name], left
    assert [step for step, _ in checkpoint.list_checkpoints(model_dir)] == [2]
    assert checkpoint.unreadable(os.path.join(model_dir, "ckpt-2")) is None

    # Space freed: the same command resumes from step 2, and ends where an
    # uninterrupted run ends, bitwise.
    if fill.filler:
        os.remove(fill.filler)
    monkeypatch.setenv("DISK_FREED", "1")
    resumed = loop.train_and_evaluate(resolved, model_dir).model.get_weights()
    starts = [r["step"] for r in runs.read_records(model_dir) if r.get("event") == "start"]
    assert starts == [0, 2]
    whole = loop.train_and_evaluate(resolved, str(tmp_path / "whole")).model.get_weights()
    for got, expected in zip(resumed, whole, strict=True):
        np.testing.assert_array_equal(got, expected)


def test_a_full_disk_and_a_full_memory_are_told_apart(tmp_path, small_disk):
    """Real errors: a save to a full tmpfs is the disk; an allocation too large is memory."""
    if small_disk is not None:
        with open(small_disk / "filler", "wb") as f:
            f.write(b"\0" * (2 * 1024 * 1024))
        variable = tf.Variable(tf.zeros([64 * 1024]))
        with pytest.raises(tf.errors.ResourceExhaustedError) as raised:
            tf.train.Checkpoint(v=variable).write(str(small_disk / f"c{uuid.uuid4().hex}"))
        disk_error = raised.value
    else:  # As TensorFlow words it.
        disk_error = tf.errors.ResourceExhaustedError(
            None, None, f"{{{{function_node __wrapped__SaveV2}}}} x.tempstate1; {os.strerror(28)}"
        )
    assert disk_space.is_disk_full(disk_error)
    memory_error = real_out_of_memory()
    assert "OOM when allocating" in str(memory_error)
    assert not disk_space.is_disk_full(memory_error)
    assert disk_space.is_disk_full(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert not disk_space.is_disk_full(OSError(errno.EACCES, os.strerror(errno.EACCES)))


def test_a_step_out_of_memory_stays_a_memory_error(tmp_path, monkeypatch):
    from resnet_app.common.errors import ConfigError
    from resnet_app.engine.step import TrainStep

    def too_large(self, iterator, rates, stop=None, pad_to=None):
        raise real_out_of_memory()  # The real allocator's OOM, as a too-large batch raises it.

    monkeypatch.setattr(TrainStep, "loop", too_large)
    resolved = runs.small_config(tmp_path, train_steps=2)
    with pytest.raises(ConfigError) as error:
        loop.train_and_evaluate(resolved, str(tmp_path / "run"))
    assert not isinstance(error.value, disk_space.DiskFullError)
    assert str(error.value).startswith("out of memory training tiny on 32 px images")
    assert "smaller --batch_size" in str(error.value)


def test_a_save_warns_when_the_disk_is_nearly_full(tmp_path, small_disk, caplog, monkeypatch):
    disk = small_disk or tmp_path
    variable = tf.Variable(tf.zeros([100 * 1024]))  # 400 KiB a checkpoint.
    saver = checkpoint.RunCheckpoint(str(disk / "run"), v=variable)
    with caplog.at_level("WARNING"):
        saver.save(1)
    assert not [r for r in caplog.records if "free in" in r.getMessage()]
    if small_disk is not None:
        with open(small_disk / "filler", "wb") as f:
            f.write(b"\0" * (1024 * 1024))  # 2 MiB - 400 KiB - 1 MiB: about 600 KiB left.
    else:
        monkeypatch.setattr(disk_space, "free_bytes", lambda directory: 600 * 1024)
    with caplog.at_level("WARNING"):
        saver.save(2)
    (warning,) = [r.getMessage() for r in caplog.records if "free in" in r.getMessage()]
    size = sum(p.stat().st_size for p in (disk / "run").glob("ckpt-1.*"))
    assert size > 400 * 1024
    assert f"a checkpoint takes {size / 1024:.1f} KiB" in warning, warning
