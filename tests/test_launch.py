"""The launcher's care of its workers (`resnet_app.launch`), issue 38.

The launcher is the real one, started as a process as a user starts it; its
workers are fake (FAKE_WORKER, put in `launch.worker_command`), starting in
milliseconds, except where TensorFlow's own server is the subject. Workers
die with a launcher killed by SIGKILL; a port another program took is given
up at once, without the grace or a restart; any bytes of output pass, and a
console that went away never blocks a worker; a signal that comes while a
group starts again reaches it.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from resnet_app import launch
from tests.commands import REPO, start_code

# What a fake worker says: not UTF-8, and more than a pipe holds (64 KiB).
NOISE = (
    b"\xff\xfe not UTF-8: \x80\xc3(\n"
    + b"y" * 200_000
    + b"\nno end of line here, then one: \xe9\n"
    + b"error: the last line, \xe9\n"
)
# Text, more than a pipe holds.
TEXT = b"a line of text\n" * 20_000
# Seconds a waiting fake worker waits for a signal before it says it got none.
UNSTOPPED = 45

FAKE_WORKER = r"""
import json, os, signal, sys, time

mode = sys.argv[1]
model_dir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--model_dir="))
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if mode == "survivor":  # Lost its peer, saved the last step: restart me.
    sys.exit(3)
if mode == "chief_ends" and index == 0:  # The run is complete; the others stall.
    sys.exit(0)
if mode == "say":  # What the test put in the run directory, as it is.
    with open(os.path.join(model_dir, "output"), "rb") as f:
        sys.stdout.buffer.write(f.read())
    sys.exit(0)


def stop(number, frame):
    print(f"worker {index} stopped by {signal.Signals(number).name}", flush=True)
    sys.exit(3 if number == signal.SIGUSR1 else 0)  # A preemption notice: requeue me.


