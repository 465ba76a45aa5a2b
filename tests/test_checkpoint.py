"""Runs that survive interruption: SIGKILL, SIGTERM, corrupt checkpoints, NaN, changed settings.

The interrupted runs are real processes. SIGKILL lands at an exact step: the
test's driver gives the trainer one more action, which kills its own process
at the end of that step (no checkpoint step), as a power cut would.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from resnet_app.common import checkpoint, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.engine import loop
from resnet_app.engine.actions import Action
from tests import runs
from tests.commands import REPO, error_line, run_code, run_command
from tests.runs import read_records, saved_tensors

# Tiny network, 64 training images: 4 steps of 16 per epoch.
SMALL = [
    "--model=tiny",
    "--batch_size=16",
    "--set=data.train_examples=64",
    "--set=data.eval_examples=20",
    "--eval_every=100",
    "--steps_per_loop=1",
    "--log_every=1",
]
STEPS_PER_EPOCH = 4

# Runs resnet_app.train with argv[3:], killing itself with SIGKILL right
# after step argv[1] (0: never). With argv[2] a path, every step's example ids
# are appended to it as "<step> <id> <id> ...", written by the step itself.
DRIVER = """
import functools, os, signal, sys
import tensorflow as tf
from resnet_app.common import cli
from resnet_app.engine import step
from resnet_app import train
from resnet_app.engine import loop
from resnet_app.engine.actions import Action

kill_at, ids_path = int(sys.argv[1]), sys.argv[2]


class KillAt(Action):
    def __call__(self, boundary):
        if kill_at and boundary.step >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


loop.train = functools.partial(loop.train, actions=[KillAt()])
if ids_path != "-":
    replica_step = step.TrainStep.replica_step

    def recording_step(self, batch):
        sums = replica_step(self, batch)
        with tf.control_dependencies([sums]):
            done = tf.print(self.optimizer.iterations, batch["id"], summarize=-1,
                            output_stream="file://" + ids_path)
        with tf.control_dependencies([done]):
            return tf.identity(sums)

    step.TrainStep.replica_step = recording_step
sys.argv = ["train", *sys.argv[3:]]
cli.run(train.main)
"""


def drive(*args, kill_at=0, ids="-"):
    return run_code(DRIVER, str(kill_at), str(ids), *args)


def consumed_ids(path):
    """{step: ids} from a recording; a step run twice (redone after a kill) keeps its last."""
    steps = {}
    for line in path.read_text().replace("\n ", " ").splitlines():
        step, ids = line.split(" ", 1)
        steps[int(step)] = [int(i) for i in ids.strip("[] ").split()]
    return steps


def kill_and_resume(tmp_path, args, kill_at, last_step=14, saved=5):
    """Runs `args` whole and killed after step `kill_at`, then resumed; returns
    (the resumed run's stderr, both final checkpoints' tensors), asserting that
    the killed run left only the checkpoint of step `saved` and every tensor
    of the resumed run equals the uninterrupted one's, bit for bit."""
    whole = drive(*args, f"--model_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    killed = drive(*args, f"--model_dir={tmp_path / 'run'}", kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "run"))] == [saved]
    resumed = drive(*args, f"--model_dir={tmp_path / 'run'}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = runs.assert_same_checkpoints(
        tmp_path / "whole" / f"ckpt-{last_step}",
        tmp_path / "run" / f"ckpt-{last_step}",
        f"(killed at {kill_at})",
    )
    return resumed.stderr, expected


def test_sigkill_between_checkpoints_then_resume_is_bitwise_identical(tmp_path):
    """Killed at a random step between the checkpoints of steps 5 and 10 (mid-epoch), rerun:
    every saved tensor at the end equals the uninterrupted run's, bit for bit."""
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", "--train_steps=14", "--deterministic"]
    args += ["--set=train.checkpoint_every=5"]
    stderr, tensors = kill_and_resume(tmp_path, args, runs.fault_rng().randint(6, 9))
    assert "Resumed from step 5 (epoch 1, example 16 of 64)" in stderr
    assert any("moving_variance" in name for name in tensors)
    assert any(name.startswith("optimizer/_variables/") for name in tensors)  # Slots.


def test_data_order_is_exact_across_a_kill_without_determinism(tmp_path):
    """Every epoch consumes each of the 64 examples exactly once, across a kill at step 7."""
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", "--train_steps=14"]
    args += ["--set=train.checkpoint_every=5", f"--model_dir={tmp_path / 'run'}"]
    ids = tmp_path / "ids.txt"
    killed = drive(*args, kill_at=7, ids=ids)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    before_kill = consumed_ids(ids)
    assert sorted(before_kill) == list(range(1, 8))
    resumed = drive(*args, ids=ids)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = consumed_ids(ids)
    assert sorted(steps) == list(range(1, 15))
    # Steps 6 and 7 ran twice (after the checkpoint of step 5) on the same examples.
    assert steps[6] == before_kill[6] and steps[7] == before_kill[7]
    stream = [i for s in sorted(steps) for i in steps[s]]
    assert all(len(steps[s]) == 16 for s in steps)
    for epoch in range(3):
        seen = stream[epoch * 64 : (epoch + 1) * 64]
        assert sorted(seen) == list(range(64)), f"epoch {epoch}"
    assert len(set(stream[192:])) == 32  # Epoch 3 so far: no repeats.
    assert stream[:64] != stream[64:128]  # Reshuffled each epoch.


def wait_for_step(model_dir, process, at_least=1, timeout=120):
    deadline = time.monotonic() + timeout
    path = os.path.join(model_dir, "metrics.jsonl")
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended early"
        if os.path.exists(path) and any(
            r.get("step", 0) >= at_least and "accuracy" in r for r in read_records(model_dir)
        ):
            return
        time.sleep(0.05)
    raise AssertionError("no training record in time")


def test_sigterm_saves_a_checkpoint_and_exits_0_then_resumes(tmp_path):
    model_dir = tmp_path / "run"
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", f"--model_dir={model_dir}"]
    process = subprocess.Popen(
        [sys.executable, "-m", "resnet_app.train", *args, "--train_steps=100000"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO},
    )
    wait_for_step(model_dir, process, at_least=3)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-3000:]
    stopped = [r for r in read_records(model_dir) if r.get("event") == "stopped"]
    assert len(stopped) == 1 and stopped[0]["signal"] == "SIGTERM"
    step = stopped[0]["step"]
    assert f"Stopped by SIGTERM at step {step} of 100000" in stderr
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [step]
    # The last logged step is the step saved: nothing trained after the save.
    assert max(r["step"] for r in read_records(model_dir) if "accuracy" in r) == step

    resumed = run_command("resnet_app.train", *args, f"--train_steps={step + 2}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resumed from step {step} " in resumed.stderr
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))][-1] == step + 2


