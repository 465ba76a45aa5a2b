"""`evaluate --watch`: each checkpoint evaluated once, as `evaluate --checkpoint=N` does.

The reference for every number is `evaluate_checkpoints` run afterwards on the
same checkpoints (itself checked against plain model calls and NumPy in
test_evaluate_cli.py), and the trainer's own evaluation of the last step.
"""

import json
import logging
import os
import shutil

import numpy as np
import pytest

from resnet_app.common import checkpoint, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.evaluation import checkpoint_eval, watch
from tests.commands import error_line, run_command, start_command
from tests.runs import read_records

# The numbers a watcher's record must share with `evaluate`'s.
NUMBERS = ("step", "split", "top1", "top5", "loss", "num_examples", "ece", "nll", "weights")


def numbers(record):
    return {key: record[key] for key in NUMBERS}


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    """A copy of the shared tiny run (checkpoints at steps 2 and 4, ended at 4)."""
    _, model_dir = tiny_run
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    return copy


def test_each_checkpoint_once_as_evaluate_does_and_a_rotated_one_skipped(
    run_copy, monkeypatch, caplog
):
    listed = checkpoint.list_checkpoints
    gone = str(run_copy / "ckpt-3")  # Listed, then removed by rotation before it was read.
    monkeypatch.setattr(checkpoint, "list_checkpoints", lambda d: sorted([*listed(d), (3, gone)]))
    shown = []
    with caplog.at_level(logging.WARNING, logger="absl"):
        records = watch.watch_run(str(run_copy), poll_seconds=0.01, on_record=shown.append)
    assert (
        [r["checkpoint"] for r in records]
        == ["ckpt-2", "ckpt-4"]
        == [r["checkpoint"] for r in shown]
    )
    skipped = [r.getMessage() for r in caplog.records if "ckpt-3" in r.getMessage()]
    assert len(skipped) == 1 and "removed" in skipped[0], skipped
    monkeypatch.setattr(checkpoint, "list_checkpoints", listed)

    expected = checkpoint_eval.evaluate_checkpoints(str(run_copy), "all")
    assert [numbers(r) for r in records] == [numbers(r) for r in expected]
    written = [r for r in read_records(run_copy) if r.get("watch")]
    assert [numbers(r) for r in written] == [numbers(r) for r in expected]
    assert all(r["event"] == "evaluation" for r in written)
    # TensorBoard: the watcher's scalars under their steps, beside the trainer's eval/.
    expected_scalars = [(r["step"], float(np.float32(r["top1"]))) for r in records]
    assert _scalars(run_copy / watch.EVENTS_DIR, "top1") == expected_scalars

    # Restarted, it evaluates nothing again and stops: the run has ended.
    assert watch.watch_run(str(run_copy), poll_seconds=0.01) == []
    assert len([r for r in read_records(run_copy) if r.get("watch")]) == 2


def _scalars(folder, tag):
    """(step, value) of a tag in a TensorBoard directory's event files."""
    import tensorflow as tf

    found = []
    for name in sorted(os.listdir(folder)):
        for event in tf.compat.v1.train.summary_iterator(str(folder / name)):
            for value in event.summary.value:
                if value.tag == tag:
                    found.append((event.step, float(tf.make_ndarray(value.tensor))))
    return found


def test_a_run_that_has_not_ended_is_followed_until_the_timeout(run_copy, caplog):
    # The trainer was stopped (no "end" after the last "start"): the watcher waits.
    with open(run_copy / run_dir.METRICS_FILE, "a") as f:
        f.write(json.dumps({"step": 4, "event": "start", "total_steps": 8}) + "\n")
        f.write('{"step": 5, "loss": 1.')  # A line the trainer is still writing.
    with caplog.at_level(logging.WARNING, logger="absl"):
        records = watch.watch_run(str(run_copy), poll_seconds=0.01, timeout=0.5)
    assert [r["checkpoint"] for r in records] == ["ckpt-2", "ckpt-4"]
    assert any("--watch_timeout" in r.getMessage() for r in caplog.records)
    # The half-written line is not read as damage.
    assert not any("damaged" in r.getMessage() for r in caplog.records)


