"""Faults of a 2-worker job on 127.0.0.1, through `python -m resnet_app.launch`.

A worker killed (SIGKILL) at a random moment between checkpoints costs no
completed step: the survivor saves the last one, and the relaunched pair ends
bitwise where an uninterrupted pair ends (`--deterministic`), whether the
chief or the other worker was killed. A stalled worker (SIGSTOP) is found
within `sync.timeout`. The launcher restarts the group, gives up after
`--max_restarts`, and never restarts a usage error.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.commands import REPO, error_line, run_command
from tests.runs import fault_rng, read_records, saved_tensors

STEPS = 40
CHECKPOINT_EVERY = 20
TRAIN = [
    "--dataset=shapes",
    "--model=tiny",
    "--batch_size=16",
    f"--train_steps={STEPS}",
    "--log_every=2",
    f"--eval_every={STEPS}",
    "--deterministic",
    "--set=data.train_examples=64",
    "--set=data.eval_examples=21",
    "--set=model.bn_synchronized=true",
    f"--set=train.checkpoint_every={CHECKPOINT_EVERY}",
]
# What the copy of a checkpoint holds that is bookkeeping, not the run's state.
BOOKKEEPING = ("save_counter", "_CHECKPOINTABLE_OBJECT_GRAPH")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def start(model_dir, data_dir, *launch_flags, extra=()):
    """The launcher on 2 workers, in the background."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resnet_app.launch",
            "--workers=2",
            *launch_flags,
            "--",
            *TRAIN,
            f"--set=data.data_dir={data_dir}",
            f"--model_dir={model_dir}",
            *extra,
        ],
        cwd=REPO,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process, timeout=400):
    output, errors = process.communicate(timeout=timeout)
    return process.returncode, errors


def worker_pid(launcher, index):
    """The pid of the launcher's worker `index` (read from each child's TF_CONFIG)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            if parent != launcher.pid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = dict(
                    item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item
                )
        except OSError:
            continue
        if json.loads(environ[b"TF_CONFIG"])["task"]["index"] == index:
            return int(name)
    raise AssertionError(f"no worker {index} under the launcher")


def wait_for_step(model_dir, step, launcher, timeout=300):
    """Waits until the chief recorded training at `step` or later; returns that step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert launcher.poll() is None, "the launcher ended early"
        path = model_dir / "metrics.jsonl"
        if path.exists():
            steps = [r["step"] for r in read_records(model_dir) if "loss" in r]
            if steps and max(steps) >= step:
                return max(steps)
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached")


def run_state(model_dir):
    """The final checkpoint's tensors, but for bookkeeping."""
    tensors = saved_tensors(model_dir / f"ckpt-{STEPS}")
    return {k: v for k, v in tensors.items() if not k.startswith(BOOKKEEPING)}


def assert_bitwise_equal(got, expected):
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        value = np.asarray(value)
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    """The final state of the same pair, never interrupted."""
    model_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    status, errors = finish(start(model_dir, data_dir))
    assert status == 0, errors[-3000:]
    return run_state(model_dir)


def kill_between_checkpoints(launcher, model_dir, victim, number=signal.SIGKILL):
    """Signals worker `victim` at a random moment after a random step between checkpoints.

    Returns:
      The last step the chief had recorded before the signal.
    """
    rng = fault_rng()
    recorded = wait_for_step(model_dir, rng.randint(CHECKPOINT_EVERY + 1, STEPS - 10), launcher)
    time.sleep(rng.uniform(0, 0.3))  # Most likely inside a step, in a collective.
    recorded = max(r["step"] for r in read_records(model_dir) if "loss" in r)
    os.kill(worker_pid(launcher, victim), number)
    return recorded


def saved_step(line, survivor):
    """The step a survivor's one line says it saved."""
    match = re.search(rf"at step (\d+); (this worker|worker {survivor}) saved ckpt-(\d+) in ", line)
    assert match and match[1] == match[3], line
    return int(match[1])