for number in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(number, stop)
with open(os.path.join(model_dir, f"ready{index}.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.replace(os.path.join(model_dir, f"ready{index}.tmp"), os.path.join(model_dir, f"ready{index}"))
time.sleep(UNSTOPPED_SECONDS)
print(f"worker {index} was never stopped", flush=True)
sys.exit(1)
"""
FAKE_WORKER = FAKE_WORKER.replace("UNSTOPPED_SECONDS", str(UNSTOPPED))

# The launcher, its workers fake: group g runs MODES[g] (the last one repeats).
LAUNCHER = """
import os, signal, sys
from resnet_app import launch
from resnet_app.common import cli

MODES, WORKERS, FAKE = {modes!r}, {workers!r}, {fake!r}
commands = []


def fake_command(train_args):
    commands.append(train_args)
    mode = MODES[min((len(commands) - 1) // WORKERS, len(MODES) - 1)]
    return [sys.executable, "-c", FAKE, mode, *train_args]


if MODES:
    launch.worker_command = fake_command
{patch}
cli.run(launch.main)
"""

TRAIN = [
    "--dataset=shapes",
    "--model=tiny",
    "--batch_size=16",
    "--train_steps=2",
    "--log_every=1",
    "--eval_every=2",
    "--set=data.train_examples=64",
    "--set=data.eval_examples=21",
]


def launcher_code(*modes, workers=2, patch=""):
    return LAUNCHER.format(modes=modes, workers=workers, fake=FAKE_WORKER, patch=patch)


def launch_args(model_dir, workers=2, flags=(), train=()):
    return [f"--workers={workers}", *flags, "--", *train, f"--model_dir={model_dir}"]


def start(model_dir, *modes, patch="", flags=(), train=()):
    """The launcher of 2 workers in the background, fake ones running `modes`."""
    return start_code(
        launcher_code(*modes, patch=patch), *launch_args(model_dir, flags=flags, train=train)
    )


@pytest.fixture
def model_dir(tmp_path):
    """The run directory; any process left that names it is killed afterwards."""
    path = tmp_path / "run"
    path.mkdir()
    yield path
    for pid in processes_naming(str(path)):
        os.kill(pid, signal.SIGKILL)


def processes_naming(text):
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if text.encode() in f.read() and alive(int(name)):
                    found.append(int(name))
        except (OSError, ValueError):
            continue
    return found


def alive(pid):
    """Whether process `pid` runs (a zombie, dead but not yet waited for, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait_until(condition, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def ready_workers(model_dir, launcher, count=2):
    """The pids of the waiting fake workers, once each has its signal handlers."""
    files = [model_dir / f"ready{index}" for index in range(count)]
    wait_until(lambda: all(f.exists() for f in files) or not alive(launcher.pid), "no workers")
    assert alive(launcher.pid), launcher.communicate(10)
    return [int(f.read_text()) for f in files]


def test_the_workers_die_with_a_launcher_killed_by_sigkill(model_dir):
    launcher = start(model_dir, "wait")
    workers = ready_workers(model_dir, launcher)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait(60)
    wait_until(
        lambda: not any(alive(pid) for pid in workers),
        f"workers {[pid for pid in workers if alive(pid)]} outlived their launcher",
        timeout=20,
    )


def test_a_worker_dies_at_once_if_its_launcher_is_gone_before_it_starts(tmp_path):
    program = [sys.executable, "-m", "resnet_app.common.parent_death"]
    # Its parent is this process: it runs, and knows the signal it gets when we end.
    code = (  # PR_GET_PDEATHSIG
        "import ctypes; s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s)); "
        "print(s.value)"
    )
    env = {**os.environ, "PYTHONPATH": REPO}
    ran = subprocess.run(
        [*program, str(os.getpid()), sys.executable, "-c", code], env=env, capture_output=True
    )
    assert (ran.returncode, ran.stdout) == (0, f"{int(signal.SIGKILL)}\n".encode()), ran
    # Another pid than its parent's: as if the launcher died before prctl (no signal will come).
    marker = tmp_path / "ran"
    late = subprocess.run(
        [*program, str(os.getppid()), "touch", str(marker)], env=env, capture_output=True
    )
    assert late.returncode == -signal.SIGKILL and not marker.exists(), late


def test_output_of_any_bytes_passes_whole_and_never_blocks_a_worker(model_dir):
    (model_dir / "output").write_bytes(NOISE)
    launcher = start(model_dir, "say")
    _, errors = launcher.communicate(timeout=60)
    assert launcher.returncode == 0, errors[-3000:]
    for index in range(2):
        assert (model_dir / "logs" / f"worker{index}.log").read_bytes() == NOISE
    # Worker 0's output is all shown (as bytes: the test reads them with "replace"), the
    # other's error line only.
    assert errors.count("y" * 200_000) == 1
    assert "\ufffd\ufffd not UTF-8: \ufffd\ufffd(\n" in errors
    assert errors.count("error: the last line, \ufffd\n") == 2
    assert "[worker 1] error: the last line, \ufffd\n" in errors


def test_another_workers_error_line_waits_for_the_end_of_the_line_being_shown():
    shown = []
    console = launch._Console(patience=60, write=shown.append)
    console.write(0, b"y" * 10)  # Worker 0 is in the middle of a line.
    other = threading.Thread(target=console.write, args=(1, b"[worker 1] error: x\n"))
    other.start()
    console.write(0, b"y" * 10 + b"\n")
    other.join(60)
    assert shown == [b"y" * 10, b"y" * 10 + b"\n", b"[worker 1] error: x\n"]


def test_a_line_left_unfinished_is_ended_and_the_console_passes_on():
    shown = []
    console = launch._Console(patience=0.05, write=shown.append)
    console.write(0, b"step 10/100\r")  # A progress line, no newline to come.
    console.write(1, b"[worker 1] error: x\n")
    console.write(0, b"step 20/100\r")
    console.release(0)  # Its output ended mid-line: the line is ended.
    console.write(1, b"[worker 1] error: y\n")
    assert shown == [
        b"step 10/100\r",
        b"\n",
        b"[worker 1] error: x\n",
        b"step 20/100\r",
        b"\n",
        b"[worker 1] error: y\n",
    ]


def test_a_console_that_went_away_never_blocks_a_worker(model_dir):
    (model_dir / "output").write_bytes(TEXT)
    launcher = subprocess.Popen(
        [sys.executable, "-c", launcher_code("say"), *launch_args(model_dir)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    launcher.stderr.close()  # Its reader is gone: every write there fails (EPIPE).
    launcher.wait(60)
    for index in range(2):
        assert (model_dir / "logs" / f"worker{index}.log").read_bytes() == TEXT
    assert launcher.returncode == 0


# The launcher signals itself, in the second group: before it starts any worker
# (while it chooses the ports), or once its first worker waits for a signal.
BEFORE_THE_WORKERS = """
reserve_ports = launch._reserve_ports
groups = []


def signalled_reserve_ports(count, held):
    groups.append(count)
    if len(groups) == 2:
        os.kill(os.getpid(), signal.SIGTERM)
    return reserve_ports(count, held)


launch._reserve_ports = signalled_reserve_ports
"""
BETWEEN_TWO_WORKERS = """
import time


def signalled_command(train_args):
    if len(commands) == 3:
        ready = os.path.join(train_args[-1].split("=", 1)[1], "ready0")  # --model_dir=
        while not os.path.exists(ready):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
    return fake_command(train_args)


launch.worker_command = signalled_command
"""


@pytest.mark.parametrize("when", ["before_the_workers", "between_two_workers"])
def test_a_signal_while_the_group_starts_again_reaches_it(model_dir, when):
    patch = BEFORE_THE_WORKERS if when == "before_the_workers" else BETWEEN_TWO_WORKERS
    launcher = start(model_dir, "survivor", "wait", patch=patch)
    _, errors = launcher.communicate(timeout=120)
    logs = [
        (model_dir / "logs" / f"worker{index}.log").read_text(errors="replace")
        for index in range(2)
    ]
    assert "restarting the 2 workers from the last checkpoint (restart 1 of 3)" in errors
    assert not any("never stopped" in log for log in logs), logs
    if when == "before_the_workers":
        # No worker starts; the launcher ends as the survivors did, asking for a restart.
        assert launcher.returncode == 3, errors[-3000:]
        assert not (model_dir / "ready0").exists() and not (model_dir / "ready1").exists()
    else:
        # The worker started stops as it was told to (SIGINT, as a trainer takes it); the
        # next one is not started.
        assert launcher.returncode == 0, errors[-3000:]
        assert logs == ["worker 0 stopped by SIGINT\n", ""]


@contextlib.contextmanager
def grpc_like_server(port):
    try:
        server = socket.socket(socket.AF_INET6)
        server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address = "::"
    except OSError:
        server, address = socket.socket(socket.AF_INET), "0.0.0.0"
    with server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((address, port))
        server.listen()
        yield server


def test_the_ports_chosen_are_free_and_kept_on_every_interface_but_for_the_workers():
    with contextlib.ExitStack() as held:
        ports = launch._reserve_ports(2, held)
        assert len(set(ports)) == 2
        for port in ports:
            # Another program's bind, on any interface, fails while the group holds the port.
            for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0")):
                with socket.socket(family) as other, pytest.raises(OSError):
                    other.bind((address, port))
            # The worker's server binds and listens as gRPC does: [::] with IPv4 (0.0.0.0
            # without IPv6), SO_REUSEADDR.
            with grpc_like_server(port):
                pass
    with socket.socket() as other:  # Free again once the group ended.
        other.bind(("0.0.0.0", ports[0]))


# The first group's worker 0 is given a port a server of another program listens on.
SQUATTER = """
import socket

squatter = socket.socket()
squatter.bind(("", 0))
squatter.listen()
taken = [squatter.getsockname()[1]]
reserve_ports = launch._reserve_ports


def squatted_reserve_ports(count, held):
    ports = reserve_ports(count, held)
    return [taken.pop(), *ports[1:]] if taken else ports


launch._reserve_ports = squatted_reserve_ports
"""


def test_a_port_another_program_took_is_given_up_at_once(model_dir, tmp_path):
    # --grace=3600: waited for, the survivor would end the test by its timeout.
    launcher = start(
        model_dir,
        patch=SQUATTER,
        flags=["--max_restarts=0", "--grace=3600"],
        train=[*TRAIN, f"--set=data.data_dir={tmp_path / 'data'}"],
    )
    _, errors = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, errors[-3000:]
    lines = errors.splitlines()
    (start_line,) = [line for line in lines if "TensorFlow's servers listen" in line]
    assert "on every network interface, not only 127.0.0.1, without authentication" in start_line
    (retry,) = [line for line in lines if "could not listen on its port" in line]
    assert "launch: worker 0 (127.0.0.1:" in retry, retry
    assert "starting the 2 workers again at once on new ports (port retry 1 of 3)" in retry
    assert not [line for line in lines if "restarting the" in line or "stopped answering" in line]
    assert (model_dir / "ckpt-2.index").exists()


def test_a_preemption_notice_reaches_every_worker_and_the_launcher_asks_for_a_requeue(
    model_dir,
):
    launcher = start(model_dir, "wait")
    ready_workers(model_dir, launcher)
    os.kill(launcher.pid, signal.SIGUSR1)
    _, errors = launcher.communicate(timeout=120)
    logs = [(model_dir / "logs" / f"worker{i}.log").read_text() for i in range(2)]
    assert logs == [f"worker {i} stopped by SIGUSR1\n" for i in range(2)]
    assert launcher.returncode == 3, errors[-3000:]  # As the workers: requeue the job.
    assert "restarting" not in errors


def test_a_worker_that_stalls_after_the_chief_finished_is_killed_after_the_grace(model_dir):
    # Worker 1 waits for a signal for UNSTOPPED s; before, the launcher waited with it,
    # for ever had it been stopped (SIGSTOP) at the end of a run.
    launcher = start(model_dir, "chief_ends", flags=["--grace=1"])
    _, errors = launcher.communicate(timeout=UNSTOPPED - 5)
    assert launcher.returncode == 0, errors[-3000:]
    (killed,) = [line for line in errors.splitlines() if "launch: worker 1" in line]
    assert "was still running --grace=1 s after worker 0 finished the run" in killed, killed
    assert "the run is complete" in killed
    assert "restarting" not in errors and "was never stopped" not in errors