def test_an_end_whose_checkpoint_is_not_listed_yet_is_waited_for(run_copy, caplog):
    # A network filesystem's listing lags: "end" at step 6 is read, ckpt-6 not listed yet.
    with open(run_copy / run_dir.METRICS_FILE, "a") as f:
        f.write(json.dumps({"step": 4, "event": "start", "total_steps": 6}) + "\n")
        f.write(json.dumps({"step": 6, "event": "end", "seconds": 1.0}) + "\n")
    with caplog.at_level(logging.INFO, logger="absl"):
        records = watch.watch_run(str(run_copy), poll_seconds=0.01, timeout=0.5)
    assert [r["checkpoint"] for r in records] == ["ckpt-2", "ckpt-4"]
    messages = [r.getMessage() for r in caplog.records]
    assert any("--watch_timeout" in m for m in messages)
    assert not any("The run ended" in m for m in messages)


def test_a_metrics_file_replaced_under_the_watcher_is_one_line(tmp_path):
    log = watch.RunLog(str(tmp_path))
    (tmp_path / run_dir.METRICS_FILE).write_text('{"step": 0, "event": "start"}\n' * 3)
    log.read()
    (tmp_path / run_dir.METRICS_FILE).write_text('{"step": 0, "event": "start"}\n')  # --restart
    with pytest.raises(ConfigError, match="was replaced while being watched .*--restart"):
        log.read()


def test_a_run_that_never_appears_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no run appeared in .* within --watch_timeout=0.1 s"):
        watch.watch_run(str(tmp_path / "nothing"), poll_seconds=0.01, timeout=0.1)


@pytest.mark.parametrize(
    "tf_config",
    [
        {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}},
        {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}},
    ],
)
def test_a_trainers_tf_config_is_refused(tmp_path, monkeypatch, tf_config):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    with pytest.raises(ConfigError, match='--watch runs beside the trainers .*"evaluator"'):
        watch.watch_run(str(tmp_path), timeout=0.1)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--checkpoint=all"], "--watch evaluates every checkpoint as the run saves it: drop"),
        (["--watch_every=0"], "--watch_every=0: give seconds above 0"),
    ],
)
def test_watch_flags_that_cannot_go_together_are_one_line(tmp_path, flags, message):
    result = run_command("resnet_app.evaluate", f"--model_dir={tmp_path}", "--watch", *flags)
    assert result.returncode == 2
    assert error_line(result).startswith(f"error: {message}"), result.stderr[-2000:]


def test_a_watcher_beside_a_training_run_reports_what_evaluate_does_afterwards(tmp_path):
    """Started before the trainer: it waits for the run, follows it, and stops at its end."""
    model_dir, data_dir = tmp_path / "run", tmp_path / "data"
    watcher = start_command(
        "resnet_app.evaluate",
        f"--model_dir={model_dir}",
        "--watch",
        "--watch_every=0.2",
        "--watch_timeout=600",
    )
    trainer = run_command(
        "resnet_app.train",
        "--model=tiny",
        f"--data_dir={data_dir}",
        f"--model_dir={model_dir}",
        "--set=data.train_examples=64",
        "--set=data.eval_examples=37",
        "--batch_size=16",
        "--train_steps=8",
        # The trainer's own evaluation off but at the end; a checkpoint every 2 steps.
        "--set=train.eval_every=1000",
        "--set=train.checkpoint_every=2",
        "--set=train.keep_checkpoints=10",
    )
    assert trainer.returncode == 0, trainer.stderr[-3000:]
    output, errors = watcher.communicate(timeout=600)
    assert watcher.returncode == 0, errors[-3000:]
    shown = [json.loads(line) for line in output.splitlines()]
    assert [r["checkpoint"] for r in shown] == ["ckpt-2", "ckpt-4", "ckpt-6", "ckpt-8"]
    assert "The run ended at step 8" in errors

    expected = checkpoint_eval.evaluate_checkpoints(str(model_dir), "all")
    assert [numbers(r) for r in shown] == [numbers(r) for r in expected]
    # The trainer's own evaluation of step 8: the same numbers.
    (trainers,) = [r for r in read_records(model_dir) if "top1" in r and "event" not in r]
    assert trainers["step"] == 8
    for key in ("top1", "top5", "num_examples"):
        assert trainers[key] == shown[-1][key], key
    np.testing.assert_allclose(trainers["loss"], shown[-1]["loss"], rtol=1e-6)
