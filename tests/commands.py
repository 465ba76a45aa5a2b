"""Running the app's commands as a user would, and reading their one-line errors."""

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_command(command, *args, env=None, unset=(), timeout=300, fresh=False):
    """Runs `python -m MODULE` or `python scripts/X.py` from the repository root.

    Args:
      command: a module ("resnet_app.train") or a path ending in .py.
      *args: its arguments.
      env: extra environment variables.
      unset: environment variables the command must not inherit.
      timeout: seconds before the test fails.
      fresh: a new interpreter even when a fork of tests/zygote.py would do
        (for a test whose subject is what happens while Python starts).
    """
    target = [os.path.join(REPO, command)] if command.endswith(".py") else ["-m", command]
    return _run_python([*target, *args], env, unset, timeout, fresh)


def run_code(code, *args, env=None, unset=(), timeout=300, fresh=False):
    """Runs `python -c CODE ARGS` from the repository root, like `run_command`."""
    return _run_python(["-c", code, *args], env, unset, timeout, fresh)


def _run_python(argv, env, unset, timeout, fresh=False):
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    environment = {**inherited, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO, **(env or {})}
    if not fresh and _forks.matches(environment):
        return _forks.run(argv, environment, REPO, timeout)
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment,
    )


# What Python, TensorFlow and Keras read from the environment when they are imported.
_IMPORT_TIME = ("TF_", "PYTHON", "KERAS_", "CUDA", "XLA_", "OMP_", "MKL_", "KMP_", "LD_", "HOME")


def _import_settings(environment):
    return {
        key: value
        for key, value in environment.items()
        if key.startswith(_IMPORT_TIME) and key != "TF_CONFIG"
    }


class _Forks:
    """The client of tests/zygote.py: a command forked from a process that imported TensorFlow.

    One server per test process, started at the first command; a command whose
    import-time environment differs from the server's runs in a new interpreter.
    """

    def __init__(self):
        self._server = None
        self._settings = None

    def matches(self, environment):
        return self._settings is None or _import_settings(environment) == self._settings

    def _start(self, environment):
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

    def run(self, argv, environment, cwd, timeout):
        if self._server is None or self._server.poll() is not None:
            self._start(environment)
        with tempfile.TemporaryDirectory() as folder:
            outputs = {name: os.path.join(folder, name) for name in ("stdout", "stderr")}
            request = {"argv": argv, "env": environment, "cwd": cwd, **outputs}
            self._server.stdin.write(json.dumps(request).encode() + b"\n")
            self._server.stdin.flush()
            pid = self._reply(timeout)["pid"]
            try:
                status = self._reply(timeout)["status"]
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                self._reply(10)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            texts = {}
            for name, path in outputs.items():
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts[name] = f.read()
        return subprocess.CompletedProcess(
            [sys.executable, *argv], os.waitstatus_to_exitcode(status), **texts
        )

    def _reply(self, timeout):
        ready, _, _ = select.select([self._server.stdout], [], [], timeout)
        if not ready:
            raise subprocess.TimeoutExpired("tests.zygote", timeout)
        line = self._server.stdout.readline()
        if not line:
            raise RuntimeError("tests/zygote.py ended without answering")
        return json.loads(line)


_forks = _Forks()


def error_line(result):
    """The one `error: ...` line of a failed command; asserts exit 2 and no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def blocked_packages(folder, *packages):
    """A folder for PYTHONPATH in which each of `packages` raises ImportError when imported.

    First on the path, it stands in for a package that is installed but must
    not be used (TensorFlow before a mistake is answered, resnet_app where an
    export runs on its own).
    """
    for package in packages:
        os.makedirs(os.path.join(folder, package), exist_ok=True)
        with open(os.path.join(folder, package, "__init__.py"), "w") as f:
            f.write(f"raise ImportError('{package} was imported', name='{package}')\n")
    return str(folder)
