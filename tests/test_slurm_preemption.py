"""SLURM preemption: SIGUSR1 saves and exits 3; `scripts/slurm/train.sbatch` requeues on 3.

The trainer test runs a real (tiny) training process and signals it mid-run.
The batch script's tests run it with bash and fake `srun` and `scontrol`
executables first on PATH: no SLURM and no TensorFlow, a second or so each.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from resnet_app.common import checkpoint
from resnet_app.common.errors import RESTART_STATUS
from tests.commands import REPO
from tests.runs import read_records, saved_tensors
from tests.test_checkpoint import SMALL as CHECKPOINT_SMALL
from tests.test_multiworker import _free_ports

SBATCH = os.path.join(REPO, "scripts", "slurm", "train.sbatch")
# Tiny network, 64 training images, 16 per step (tests/test_checkpoint.py's), deterministic.
SMALL = [*CHECKPOINT_SMALL, "--deterministic"]
TOTAL_STEPS = 12

# Runs resnet_app.train with argv[4:]. At the first boundary at or after step
# argv[1] (0: never) it creates the file argv[2] and waits until the test has
# created argv[3] (after sending its signal): the signal comes mid-run however
# fast or slow the steps are.
DRIVER = """
import functools, os, sys, time
from resnet_app import train
from resnet_app.common import cli
from resnet_app.engine import loop
from resnet_app.engine.actions import Action

pause_at, ready, sent = int(sys.argv[1]), sys.argv[2], sys.argv[3]


class PauseAt(Action):
    def __call__(self, boundary):
        if pause_at and boundary.step >= pause_at and not os.path.exists(ready):
            open(ready, "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(sent) and time.monotonic() < deadline:
                time.sleep(0.01)


loop.train = functools.partial(loop.train, actions=[PauseAt()])
sys.argv = ["train", *sys.argv[4:]]
cli.run(train.main)
"""


def start_driver(tmp_path, *args, pause_at=0, env=None):
    """The driver in a process of its own (the test signals it): a `subprocess.Popen`."""
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(pause_at), *_handshake(tmp_path), *args],
        cwd=REPO,
        env=_environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _environment(env=None):
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO, **(env or {})}


def _handshake(tmp_path):
    return str(tmp_path / "ready"), str(tmp_path / "sent")


def wait_for_file(path, process, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the run ended early: " + process.communicate()[1][-3000:]
        if os.path.exists(path):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {path} in time")


def finish(process, timeout=300):
    _, stderr = process.communicate(timeout=timeout)
    return process.returncode, stderr


def test_sigusr1_saves_exits_3_and_the_requeued_run_resumes_bitwise(tmp_path):
    """SIGUSR1 mid-run: a checkpoint of the step it stopped at, exit status 3 and one
    line; the same command then resumes, and the end equals an uninterrupted run's."""
    args = [*SMALL, f"--data_dir={tmp_path / 'data'}", f"--train_steps={TOTAL_STEPS}"]
    status, stderr = finish(start_driver(tmp_path, *args, f"--model_dir={tmp_path / 'whole'}"))
    assert status == 0, stderr[-3000:]

    model_dir = tmp_path / "run"
    command = [*args, f"--model_dir={model_dir}"]
    process = start_driver(tmp_path, *command, pause_at=3)
    ready, sent = _handshake(tmp_path)
    wait_for_file(ready, process)
    process.send_signal(signal.SIGUSR1)
    open(sent, "w").close()
    status, stderr = finish(process)
    assert status == RESTART_STATUS, stderr[-3000:]
    assert "Traceback" not in stderr
    stopped = [r for r in read_records(model_dir) if r.get("event") == "stopped"]
    assert len(stopped) == 1 and stopped[0]["signal"] == "SIGUSR1", stopped
    step = stopped[0]["step"]
    assert 3 <= step < TOTAL_STEPS
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [step]
    # The last logged step is the step saved: nothing trained after the save.
    assert max(r["step"] for r in read_records(model_dir) if "accuracy" in r) == step
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: preempted (SIGUSR1, the scheduler's notice): saved ckpt-{step} in "
        f"{model_dir}; the job resumes from it when requeued (the same command)"
    ], stderr[-3000:]

    status, stderr = finish(start_driver(tmp_path, *command))  # The requeued job's command.
    assert status == 0, stderr[-3000:]
    assert f"Resumed from step {step} " in stderr
    expected = saved_tensors(tmp_path / "whole" / f"ckpt-{TOTAL_STEPS}")
    actual = saved_tensors(model_dir / f"ckpt-{TOTAL_STEPS}")
    assert set(actual) == set(expected)
    assert any(name.startswith("optimizer/_variables/") for name in expected)  # Slots.
    # How many saves the run made: the stopped run made one more, at the stop.
    assert actual.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE") == 2
    assert expected.pop("save_counter/.ATTRIBUTES/VARIABLE_VALUE") == 1
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=f"{name} (stopped at {step})")


