"""A process that has imported TensorFlow once and forks each command the tests run.

Importing TensorFlow and Keras costs seconds of CPU per command. This server imports them (and
nothing of resnet_app, whose import reads the environment) and forks a child per request that
becomes the command: its environment, working directory and argv, stdin from /dev/null, stdout
and stderr to files, the module, script or `-c` code run as `__main__`, exiting as the command
would. No TensorFlow op has run in the server, so each child starts the runtime afresh.
`tests/commands.py` sends a command here only when the variables read at import match the server's.

Protocol: {"ready"} on stdout once imported; then one JSON request a line on stdin ({argv, env,
cwd, stdout, stderr}), answered at once with {"pid"}, and with {"pid", "status"} (a waitpid
status) when that child ends; children run side by side, so statuses come as they end.
"""

import atexit
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import runpy
import select
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402, F401
import numpy  # noqa: E402, F401
import tensorflow  # noqa: E402

# The GPU search prints "failed call to cuInit" where there is none: here, not in each child.
tensorflow.config.list_physical_devices()

# Packages the child finds already imported only when it imports them itself.
PRELOADED = ("tensorflow", "keras", "tf_keras", "tensorboard", "tensorflow_datasets")


class _Preloaded(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Keeps PRELOADED's modules out of sys.modules until the command imports one of them
    (which puts them all back): the app reads `"tensorflow" in sys.modules`, as when fresh."""

    def __init__(self):
        self._hidden = {
            name: sys.modules.pop(name)
            for name in list(sys.modules)
            if name.split(".")[0] in PRELOADED
        }
        self._specs = {name: module.__spec__ for name, module in self._hidden.items()}

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name in self._hidden else None

    def create_module(self, spec):
        module = self._hidden[spec.name]
        sys.modules.update(self._hidden)
        sys.meta_path.remove(self)
        return module

    def exec_module(self, module):
        module.__spec__ = self._specs[module.__name__]


def _serve():
    """Forks a child per request; returns the request in the child, never in the server."""
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    replies.write(b'{"ready": true}\n')
    children = set()
    open_requests = True
    while open_requests or children:
        ready = []
        if open_requests:
            ready, _, _ = select.select([requests], [], [], 0.02 if children else None)
        else:
            time.sleep(0.02)
        if ready:
            line = requests.readline()
            if not line:
                open_requests = False  # The tests are done; wait for the last children.
                continue
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                requests.close()
                replies.close()
                return request
            children.add(pid)
            replies.write(json.dumps({"pid": pid}).encode() + b"\n")
        for pid in list(children):
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                children.discard(pid)
                replies.write(json.dumps({"pid": pid, "status": status}).encode() + b"\n")
    sys.exit(0)


def _become(request):
    """Turns the forked child into the command `request` describes, as `python ARGV` would."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        if fd == 2 and path == request["stdout"]:
            os.dup2(1, 2)  # stderr into stdout's file, as `2>&1`.
            continue
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    preloaded = _Preloaded()
    sys.meta_path.insert(0, preloaded)
    try:
        _run(request["argv"])
    except SystemExit as done:
        status = done.code
    else:
        status = 0
    if preloaded in sys.meta_path:  # The command never imported TensorFlow.
        # As in a fresh interpreter, the libraries the server loaded must not run their exit code.
        _exit_without_libraries(status)
    sys.exit(status)


def _run(argv):
    if argv[0] == "-m":
        sys.path[0] = os.getcwd()
        sys.argv = argv[1:]  # run_module puts the module's file first, as -m does.
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        sys.path[0] = ""
        sys.argv = ["-c", *argv[2:]]
        main = type(sys)("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")


def _exit_without_libraries(status):
    """Python's exit (atexit handlers, flushed output, the status) without the C++ one."""
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status
    else:
        print(status, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code & 0xFF)


if __name__ == "__main__":
    _become(_serve())
