"""`python -m resnet_app.launch`: N local workers of one run, restarted when one fails.

    python -m resnet_app.launch --workers=2 -- --dataset=cifar10 --model_dir=runs/c10
    python -m resnet_app.launch --workers=4 --max_restarts=5 -- --config=configs/x.yaml \\
        --model_dir=runs/x

Everything after `--` goes to every `python -m resnet_app.train`. Each worker
gets a generated TF_CONFIG (127.0.0.1, free ports, worker 0 the chief). When a
worker fails, the survivors save the last step every worker completed and
exit (`engine/lost_worker.py`); the launcher waits for them (`--grace`
seconds, then kills what is left), prints one line, and starts the whole
group again on new ports, which resumes from that checkpoint: torchrun's
elastic agent, minus the elasticity (the group keeps its size). It gives up
after `--max_restarts` restarts, and never restarts a group whose worker
failed on a usage error (exit status 2: the same command would fail again).

Worker 0's output is this command's; every worker's goes to
`model_dir/logs/worker<i>.log`, and their `error:` lines are echoed here.
SIGTERM or Ctrl-C is passed on to the workers, which save and stop; there is
no restart then.

Several machines: run `python -m resnet_app.train` on each with its own
TF_CONFIG (BUILD.md, "Several machines"); there a scheduler restarts it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags, logging

from resnet_app.common import cli, run_dir
from resnet_app.common.errors import RESTART_STATUS, ConfigError

_WORKERS = flags.DEFINE_integer("workers", 2, "Local workers (processes) in the group.")
_MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts", 3, "Restarts of the whole group after a worker fails, then give up."
)
_GRACE = flags.DEFINE_float(
    "grace", 60.0, "Seconds the survivors get to save and exit before they are killed."
)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "The address the workers listen on.")


def _free_ports(host: str, count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def model_dir_of(train_args: list[str]) -> str:
    """The --model_dir the training flags give (every worker and restart must share it).

    Raises:
      ConfigError: when there is none.
    """
    for index, arg in enumerate(train_args):
        if arg.startswith("--model_dir="):
            return arg.split("=", 1)[1]
        if arg == "--model_dir" and index + 1 < len(train_args):
            return train_args[index + 1]
    raise ConfigError(
        "give the training flags a --model_dir after --: every worker and every restart "
        "must use the same run directory"
    )


def describe_exit(status: int) -> str:
    """ "was killed by SIGKILL", "exited with status 3"..."""
    if status < 0:
        return f"was killed by {signal.Signals(-status).name}"
    return f"exited with status {status}"


class Group:
    """One attempt: N worker processes of `python -m resnet_app.train`.

    Args:
      count: the workers.
      train_args: the training flags.
      log_dir: where each worker's output goes (`worker<i>.log`).
      host: the address they listen on.
    """

    def __init__(self, count: int, train_args: list[str], log_dir: str, host: str):
        ports = _free_ports(host, count)
        cluster = {"worker": [f"{host}:{port}" for port in ports]}
        self.addresses = cluster["worker"]
        self.processes: list[subprocess.Popen] = []
        self._pumps = []
        os.makedirs(log_dir, exist_ok=True)
        for index in range(count):
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            process = subprocess.Popen(
                [sys.executable, "-m", "resnet_app.train", *train_args],
                env={**os.environ, "TF_CONFIG": json.dumps(tf_config)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                bufsize=1,
            )
            log = run_dir.open_append(os.path.join(log_dir, f"worker{index}.log"))
            pump = threading.Thread(target=_pump, args=(process, log, index), daemon=True)
            pump.start()
            self.processes.append(process)
            self._pumps.append(pump)

    def wait_for_first_failure(self) -> int | None:
        """Blocks until every worker succeeded (None) or one failed (its index)."""
        while True:
            statuses = [p.poll() for p in self.processes]
            failed = [i for i, s in enumerate(statuses) if s not in (None, 0)]
            if failed:
                return failed[0]
            if all(s == 0 for s in statuses):
                return None
            time.sleep(0.2)

    def finish(self, grace: float) -> tuple[list[int], set[int]]:
        """Waits up to `grace` seconds for the others, kills the rest.

        Returns:
          Every worker's exit status, and the indices of those killed here.
        """
        deadline = time.monotonic() + grace
        killed = set()
        for index, process in enumerate(self.processes):
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                killed.add(index)
        for pump in self._pumps:
            pump.join(timeout=5)
        return [p.returncode for p in self.processes], killed

    def signal(self, number: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(number)


def _pump(process: subprocess.Popen, log, index: int) -> None:
    """Copies a worker's output to its log; worker 0's to the console, others' errors too."""
    with log:
        for line in process.stdout:
            log.write(line)
            log.flush()
            if index == 0:
                sys.stderr.write(line)
            elif line.startswith("error: "):
                sys.stderr.write(f"[worker {index}] {line}")


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
    return f"{what} {describe_exit(statuses[index])}"


def launch(count: int, train_args: list[str], max_restarts: int, grace: float, host: str) -> int:
    """Runs the group until it succeeds, restarting it after failures; returns the exit status."""
    model_dir = model_dir_of(train_args)
    log_dir = os.path.join(model_dir, run_dir.LOGS_DIR)
    stopping: list[int] = []
    group: Group | None = None

    def forward(number, frame):
        stopping.append(number)
        if group is not None:
            group.signal(signal.SIGTERM)  # The workers save and stop.

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for attempt in range(max_restarts + 1):
            group = Group(count, train_args, log_dir, host)
            # A restart resumes: it must not start over again.
            train_args = [a for a in train_args if a not in ("--restart", "--restart=true")]
            failed = group.wait_for_first_failure()
            statuses, killed = group.finish(0 if failed is None else grace)
            if failed is None or stopping:
                return next((s for s in statuses if s), 0) if stopping else 0
            what = _what_failed(group, failed, statuses, killed, grace)
            if any(s == cli.USAGE_ERROR for s in statuses) and RESTART_STATUS not in statuses:
                logging.error("launch: %s on a usage error; not restarting", what)
                return cli.USAGE_ERROR
            if attempt == max_restarts:
                logging.error(
                    "launch: %s and the %d restart(s) of --max_restarts are used up; rerun the "
                    "same command to resume from the last checkpoint",
                    what,
                    max_restarts,
                )
                return 1
            logging.warning(
                "launch: %s; restarting the %d workers from the last checkpoint (restart %d of %d)",
                what,
                count,
                attempt + 1,
                max_restarts,
            )
        return 1
    finally:
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