def test_a_notice_to_one_worker_makes_every_worker_save_and_exit_3(tmp_path):
    """Two workers; only worker 0 gets SIGUSR1 (as when srun's copies come apart): they
    stop at the same step, the chief saves it, and both exit 3 with the same line."""
    workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
    model_dir = tmp_path / "run"
    args = [
        *(a for a in SMALL if a != "--deterministic"),
        f"--data_dir={tmp_path / 'data'}",
        f"--model_dir={model_dir}",
    ]
    processes = []
    for index in range(2):
        task = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        processes.append(
            start_driver(
                tmp_path,
                *args,
                f"--train_steps={TOTAL_STEPS}",
                pause_at=3 if index == 0 else 0,
                env={"TF_CONFIG": json.dumps(task)},
            )
        )
    ready, sent = _handshake(tmp_path)
    wait_for_file(ready, processes[0])
    processes[0].send_signal(signal.SIGUSR1)
    open(sent, "w").close()
    results = [finish(process) for process in processes]
    for status, stderr in results:
        assert status == RESTART_STATUS, stderr[-3000:]
    stopped = [r for r in read_records(model_dir) if r.get("event") == "stopped"]
    assert len(stopped) == 1 and stopped[0]["signal"] == "SIGUSR1", stopped  # The chief's.
    step = stopped[0]["step"]
    assert 3 <= step < TOTAL_STEPS
    assert [s for s, _ in checkpoint.list_checkpoints(str(model_dir))] == [step]
    line = (
        f"error: preempted (SIGUSR1, the scheduler's notice): saved ckpt-{step} in "
        f"{model_dir}; the job resumes from it when requeued (the same command)"
    )
    for _, stderr in results:
        assert [x for x in stderr.splitlines() if x.startswith("error: ")] == [line], stderr[-3000:]
    assert "Stopped by a signal on another worker at step" in results[1][1]


# A StopRequest that receives `argv[1:]` (signal names) in turn, each once the last is seen.
SIGNALS = """
import os, signal, sys, time
from resnet_app.engine.preemption import StopRequest

with StopRequest() as stop:
    for name in sys.argv[1:]:
        os.kill(os.getpid(), signal.Signals[name])
        deadline = time.monotonic() + 60
        while not stop.flag.numpy() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # The watcher has read this signal (a later one would come after).
    print(stop.signal_name, stop.preempted, bool(stop.flag.numpy()))
"""


