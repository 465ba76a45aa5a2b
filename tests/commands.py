"""Running the app's commands as a user would, and reading their one-line errors."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_command(command, *args, env=None, unset=(), timeout=300):
    """Runs `python -m MODULE` or `python scripts/X.py` from the repository root.

    Args:
      command: a module ("resnet_app.train") or a path ending in .py.
      *args: its arguments.
      env: extra environment variables.
      unset: environment variables the command must not inherit.
      timeout: seconds before the test fails.
    """
    target = [os.path.join(REPO, command)] if command.endswith(".py") else ["-m", command]
    return _run_python([*target, *args], env, unset, timeout)


def run_code(code, *args, env=None, unset=(), timeout=300):
    """Runs `python -c CODE ARGS` from the repository root, like `run_command`."""
    return _run_python(["-c", code, *args], env, unset, timeout)


def _run_python(argv, env, unset, timeout):
    inherited = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**inherited, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO, **(env or {})},
    )


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
