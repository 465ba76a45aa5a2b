"""`python -m resnet_app.launch`: N local workers of one run, restarted when one fails.

    python -m resnet_app.launch --workers=2 -- --dataset=cifar10 --model_dir=runs/c10

Everything after `--` goes to every `python -m resnet_app.train`, each with its
TF_CONFIG (127.0.0.1, ports held free until the group ends, worker 0 the chief).
When a worker fails, the survivors save and exit (`engine/lost_worker.py`), and
after `--grace` seconds the group starts again on new ports, resuming, up to
`--max_restarts` times (never after a usage error). TensorFlow's servers listen
on every interface, unauthenticated, while the run lasts. Worker 0's output and
every worker's `error:` lines come here, copied as bytes (a closed console only
ends the echo); all of it goes to `model_dir/logs/worker<i>.log`. Workers die
with the launcher, `kill -9` included; SIGTERM, SIGINT and SIGUSR1 are passed on.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from absl import flags, logging

from resnet_app.common import cli, parent_death, run_dir
from resnet_app.common.errors import RESTART_STATUS, ConfigError

_WORKERS = flags.DEFINE_integer("workers", 2, "Local workers (processes) in the group.")
_MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts", 3, "Restarts of the whole group after a worker fails, then give up."
)
_GRACE = flags.DEFINE_float(
    "grace", 60.0, "Seconds the survivors get to save and exit before they are killed."
)
_HOST = flags.DEFINE_string(
    "host",
    "127.0.0.1",
    "The address in TF_CONFIG by which the workers reach each other (TensorFlow listens on "
    "every interface whatever it is).",
)

# Passed on to the workers: a stop, or a preemption notice (they save and exit 3).
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
_PORT_RETRIES = 3  # Free restarts after a worker's server could not listen on its port.
_PORT_TAKEN = b"Could not start gRPC server"  # What a worker prints then (TensorFlow 2.21).
_CHUNK = 65536  # Worker output is copied in pieces of at most this (a line need not end).


def worker_command(train_args: list[str]) -> list[str]:
    """The program of one worker: `python -m resnet_app.train` (tests put a fake one here)."""
    return [sys.executable, "-m", "resnet_app.train", *train_args]


def _reserve_ports(count: int, held: contextlib.ExitStack) -> list[int]:
    """`count` distinct ports free on every interface (as TensorFlow's server binds), each
    held by a socket in `held`: bound with SO_REUSEADDR, not listening, it lets the
    worker's gRPC server listen there and keeps every other bind away."""
    return [held.enter_context(_wildcard_socket()).getsockname()[1] for _ in range(count)]


def _wildcard_socket() -> socket.socket:
    """A TCP socket bound to a free port of [::] (IPv4 included), or 0.0.0.0 without IPv6."""
    error = None
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as failure:
            error = failure
            continue
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, 0))
            return sock
        except OSError as failure:
            sock.close()
            error = failure
    raise error


def model_dir_of(train_args: list[str]) -> str:
    """The --model_dir the training flags give (every worker and restart must share it)."""
    for index, arg in enumerate(train_args):
        if arg.startswith("--model_dir="):
            return arg.split("=", 1)[1]
        if arg == "--model_dir" and index + 1 < len(train_args):
            return train_args[index + 1]
    raise ConfigError(
        "give the training flags a --model_dir after --: every worker and every restart "
        "must use the same run directory"
    )