def test_a_killed_worker_costs_no_step_and_the_launcher_resumes_bitwise(
    tmp_path, data_dir, uninterrupted
):
    model_dir = tmp_path / "run"
    launcher = start(model_dir, data_dir)
    recorded = kill_between_checkpoints(launcher, model_dir, victim=1)
    status, errors = finish(launcher)
    assert status == 0, errors[-3000:]
    (lost,) = [line for line in errors.splitlines() if line.startswith("error: ")]
    assert lost.startswith("error: worker 1 (127.0.0.1:"), lost
    assert " of 2 was lost (" in lost and "restart every worker with the same command" in lost
    step = saved_step(lost, survivor=0)
    # Nothing the chief had recorded is lost, and the save is not a scheduled one.
    assert step > CHECKPOINT_EVERY and recorded <= step < STEPS
    restarts = [line for line in errors.splitlines() if "launch: worker 1" in line]
    assert len(restarts) == 1 and "killed by SIGKILL; restarting the 2 workers" in restarts[0]
    assert "(restart 1 of 3)" in restarts[0]
    records = read_records(model_dir)
    assert [r["step"] for r in records if r.get("event") == "start"] == [0, step]
    assert [r["step"] for r in records if r.get("event") == "worker_lost"] == [step]
    assert_bitwise_equal(run_state(model_dir), uninterrupted)
    assert (model_dir / "logs" / "worker1.log").stat().st_size > 0


def test_a_killed_chief_costs_no_step_and_a_rerun_resumes_bitwise(
    tmp_path, data_dir, uninterrupted
):
    model_dir = tmp_path / "run"
    launcher = start(model_dir, data_dir, "--max_restarts=0")
    recorded = kill_between_checkpoints(launcher, model_dir, victim=0)
    status, errors = finish(launcher)
    assert status == 1, errors[-3000:]
    (lost,) = [line for line in errors.splitlines() if line.startswith("[worker 1] error: ")]
    assert lost.startswith("[worker 1] error: worker 0 (127.0.0.1:"), lost
    step = saved_step(lost, survivor=1)
    assert step > CHECKPOINT_EVERY and recorded <= step < STEPS
    (gave_up,) = [line for line in errors.splitlines() if "launch: worker 0" in line]
    assert "killed by SIGKILL and the 0 restart(s) of --max_restarts are used up" in gave_up
    # The same command resumes from the survivor's checkpoint.
    status, errors = finish(start(model_dir, data_dir))
    assert status == 0, errors[-3000:]
    starts = [r["step"] for r in read_records(model_dir) if r.get("event") == "start"]
    assert starts == [0, step]
    assert_bitwise_equal(run_state(model_dir), uninterrupted)


def test_a_stalled_worker_is_found_within_the_timeout(tmp_path, data_dir):
    timeout = 4
    model_dir = tmp_path / "run"
    launcher = start(
        model_dir,
        data_dir,
        "--max_restarts=0",
        "--grace=3",
        # Far from the end: a test process starved for a while still stops worker 1
        # inside training, not in the run's last steps or at its exit.
        extra=[f"--set=sync.timeout={timeout}", f"--train_steps={STEPS * 25}"],
    )
    wait_for_step(model_dir, 1, launcher)
    recorded = kill_between_checkpoints(launcher, model_dir, victim=1, number=signal.SIGSTOP)
    status, errors = finish(launcher)
    assert status == 1, errors[-3000:]
    lost_lines = [line for line in errors.splitlines() if line.startswith("error: ")]
    assert len(lost_lines) == 1, errors[-5000:]
    (lost,) = lost_lines
    assert "worker 1 (127.0.0.1:" in lost and " was lost (" in lost, lost
    assert recorded <= saved_step(lost, survivor=0)
    (gave_up,) = [line for line in errors.splitlines() if "launch: worker" in line]
    assert "launch: worker 1 (127.0.0.1:" in gave_up, gave_up
    assert "stopped answering and was killed after --grace=3 s" in gave_up
    # Found by the timeout (or by TensorFlow's heartbeats, if sooner), not by the grace kill.
    assert f"did not answer within sync.timeout={timeout} s" in lost or "heartbeats" in lost, lost


def test_a_usage_error_is_not_restarted(tmp_path, data_dir):
    status, errors = finish(start(tmp_path / "run", data_dir, extra=["--model=nope"]), 120)
    assert status == 2, errors
    assert "on a usage error; not restarting" in errors
    assert "restarting the 2 workers" not in errors


def test_the_launcher_needs_one_run_directory():
    result = run_command("resnet_app.launch", "--workers=2", "--", "--dataset=shapes")
    line = error_line(result)
    assert line.startswith("error: give the training flags a --model_dir after --"), line