STOP_TWICE = """
import os, signal, threading, time
import tensorflow as tf
from resnet_app.engine.preemption import StopRequest

with StopRequest() as stop:
    @tf.function
    def stubborn():  # A long compiled call that ignores the stop flag.
        i = tf.constant(0)
        while i < 2_000_000_000:
            i += 1
        return i
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    stubborn()
print("not reached")
"""


def test_a_second_interrupt_exits_at_once_even_inside_a_compiled_call(tmp_path):
    script = tmp_path / "stop_twice.py"  # A file: autograph reads the function's source.
    script.write_text(STOP_TWICE)
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO},
    )
    assert result.returncode == 128 + signal.SIGINT, result.stderr[-2000:]
    assert "SIGINT: stopping after the step in progress" in result.stderr
    assert "Second SIGINT: exiting now, without a checkpoint" in result.stderr
    assert "not reached" not in result.stdout


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    model_dir = tmp_path / "run"
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", f"--model_dir={model_dir}"]
    first = run_command(
        "resnet_app.train", *args, "--train_steps=4", "--set=train.checkpoint_every=2"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    (data_file,) = model_dir.glob("ckpt-4.data-*")
    data_file.write_bytes(data_file.read_bytes()[: data_file.stat().st_size // 2])
    # --model_dir alone: the run's own settings (4 steps), from the newest readable step.
    resumed = run_command("resnet_app.train", f"--model_dir={model_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Checkpoint {model_dir}/ckpt-4 is unreadable" in resumed.stderr
    assert "Resumed from step 2 " in resumed.stderr
    assert checkpoint.unreadable(str(model_dir / "ckpt-4")) is None  # Written again.

    for _, prefix in checkpoint.list_checkpoints(str(model_dir)):
        with open(prefix + ".index", "wb") as f:
            f.write(b"garbage")
    line = error_line(run_command("resnet_app.train", f"--model_dir={model_dir}"))
    assert "none of the 2 checkpoints" in line and "--restart" in line


def test_find_latest_ignores_the_pointer_file_and_a_save_cut_short(tmp_path):
    variable = tf.Variable([1.0, 2.0])
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(v=variable), str(tmp_path), 5, checkpoint_name="ckpt"
    )
    manager.save(checkpoint_number=3)
    # A save of step 6 that died before its index was written, and a garbled pointer.
    (tmp_path / "ckpt-6.data-00000-of-00001").write_bytes(b"\0" * 10)
    (tmp_path / "checkpoint").write_text("garbage {")
    assert checkpoint.find_latest(str(tmp_path)) == (3, str(tmp_path / "ckpt-3"))
    assert checkpoint.find_latest(str(tmp_path / "empty")) is None


def small_config(tmp_path, *sets, **train):
    """`runs.small_config`, evaluating only at the end."""
    return runs.small_config(tmp_path, "train.eval_every=100", *sets, **train)


def test_nan_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    model_dir = tmp_path / "run"
    # Step 6 runs at a learning rate of 1e38: its update overflows the weights.
    sets = ["--set=schedule.boundaries=[5]", "--set=schedule.values=[0.1, 1e38]"]
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", f"--model_dir={model_dir}", *sets]
    line = error_line(
        run_command("resnet_app.train", *args, "--train_steps=10", "--set=train.checkpoint_every=4")
    )
    step = int(line.split("not finite at step ")[1].split(";")[0])
    assert step in (6, 7), line
    assert f"the last good checkpoint is {model_dir}/ckpt-4" in line
    assert "rerun with --on_nan=rollback" in line
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [4]
    for name, value in saved_tensors(model_dir / "ckpt-4").items():
        if (
            getattr(value, "dtype", None) is not None
            and value.dtype.kind == "f"
            and "lr_value" not in name
        ):
            assert np.all(np.isfinite(value)), name


def test_nan_rollback_lowers_the_learning_rate_and_goes_on(tmp_path):
    sets = ["schedule.boundaries=[5]", "schedule.values=[0.1, 1e38]", "train.log_every=1"]
    sets += ["train.on_nan=rollback", "train.nan_lr_factor=1e-39", "train.checkpoint_every=4"]
    model_dir = tmp_path / "run"
    result = loop.train_and_evaluate(small_config(tmp_path, *sets, train_steps=8), str(model_dir))
    assert all(np.all(np.isfinite(w)) for w in result.model.get_weights())
    records = read_records(model_dir)
    rollbacks = [r for r in records if r.get("event") == "rollback"]
    assert [r["to_step"] for r in rollbacks] == [4]
    assert rollbacks[0]["lr_scale"] == pytest.approx(1e-39)
    # After the rollback, steps 5.. run again at 1e-39 x the schedule.
    rates = {r["step"]: r["learning_rate"] for r in records if "accuracy" in r}
    assert rates[5] == pytest.approx(0.1 * 1e-39, rel=1e-6)
    assert rates[8] == pytest.approx(1e38 * 1e-39, rel=1e-6)


def test_resume_guard_refuses_a_changed_batch_and_records_harmless_changes(tmp_path):
    model_dir = str(tmp_path / "run")
    loop.train_and_evaluate(small_config(tmp_path, train_steps=2), model_dir)
    with pytest.raises(ConfigError, match=r"settings differ .*train.batch_size 16 -> 32"):
        loop.train_and_evaluate(
            small_config(tmp_path, "train.batch_size=32", train_steps=4), model_dir
        )
    # Allowed: the data stream goes on from the examples already consumed.
    loop.train_and_evaluate(
        small_config(tmp_path, "train.batch_size=32", train_steps=3),
        model_dir,
        allow_config_change=True,
    )
    # A longer run and another log interval change nothing already computed.
    loop.train_and_evaluate(
        small_config(tmp_path, "train.batch_size=32", "train.log_every=2", train_steps=5), model_dir
    )
    changes = [r["changes"] for r in read_records(model_dir) if r.get("event") == "config_change"]
    assert changes == [
        # The default's drops stay at 1/2 and 3/4 of the 2 steps the run had.
        {
            "schedule.total_steps": [None, 2],
            "train.batch_size": [16, 32],
            "train.train_steps": [2, 3],
        },
        {"train.log_every": [100, 2], "train.train_steps": [3, 5]},
    ]


def test_resume_guard_refuses_a_run_length_that_moves_a_cosine_schedule(tmp_path):
    model_dir = str(tmp_path / "run")
    loop.train_and_evaluate(
        small_config(tmp_path, "schedule.name=cosine", train_steps=2), model_dir
    )
    with pytest.raises(
        ConfigError, match=r"learning rate at step \d+ .* depends on the run's length"
    ):
        loop.train_and_evaluate(
            small_config(tmp_path, "schedule.name=cosine", train_steps=8), model_dir
        )


def test_a_change_of_towers_with_per_tower_batch_norm_is_refused(tmp_path):
    model_dir = str(tmp_path / "run")
    loop.train_and_evaluate(small_config(tmp_path, train_steps=1, num_towers=2), model_dir)
    with pytest.raises(
        ConfigError, match=r"replicas 2 -> 1 \(each BatchNorm normalizes over 8 -> 16"
    ):
        loop.train_and_evaluate(small_config(tmp_path, train_steps=2, num_towers=1), model_dir)
    loop.train_and_evaluate(
        small_config(tmp_path, train_steps=2, num_towers=1), model_dir, allow_config_change=True
    )
    # The run is now a one-tower run: going on with one tower needs no permission.
    loop.train_and_evaluate(small_config(tmp_path, train_steps=3, num_towers=1), model_dir)


def test_restart_moves_the_old_run_aside_and_keep_checkpoints(tmp_path):
    model_dir = tmp_path / "run"
    loop.train_and_evaluate(
        small_config(
            tmp_path, "train.checkpoint_every=1", "train.keep_checkpoints=2", train_steps=4
        ),
        str(model_dir),
    )
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [3, 4]
    loop.train_and_evaluate(
        small_config(tmp_path, "train.batch_size=32", train_steps=1), str(model_dir), restart=True
    )
    (aside,) = model_dir.glob("previous-*")
    assert [s for s, _ in checkpoint.list_checkpoints(str(aside))] == [3, 4]
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [1]
    first = read_records(model_dir)[0]
    assert {k: first[k] for k in ("step", "event", "total_steps")} == {
        "step": 0,
        "event": "start",
        "total_steps": 1,
    }
    assert first["time"] > 0  # When the loop started (time_to_accuracy reads it).


def test_rerun_after_nan_with_rollback_and_the_runs_own_settings(tmp_path):
    """The error's advice: --model_dir with --on_nan=rollback resumes the same run."""
    model_dir = tmp_path / "run"
    sets = ["--set=schedule.boundaries=[5]", "--set=schedule.values=[0.1, 1e38]"]
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", f"--model_dir={model_dir}", *sets]
    args += ["--train_steps=8", "--set=train.checkpoint_every=4"]
    assert "not finite" in error_line(run_command("resnet_app.train", *args))
    rerun = run_command(
        "resnet_app.train",
        f"--model_dir={model_dir}",
        "--on_nan=rollback",
        "--set=train.nan_lr_factor=1e-39",
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Resumed from step 4 " in rerun.stderr
    assert "ROLLBACK 1/3: the loss is not finite" in rerun.stderr
    changes = [r["changes"] for r in read_records(model_dir) if r.get("event") == "config_change"]
    assert changes == [{"train.nan_lr_factor": [0.5, 1e-39], "train.on_nan": ["stop", "rollback"]}]
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))][-1] == 8


class SignalAfterEvaluation(Action):
    """SIGTERM, as a cluster would send it, once a step has been evaluated and saved.

    (The loop reads the stop request only between compiled calls, so this is
    what a signal in the middle of the evaluation looks like to it.)
    """

    def __call__(self, boundary):
        if boundary.evaluation is not None:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # The watcher thread sets the flag.


def test_a_stop_during_evaluation_saves_once_and_evaluates_once(tmp_path):
    model_dir = tmp_path / "run"
    result = loop.train_and_evaluate(
        small_config(tmp_path, "train.eval_every=4", "train.log_every=1", train_steps=12),
        str(model_dir),
        actions=[SignalAfterEvaluation()],
    )
    assert result.stopped == "SIGTERM"
    records = read_records(model_dir)
    assert [r["step"] for r in records if "top1" in r] == [4]
    assert [r["step"] for r in records if "accuracy" in r] == [1, 2, 3, 4]
    assert [r for r in records if r.get("event") == "stopped"] == [
        {"step": 4, "event": "stopped", "signal": "SIGTERM"}
    ]
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [4]
    # The handlers are restored (a SIGTERM now would end pytest, so none is sent).
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_the_stop_watcher_leaves_no_open_file():
    from resnet_app.engine.preemption import StopRequest

    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        with StopRequest():
            pass
    assert len(os.listdir("/proc/self/fd")) == before


def test_restart_refuses_a_directory_that_is_not_a_run(tmp_path):
    (tmp_path / "setup.py").write_text("")
    with pytest.raises(ConfigError, match="is not a run directory"):
        run_dir.move_aside(str(tmp_path))
    assert (tmp_path / "setup.py").exists()


def test_keep_one_checkpoint_per_n_hours(tmp_path):
    # Every save comes more than 1e-7 hours after the previous one: all are kept.
    loop.train_and_evaluate(
        small_config(
            tmp_path,
            "train.checkpoint_every=1",
            "train.keep_checkpoints=1",
            "train.keep_checkpoint_every_n_hours=1e-7",
            train_steps=3,
        ),
        str(tmp_path / "run"),
    )
    assert [s for s, _ in checkpoint.list_checkpoints(str(tmp_path / "run"))] == [1, 2, 3]
