"""One trainer per run directory: a second one refuses, a dead holder never blocks a resume."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from resnet_app.common import run_dir, run_lock
from resnet_app.common.errors import ConfigError
from tests.commands import REPO, error_line, run_command

# Holds the lock of the directory in argv[1] until killed, as a trainer would.
HOLDER = """
import sys, time
from resnet_app.common import run_lock
run_lock.RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """A process holding tmp_path/run's lock; killed with SIGKILL at the end."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "run")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert process.stdout.readline().strip() == "locked"
    yield process
    process.kill()
    process.wait()


def test_a_second_trainer_is_refused_naming_the_holder_until_it_dies(tmp_path, holder):
    model_dir = str(tmp_path / "run")
    with pytest.raises(ConfigError) as refused:
        run_lock.RunLock(model_dir).acquire()
    message = str(refused.value)
    assert f"pid {holder.pid} on {socket.gethostname()}" in message
    assert f"kill -TERM {holder.pid}" in message and "another --model_dir" in message
    with pytest.raises(ConfigError):
        run_lock.refuse_if_held(model_dir)
    # kill -9 leaves the lock file, but nobody holds it: a resume goes ahead.
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert os.path.isfile(run_dir.lock_path(model_dir))
    run_lock.refuse_if_held(model_dir)
    with run_lock.RunLock(model_dir) as lock:
        assert lock.held
    # Released: the next trainer gets it.
    run_lock.RunLock(model_dir).acquire().release()


def test_the_lock_is_the_trainers_until_it_returns(tmp_path):
    from resnet_app.engine import loop
    from resnet_app.engine.actions import Action
    from tests import runs

    model_dir = str(tmp_path / "run")
    resolved = runs.small_config(tmp_path, train_steps=2)

    class Probe(Action):  # An extra action: it looks at the lock while the run trains.
        seen = None

        def enter(self, step, restored):
            try:
                run_lock.RunLock(model_dir).acquire()
            except ConfigError as error:
                Probe.seen = str(error)

    loop.train_and_evaluate(resolved, model_dir, actions=[Probe()])
    assert Probe.seen and f"pid {os.getpid()}" in Probe.seen
    run_lock.RunLock(model_dir).acquire().release()  # Free once the run returned.


def test_the_command_refuses_in_one_line_and_writes_nothing(tmp_path, holder):
    model_dir = tmp_path / "run"
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    result = run_command(
        "resnet_app.train", "--dataset=shapes", "--model=tiny", f"--model_dir={model_dir}"
    )
    line = error_line(result)
    assert line.startswith(f"error: --model_dir={model_dir} is in use by another trainer"), line
    assert f"pid {holder.pid}" in line
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == before


def test_restart_keeps_the_lock_file_in_place(tmp_path):
    model_dir = tmp_path / "run"
    with run_lock.RunLock(str(model_dir)):
        (model_dir / run_dir.METRICS_FILE).write_text("{}\n")
        aside = run_dir.move_aside(str(model_dir))
        assert sorted(os.listdir(aside)) == [run_dir.METRICS_FILE]
        assert os.path.isfile(run_dir.lock_path(str(model_dir)))
        with pytest.raises(ConfigError):  # Still held through the move.
            run_lock.RunLock(str(model_dir)).acquire()


def test_readers_work_on_a_run_that_is_training(tiny_run, tmp_path):
    """evaluate reads a locked run: only trainers take the lock."""
    import shutil

    _, model_dir = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    with run_lock.RunLock(str(copy)):
        result = run_command("resnet_app.evaluate", f"--model_dir={copy}")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0])["num_examples"] == 37


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path):
    """A run directory from elsewhere whose trainer.lock points at a user's file."""
    target = tmp_path / "bashrc"
    target.write_text("export PATH=precious\n")
    (tmp_path / "run").mkdir()
    os.symlink(target, tmp_path / "run" / run_dir.LOCK_FILE)
    with pytest.raises(ConfigError, match=r"trainer.lock is a symbolic link; .* remove the link"):
        run_lock.RunLock(str(tmp_path / "run")).acquire()
    assert target.read_text() == "export PATH=precious\n"


def test_run_files_open_in_place_only_as_files_of_their_own(tmp_path):
    target = tmp_path / "elsewhere.log"
    target.write_text("theirs\n")
    os.symlink(target, tmp_path / "worker0.log")
    with pytest.raises(ConfigError, match=r"worker0.log is a symbolic link"):
        run_dir.open_append(str(tmp_path / "worker0.log"))
    assert target.read_text() == "theirs\n"
    with run_dir.open_append(str(tmp_path / "worker1.log")) as log:  # A plain file appends.
        log.write("one\n")
    with run_dir.open_append(str(tmp_path / "worker1.log")) as log:
        log.write("two\n")
    assert (tmp_path / "worker1.log").read_text() == "one\ntwo\n"
