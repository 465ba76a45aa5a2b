"""Running the app's commands as a user would, and reading their one-line errors."""

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_command(command, *args, env=None, unset=(), timeout=300, fresh=False):
    """Runs `python -m MODULE` or `python scripts/X.py` from the repository root.

    Args:
      command: a module ("resnet_app.train") or a path ending in .py.
      *args: its arguments.
      env: extra environment variables.
      unset: environment variables the command must not inherit.
      timeout: seconds before the test fails.
      fresh: a new interpreter, not a fork of tests/zygote.py (to test Python's start).
    """
    return _run_python([*_target(command), *args], env, unset, timeout, fresh)


def run_code(code, *args, env=None, unset=(), timeout=300, fresh=False):
    """Runs `python -c CODE ARGS` from the repository root, like `run_command`."""
    return _run_python(["-c", code, *args], env, unset, timeout, fresh)


def start_command(command, *args, env=None, merged=False):
    """Starts `run_command`'s command without waiting: the workers of one job, side by side.

    Returns:
      A process read as `subprocess.Popen(..., text=True)` (stderr None when
      `merged` puts it in stdout, as `2>&1`).
    """
    return _start_python([*_target(command), *args], env, merged)


def start_code(code, *args, env=None, merged=False):
    """`start_command` for `python -c CODE ARGS`."""
    return _start_python(["-c", code, *args], env, merged)


def _target(command):
    return [os.path.join(REPO, command)] if command.endswith(".py") else ["-m", command]


def _environment(env, unset):
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    return {**inherited, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO, **(env or {})}


def _run_python(argv, env, unset, timeout, fresh):
    environment = _environment(env, unset)
    process = None if fresh else _forks.start(argv, environment)
    if process is not None:
        stdout, stderr = process.communicate(timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


def _start_python(argv, env, merged):
    environment = _environment(env, ())
    return _forks.start(argv, environment, merged) or subprocess.Popen(
        [sys.executable, *argv],
        cwd=REPO,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
        text=True,
    )


# What Python, TensorFlow and Keras read from the environment when they are imported.
_IMPORT_TIME = ("TF_", "PYTHON", "KERAS_", "CUDA", "XLA_", "OMP_", "MKL_", "KMP_", "LD_", "HOME")


def _import_settings(environment):
    return {k: v for k, v in environment.items() if k.startswith(_IMPORT_TIME) and k != "TF_CONFIG"}


class _Forks:
    """The client of tests/zygote.py: commands forked from a process that imported TensorFlow.

    One server per test process, started at the first command; a command whose
    import-time environment differs from the server's runs in a new interpreter.
    """

    def __init__(self):
        self._server = self._settings = None
        self._ended = {}  # pid -> waitpid status, of children nobody waited for yet.

    def _start(self, environment):
        """Whether a server runs; one that cannot import TensorFlow (the first
        command blocked it) is not kept, and that command runs on its own."""
        self._settings = _import_settings(environment)
        self._server = subprocess.Popen(
            [sys.executable, "-m", "tests.zygote"],
            cwd=REPO,
            env=environment,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,  # Unbuffered: a reply read never takes the next one along (select).
        )
        atexit.register(self._server.kill)
        try:
            if "ready" in self._reply(300):
                return True
        except RuntimeError:  # It ended without answering.
            pass
        self._server, self._settings = None, None
        return False

    def start(self, argv, environment, merged=False):
        """The command forked by the server, or None where no server can run it."""
        if self._settings is not None and _import_settings(environment) != self._settings:
            return None
        running = self._server is not None and self._server.poll() is None
        if not running and not self._start(environment):
            return None
        folder = tempfile.mkdtemp(prefix="forked_")
        stdout = os.path.join(folder, "stdout")
        stderr = stdout if merged else os.path.join(folder, "stderr")
        request = {
            "argv": argv,
            "env": environment,
            "cwd": REPO,
            "stdout": stdout,
            "stderr": stderr,
        }
        self._server.stdin.write(json.dumps(request).encode() + b"\n")
        self._server.stdin.flush()
        while True:  # Another child's end may come first.
            reply = self._reply(60)
            if "status" not in reply:
                return _Forked(self, [sys.executable, *argv], reply["pid"], folder, merged)
            self._ended[reply["pid"]] = reply["status"]

    def status(self, pid, timeout):
        """The waitpid status of child `pid`, once it has ended."""
        deadline = time.monotonic() + timeout
        while pid not in self._ended:
            reply = self._reply(max(0.0, deadline - time.monotonic()))
            if "status" in reply:
                self._ended[reply["pid"]] = reply["status"]
        return self._ended.pop(pid)

    def _reply(self, timeout):
        ready, _, _ = select.select([self._server.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("tests.zygote", timeout)
        line = self._server.stdout.readline()
        if not line:
            raise RuntimeError("tests/zygote.py ended without answering")
        return json.loads(line)


class _Forked:
    """A command forked by tests/zygote.py, read as a `subprocess.Popen(text=True)`."""

    def __init__(self, forks, args, pid, folder, merged):
        self._forks, self.args, self.pid = forks, args, pid
        self._folder, self._merged = folder, merged
        self.returncode = None

    def wait(self, timeout=None):
        if self.returncode is None:
            try:
                status = self._forks.status(self.pid, 1e9 if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self._forks.status(self.pid, 10)
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def communicate(self, timeout=None):
        self.wait(timeout)
        texts = []
        for name in ("stdout",) if self._merged else ("stdout", "stderr"):
            with open(os.path.join(self._folder, name), encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
        shutil.rmtree(self._folder, ignore_errors=True)
        return texts[0], (None if self._merged else texts[1])


_forks = _Forks()


def error_line(result):
    """The one `error: ...` line of a failed command; asserts exit 2 and no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def blocked_packages(folder, *packages):
    """A folder for PYTHONPATH in which each of `packages` raises ImportError when imported:
    first on the path, it hides an installed package that must not be used."""
    for package in packages:
        os.makedirs(os.path.join(folder, package), exist_ok=True)
        with open(os.path.join(folder, package, "__init__.py"), "w") as f:
            f.write(f"raise ImportError('{package} was imported', name='{package}')\n")
    return str(folder)