class Group:
    """One attempt: `count` processes of `worker_command`, on ports held until it ends."""

    def __init__(self, count: int, train_args: list[str], log_dir: str, host: str):
        self._count, self._train_args, self._log_dir = count, train_args, log_dir
        self._held = contextlib.ExitStack()  # The ports' sockets.
        self.addresses = [f"{host}:{port}" for port in _reserve_ports(count, self._held)]
        self.processes: list[subprocess.Popen] = []
        self.port_taken: int | None = None  # The first worker whose server could not listen.
        self._pumps: list[threading.Thread] = []
        # Each signal passed on, with the number of workers started when it came.
        self._signals: list[tuple[int, int]] = []

    def start(self, stopping: list[int]) -> None:
        """Starts the workers in order; none once `stopping` holds a signal."""
        cluster = {"worker": self.addresses}
        os.makedirs(self._log_dir, exist_ok=True)
        for index in range(self._count):
            command = worker_command(self._train_args)
            if stopping:
                return
            path = os.path.join(self._log_dir, f"worker{index}.log")
            log = os.fdopen(run_dir.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            process = subprocess.Popen(
                # Not preexec_fn (unsafe with the pumps' threads): parent_death sets
                # the parent-death signal, then execs the worker.
                [sys.executable, "-m", parent_death.__name__, str(os.getpid()), *command],
                env={**os.environ, "TF_CONFIG": json.dumps(tf_config)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Its own group: only the signals the launcher passes on reach it (a
                # terminal's Ctrl-C goes to the foreground group), and it dies whole.
                process_group=0,
            )
            self.processes.append(process)
            # A signal handled between Popen and the line above missed this worker.
            for number, started in list(self._signals):
                if started <= index:
                    process.send_signal(number)
            pump = threading.Thread(
                target=_pump, args=(process.stdout, log, index, self), daemon=True
            )
            pump.start()
            self._pumps.append(pump)

    def wait_for_first_failure(self, grace: float) -> int | None:
        """Blocks until every worker succeeded (None) or one failed (its index); one still
        running `grace` seconds after the chief succeeded is left to `finish`."""
        chief_done = None
        while True:
            statuses = [p.poll() for p in self.processes]
            failed = [i for i, s in enumerate(statuses) if s not in (None, 0)]
            if failed:
                # Its last lines may still be in the pipe: whether its port was taken.
                self._pumps[failed[0]].join(timeout=5)
                return failed[0]
            if all(s == 0 for s in statuses):
                return None
            if statuses[0] == 0:
                chief_done = chief_done or time.monotonic()
                if time.monotonic() - chief_done >= grace:
                    return None
            time.sleep(0.2)

    def finish(self, grace: float) -> tuple[list[int], set[int]]:
        """Waits up to `grace` seconds, kills the rest, frees the ports; returns every
        worker's exit status and the indices of those killed."""
        deadline = time.monotonic() + grace
        killed = set()
        for index, process in enumerate(self.processes):
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                _kill(process)
                process.wait()
                killed.add(index)
        for pump in self._pumps:
            pump.join(timeout=5)
        self._held.close()
        return [p.returncode for p in self.processes], killed

    def kill(self) -> None:
        """Kills every worker still running and frees the ports: the launcher is leaving."""
        for process in self.processes:
            if process.poll() is None:
                _kill(process)
                process.wait()
        self._held.close()

    def signal(self, number: int) -> None:
        """Passes signal `number` on to every worker started (from the signal handler)."""
        self._signals.append((number, len(self.processes)))
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(number)


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL to a worker not yet waited for, and to anything in its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


class _Sink:
    """A destination of worker output, dropped at its first failure: the copy goes on."""

    def __init__(self, write: Callable[[bytes], object]):
        self._write = write
        self.error: Exception | None = None

    def write(self, data: bytes) -> None:
        if self.error is None:
            try:
                self._write(data)
            except (OSError, ValueError, AttributeError) as error:  # EPIPE, ENOSPC; closed.
                self.error = error


def _write_flushed(stream: BinaryIO, data: bytes) -> None:
    stream.write(data)
    stream.flush()


def _write_console(data: bytes) -> None:
    """Worker output to the launcher's stderr, as bytes unless it was replaced by text; a
    gone reader (EPIPE) leaves fd 2 on /dev/null, so exit's flush cannot fail a good run."""
    try:
        buffer = getattr(sys.stderr, "buffer", None)
        if buffer is None:
            sys.stderr.write(data.decode("utf-8", "backslashreplace"))
            sys.stderr.flush()
        else:
            _write_flushed(buffer, data)
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):  # A stderr without a descriptor.
            descriptor = sys.stderr.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, descriptor)
            os.close(devnull)
        raise


class _Console:
    """The launcher's stderr, shared by the pumps a line at a time: another worker's line
    never lands inside one, unless it stays unfinished `patience` seconds."""

    def __init__(self, patience: float = 1.0, write: Callable[[bytes], object] = _write_console):
        self._patience = patience
        self._changed = threading.Condition()
        self._holder: int | None = None
        self._sink = _Sink(write)

    def write(self, index: int, data: bytes) -> None:
        with self._changed:
            if not self._changed.wait_for(
                lambda: self._holder in (None, index), timeout=self._patience
            ):
                self._sink.write(b"\n")
            self._sink.write(data)
            self._holder = None if data.endswith(b"\n") else index
            self._changed.notify_all()

    def release(self, index: int) -> None:
        """A worker's output ended (perhaps mid-line): the others may write."""
        with self._changed:
            if self._holder == index:
                self._sink.write(b"\n")  # Its last line, cut short, ends here.
                self._holder = None
                self._changed.notify_all()


_CONSOLE = _Console()


def _pump(stream: BinaryIO, log: BinaryIO, index: int, group: Group) -> None:
    """Copies a worker's output, as bytes, to its log; worker 0's to the console, others'
    errors too; notes in `group` a server that could not listen. A failing destination is
    dropped; the reading goes on (an unread pipe would block the worker)."""
    to_log = _Sink(functools.partial(_write_flushed, log))
    prefix = b"" if index == 0 else f"[worker {index}] ".encode()
    echo, line_start = False, True
    with log, stream:
        for chunk in iter(functools.partial(stream.readline, _CHUNK), b""):
            to_log.write(chunk)
            if _PORT_TAKEN in chunk and group.port_taken is None:
                group.port_taken = index
            if line_start:
                echo = index == 0 or chunk.startswith(b"error: ")
            if echo:
                _CONSOLE.write(index, prefix + chunk if line_start else chunk)
            line_start = chunk.endswith(b"\n")
    _CONSOLE.release(index)
    if to_log.error is not None:
        logging.warning("launch: worker %d's output is not all in its log: %s", index, to_log.error)


def _what_failed(
    group: Group, first: int, statuses: list[int], killed: set[int], grace: float
) -> str:
    """The worker to blame: not a survivor that saved (status 3), unless none is left."""
    index = next(
        (i for i, s in enumerate(statuses) if s not in (0, RESTART_STATUS) and i not in killed),
        next(iter(sorted(killed)), first),
    )
    what = f"worker {index} ({group.addresses[index]})"
    if index in killed:
        return f"{what} stopped answering and was killed after --grace={grace:g} s"
    if statuses[index] < 0:
        return f"{what} was killed by {signal.Signals(-statuses[index]).name}"
    return f"{what} exited with status {statuses[index]}"


def _log_stragglers(group: Group, killed: set[int], grace: float) -> None:
    """One line per worker killed after the run was complete (`wait_for_first_failure`)."""
    for index in sorted(killed):
        logging.warning(
            "launch: worker %d (%s) was still running --grace=%g s after worker 0 finished "
            "the run, and was killed; the run is complete",
            index,
            group.addresses[index],
            grace,
        )


def _log_start(group: Group, host: str, first: bool) -> None:
    """One line per group; the first says who else can reach the workers' ports."""
    where = f"{len(group.addresses)} workers on {', '.join(group.addresses)}"
    if not first:
        logging.info("launch: %s", where)
        return
    logging.warning(
        "launch: %s; TensorFlow's servers listen on these ports on every network interface, "
        "not only %s, without authentication: where this machine is reachable from a network "
        "you do not trust, close them there with a firewall (docs/distributed.md)",
        where,
        host,
    )


def launch(count: int, train_args: list[str], max_restarts: int, grace: float, host: str) -> int:
    """Runs the group until it succeeds, restarting it after failures; returns the exit
    status. From the main thread: it handles signals, and workers die with it."""
    model_dir = model_dir_of(train_args)
    log_dir = os.path.join(model_dir, run_dir.LOGS_DIR)
    stopping: list[int] = []
    group: Group | None = None
    statuses: list[int] = []  # Of the last group that started a worker.

    def forward(number, frame):
        stopping.append(number)
        if group is not None:
            group.signal(number)  # The workers save and stop (a second SIGINT: at once).

    previous = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS}
    restarts = port_retries = 0
    try:
        while not stopping:
            group = Group(count, train_args, log_dir, host)
            _log_start(group, host, first=restarts + port_retries == 0)
            group.start(stopping)
            failed = group.wait_for_first_failure(grace)
            taken = None if failed is None else group.port_taken
            if taken is not None and not stopping and port_retries < _PORT_RETRIES:
                group.finish(0.0)  # Nobody trained: the strategy waits for every server.
                port_retries += 1
                logging.warning(
                    "launch: worker %d (%s) could not listen on its port (most likely "
                    "another program's now); starting the %d workers again at once on new "
                    "ports (port retry %d of %d)",
                    taken,
                    group.addresses[taken],
                    count,
                    port_retries,
                    _PORT_RETRIES,
                )
                continue
            finished, killed = group.finish(0 if failed is None else grace)
            if group.processes:
                statuses = finished
            if failed is None:
                _log_stragglers(group, killed, grace)
            if failed is None or stopping:
                break
            what = _what_failed(group, failed, statuses, killed, grace)
            if any(s == cli.USAGE_ERROR for s in statuses) and RESTART_STATUS not in statuses:
                logging.error("launch: %s on a usage error; not restarting", what)
                return cli.USAGE_ERROR
            if restarts == max_restarts:
                logging.error(
                    "launch: %s and the %d restart(s) of --max_restarts are used up; rerun the "
                    "same command to resume from the last checkpoint",
                    what,
                    max_restarts,
                )
                return 1
            restarts += 1
            logging.warning(
                "launch: %s; restarting the %d workers from the last checkpoint (restart %d of %d)",
                what,
                count,
                restarts,
                max_restarts,
            )
            # A restart resumes: it must not start over again.
            train_args = [a for a in train_args if a not in ("--restart", "--restart=true")]
        # Done, or stopped by a signal (no restart then): how the last workers ended.
        return next((s for s in statuses if s), 0) if stopping else 0
    finally:
        if group is not None:
            group.kill()
        for number, handler in previous.items():
            signal.signal(number, handler)


def main(argv: list[str]) -> None:
    train_args = argv[1:]
    if _WORKERS.value < 1:
        raise ConfigError(f"--workers={_WORKERS.value}: give 1 or more")
    if _MAX_RESTARTS.value < 0:
        raise ConfigError(f"--max_restarts={_MAX_RESTARTS.value}: give 0 or more")
    if "TF_CONFIG" in os.environ:
        raise ConfigError(
            "TF_CONFIG is set: the launcher makes each worker's; unset it, or run "
            "python -m resnet_app.train on each machine with its own"
        )
    status = launch(_WORKERS.value, train_args, _MAX_RESTARTS.value, _GRACE.value, _HOST.value)
    sys.exit(status)


if __name__ == "__main__":
    cli.run(main)