def run_signals(*names):
    return subprocess.run(
        [sys.executable, "-c", SIGNALS, *names],
        cwd=REPO,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_sigusr1_is_a_preemption_notice_and_sigterm_is_not():
    usr1 = run_signals("SIGUSR1", "SIGUSR1")  # A repeated notice changes nothing.
    assert usr1.returncode == 0, usr1.stderr[-2000:]
    assert usr1.stdout.split() == ["SIGUSR1", "True", "True"]
    assert "SIGUSR1: stopping after the step in progress" in usr1.stderr
    assert "then exiting with status 3 to be requeued" in usr1.stderr
    term = run_signals("SIGTERM")
    assert term.stdout.split() == ["SIGTERM", "False", "True"], term.stderr[-2000:]
    # A notice after SIGTERM still asks for the requeue: the job is ending either way.
    both = run_signals("SIGTERM", "SIGUSR1")
    assert both.stdout.split() == ["SIGTERM", "True", "True"], both.stderr[-2000:]
    assert "SIGUSR1 after SIGTERM: a preemption notice; exiting with status 3" in both.stderr


# --- scripts/slurm/train.sbatch, with fake srun and scontrol ---

# Records its arguments and every signal it receives, then ends as FAKE_SRUN_EXIT
# says: a number, or "wait" (until SIGUSR1, then 3, as the trainer would).
FAKE_SRUN = """#!/usr/bin/env bash
log="$FAKE_LOG"
echo "srun $*" >> "$log"
trap 'echo "srun got USR1" >> "$log"; got=1' USR1
trap 'echo "srun got TERM" >> "$log"; exit 143' TERM
if [[ "$FAKE_SRUN_EXIT" == wait ]]; then
  got=0
  touch "$FAKE_READY"
  for _ in $(seq 600); do
    [[ $got == 1 ]] && exit 3
    sleep 0.1
  done
  exit 99
fi
exit "$FAKE_SRUN_EXIT"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
echo "scontrol $*" >> "$FAKE_LOG"
"""


def fake_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return str(bin_dir)


def start_sbatch(tmp_path, srun_exit, *args, **env):
    env = {
        **os.environ,
        "PATH": f"{fake_path(tmp_path)}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path / "log"),
        "FAKE_READY": str(tmp_path / "ready"),
        "FAKE_SRUN_EXIT": str(srun_exit),
        "SLURM_JOB_ID": "4242",
        "RUN_DIR": str(tmp_path / "run"),
        **env,
    }
    return subprocess.Popen(
        ["bash", SBATCH, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def log_lines(tmp_path):
    return (tmp_path / "log").read_text().splitlines()


def test_sbatch_requeues_on_exit_3_with_the_same_command(tmp_path):
    process = start_sbatch(tmp_path, 3, "--config=cifar10_resnet20")
    status, stderr = finish(process, timeout=60)
    assert status == 0, stderr
    assert log_lines(tmp_path) == [
        f"srun resnet-app train --model_dir={tmp_path / 'run'} --config=cifar10_resnet20",
        "scontrol requeue 4242",
    ]


def test_sbatch_does_not_requeue_a_usage_error(tmp_path):
    status, stderr = finish(start_sbatch(tmp_path, 2), timeout=60)
    assert status == 2, stderr
    assert not any(line.startswith("scontrol") for line in log_lines(tmp_path))


def test_sbatch_ends_a_finished_run_without_requeue(tmp_path):
    status, stderr = finish(start_sbatch(tmp_path, 0), timeout=60)
    assert status == 0, stderr
    assert log_lines(tmp_path) == [f"srun resnet-app train --model_dir={tmp_path / 'run'}"]


def test_sbatch_forwards_usr1_to_srun_and_requeues(tmp_path):
    process = start_sbatch(tmp_path, "wait")
    wait_for_file(tmp_path / "ready", process, timeout=60)
    process.send_signal(signal.SIGUSR1)  # What --signal=B:USR1@120 sends the batch shell.
    status, stderr = finish(process, timeout=60)
    assert status == 0, stderr
    assert log_lines(tmp_path)[1:] == ["srun got USR1", "scontrol requeue 4242"], stderr


def test_sbatch_takes_the_run_directory_first_and_refuses_none(tmp_path):
    env = {"RUN_DIR": ""}
    process = start_sbatch(tmp_path, 0, str(tmp_path / "other"), "--train_steps=5", **env)
    status, stderr = finish(process, timeout=60)
    assert status == 0, stderr
    assert log_lines(tmp_path) == [
        f"srun resnet-app train --model_dir={tmp_path / 'other'} --train_steps=5"
    ]
    status, stderr = finish(start_sbatch(tmp_path, 0, "--train_steps=5", **env), timeout=60)
    assert status == 2
    assert stderr.startswith("error: no run directory")
