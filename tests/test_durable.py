"""Durable writes: every file we keep is synced to disk, and its directory, before
anything older is deleted or replaced; what killed writers left is cleaned.

A power cut cannot be made here, so the tests record the order of the system
calls that make data durable (`os.fsync`, by the path its descriptor names)
against the renames and deletions, and check what was on disk at each sync.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import checkpoint, files, run_dir
from resnet_app.export import savedmodel


class Events:
    """Records fsync calls (by path) and renames, in order; `at_sync` runs at each sync."""

    def __init__(self, monkeypatch, at_sync=None):
        self.log: list[tuple[str, str]] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd):
            path = os.readlink(f"/proc/self/fd/{fd}")
            if at_sync is not None:
                at_sync(path)
            self.log.append(("fsync", path))
            return real_fsync(fd)

        def replace(source, destination):
            real_replace(source, destination)
            self.log.append(("replace", os.path.realpath(destination)))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)

    def index(self, kind: str, path: str) -> int:
        path = os.path.realpath(path)
        for position, event in enumerate(self.log):
            if event == (kind, path):
                return position
        raise AssertionError(f"no {kind} of {path} in {self.log}")

    def synced(self) -> set[str]:
        return {path for kind, path in self.log if kind == "fsync"}


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _write_run_config(directory):
    from resnet_app.config import layers, run_config

    run_config.write_yaml(layers.from_dict({}), str(directory / run_dir.CONFIG_FILE))
    return directory / run_dir.CONFIG_FILE


def _write_data_info(directory):
    run_dir.write_data_info(str(directory), {"mean": [0.5]})
    return directory / "data_info.json"


def _write_text(directory):
    files.write_text_atomically(str(directory / "notes.txt"), "train: {}\n")
    return directory / "notes.txt"


# The run's own files through their own writers, and the writer they share.
@pytest.mark.parametrize("write", [_write_run_config, _write_data_info, _write_text])
def test_a_file_written_whole_is_synced_before_its_rename_and_its_directory_after(
    tmp_path, monkeypatch, write
):
    events = Events(monkeypatch)
    path = write(tmp_path)
    temporary = f"{path}.{os.getpid()}.tmp"
    assert path.read_text()
    rename = events.index("replace", str(path))
    # The content is on disk before the new name replaces the old file...
    assert [kind for kind, p in events.log[:rename] if p == temporary] == ["fsync"]
    # ...and the new name is on disk after.
    assert events.index("fsync", str(tmp_path)) > rename


def test_a_killed_writers_temporary_file_is_removed_and_a_running_ones_kept(tmp_path):
    path = tmp_path / "data_info.json"
    killed = tmp_path / f"data_info.json.{dead_pid()}.tmp"
    running = tmp_path / f"data_info.json.{os.getppid()}.tmp"  # Our parent runs.
    other = tmp_path / "data_info.json.x.tmp"  # Not a writer's name.
    for leftover in (killed, running, other):
        leftover.write_bytes(b"\0" * 1000)
    files.write_text_atomically(str(path), "{}")
    assert not killed.exists()
    assert running.exists() and other.exists()
    assert json.loads(path.read_text()) == {}


def small_checkpoint(directory, chief=True, keep=1):
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4)])
    return checkpoint.RunCheckpoint(str(directory), chief=chief, max_to_keep=keep, model=model)


def checkpoint_paths(directory, step):
    prefix = os.path.join(directory, run_dir.checkpoint_name(step))
    return [prefix + ".index", prefix + ".data-00000-of-00001"]


def test_a_checkpoint_is_on_disk_before_the_one_it_rotates_out_is_deleted(tmp_path, monkeypatch):
    saved = small_checkpoint(tmp_path, keep=1)
    saved.save(1)
    older = checkpoint_paths(str(tmp_path), 1)
    still_there = []

    def at_sync(_):
        still_there.append(all(map(os.path.exists, older)))

    events = Events(monkeypatch, at_sync=at_sync)
    saved.save(2)
    newer = checkpoint_paths(str(tmp_path), 2)
    assert set(newer) | {str(tmp_path)} <= events.synced()
    # Every sync of the new checkpoint happened while the old one was still on disk...
    last_sync = events.index("fsync", str(tmp_path))
    assert all(still_there[: last_sync + 1])
    # ...and rotation (keep 1) removed it afterwards.
    assert not any(map(os.path.exists, older))
    assert [step for step, _ in checkpoint.list_checkpoints(str(tmp_path))] == [2]


def test_a_worker_scratch_checkpoint_is_not_synced(tmp_path, monkeypatch):
    scratch = small_checkpoint(tmp_path, chief=False)
    events = Events(monkeypatch)
    scratch.save(1)
    assert not events.synced() & set(checkpoint_paths(scratch.save_dir, 1))
    scratch.close()


def test_the_best_checkpoint_is_on_disk_before_it_replaces_the_old_best(tmp_path, monkeypatch):
    saved = small_checkpoint(tmp_path, keep=2)
    saved.save(1)
    checkpoint.keep_best(str(tmp_path), 1, {"metric": "top1", "value": 0.5})
    saved.save(2)
    events = Events(monkeypatch)
    best = checkpoint.keep_best(str(tmp_path), 2, {"metric": "top1", "value": 0.6})
    staged, _ = files.swap_directories(run_dir.best_dir(str(tmp_path)))
    swap = events.index("replace", run_dir.best_dir(str(tmp_path)))
    for name in os.listdir(run_dir.best_dir(str(tmp_path))):
        assert events.index("fsync", os.path.join(staged, name)) < swap
    assert events.index("fsync", staged) < swap < events.index("fsync", str(tmp_path))
    assert checkpoint.find_best(str(tmp_path)) == (2, best)


def test_leftovers_of_killed_saves_are_removed_when_the_chief_starts(tmp_path):
    small_checkpoint(tmp_path, keep=3).save(1)
    leftovers = [
        tmp_path / "ckpt-2_temp",  # TensorFlow's shards, before the merge.
        tmp_path / "ckpt-2.index.tempstate8123456789",
        tmp_path / "checkpoint.tmp0a1b2c3d",
    ]
    leftovers[0].mkdir()
    (leftovers[0] / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 100)
    for path in leftovers[1:]:
        path.write_bytes(b"x")
    small_checkpoint(tmp_path, chief=False)  # A worker leaves the chief's directory alone.
    assert all(path.exists() for path in leftovers)
    small_checkpoint(tmp_path, keep=3)
    assert not any(path.exists() for path in leftovers)
    assert [step for step, _ in checkpoint.list_checkpoints(str(tmp_path))] == [1]
    assert checkpoint.unreadable(str(tmp_path / "ckpt-1")) is None


class StubServed:
    """What `savedmodel.save` asks of a serving model, without a network."""

    class_names = ["a", "b"]
    top_k = 2

    def signatures(self):
        return {}


def fake_saved_model(served, directory, signatures):
    del served, signatures
    os.makedirs(os.path.join(directory, "variables"))
    with open(os.path.join(directory, "saved_model.pb"), "wb") as f:
        f.write(b"\0" * 64)
    with open(os.path.join(directory, "variables", "variables.index"), "wb") as f:
        f.write(b"\0" * 16)


def test_an_export_is_on_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    monkeypatch.setattr(tf.saved_model, "save", fake_saved_model)
    export_dir = str(tmp_path / "export")
    savedmodel.save(StubServed(), {"model_dir": "run"}, export_dir)
    events = Events(monkeypatch)
    savedmodel.save(StubServed(), {"model_dir": "run2"}, export_dir, overwrite=True)
    staged = f"{export_dir}.partial-{os.getpid()}"
    aside = events.index("replace", f"{export_dir}.replaced-{os.getpid()}")
    for name in ("saved_model.pb", "variables/variables.index", "assets.extra/labels.txt"):
        assert events.index("fsync", os.path.join(staged, name)) < aside
    for directory in (staged, os.path.join(staged, "variables")):
        assert events.index("fsync", directory) < aside
    assert events.index("fsync", str(tmp_path)) > events.index("replace", export_dir)
    info = json.loads((tmp_path / "export" / "assets.extra" / "export_info.json").read_text())
    assert info["model_dir"] == "run2"


def test_an_export_killed_between_its_renames_is_put_back_at_the_next_export(tmp_path, monkeypatch):
    monkeypatch.setattr(tf.saved_model, "save", fake_saved_model)
    export_dir = tmp_path / "export"
    savedmodel.save(StubServed(), {"model_dir": "old"}, str(export_dir))
    # Killed after the old export stepped aside, before the new one came in:
    killed = dead_pid()
    export_dir.rename(tmp_path / f"export.replaced-{killed}")
    (tmp_path / f"export.partial-{killed}").mkdir()
    running = tmp_path / f"export.partial-{os.getppid()}"  # Another export, still going.
    running.mkdir()
    with pytest.raises(savedmodel.ConfigError, match="holds an export; add --overwrite"):
        savedmodel.check_destination(str(export_dir), overwrite=False)
    info = json.loads((export_dir / "assets.extra" / "export_info.json").read_text())
    assert info["model_dir"] == "old"
    assert sorted(os.listdir(tmp_path)) == ["export", running.name]


def test_sync_tree_reaches_every_file_and_directory(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.bin").write_bytes(np.arange(10, dtype=np.uint8).tobytes())
    (tmp_path / "y.txt").write_text("y")
    events = Events(monkeypatch)
    files.sync_tree(str(tmp_path))
    expected = {str(tmp_path / p) for p in ("a", "a/b", "a/b/x.bin", "y.txt")} | {str(tmp_path)}
    assert events.synced() == expected
    # A directory after what it holds.
    assert events.index("fsync", str(tmp_path / "a" / "b" / "x.bin")) < events.index(
        "fsync", str(tmp_path / "a" / "b")
    )


def test_reading_a_cache_removes_what_a_killed_rebuild_left(tmp_path):
    path = tmp_path / "shapes_train.npz"
    np.savez(path, x=np.arange(3))
    killed = tmp_path / f"shapes_train.npz.{dead_pid()}.tmp"
    killed.write_bytes(b"\0" * 4096)  # Half a rebuild (150 MB for shapes' training split).
    assert files.read_cache(str(path), lambda cached: cached["x"].tolist()) == [0, 1, 2]
    assert not killed.exists()
