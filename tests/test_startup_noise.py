"""TensorFlow's harmless start-up lines are filtered at the file-descriptor level, nothing else.

The lines are the ones TF 2.21 printed here (AMD EPYC, no GPU) and on an
Intel Xeon without a GPU, as the issue quotes them.
"""

import os
import subprocess
import sys

import pytest

from resnet_app.common import startup_noise
from tests.commands import REPO, error_line, run_command
from tests.runs import read_records

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1796225889.844840    1910 port.cc:153] oneDNN custom operations are on. You "
    "may see slightly different numerical results due to floating-point round-off errors from "
    "different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1796225889.845347    1910 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "I0000 00:00:1796225889.925187    1910 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX_VNNI FMA, in "
    "other operations, rebuild TensorFlow with the appropriate compiler flags.",
]
CUINIT = (
    "E0000 00:00:1796225892.862310    1910 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)"
)
MUST_PASS = [
    "error: --dataset=folder:/x: /x is not a directory",
    "E0000 00:00:1796225893.000000    1910 cuda_dnn.cc:8579] Unable to register cuDNN factory",
    "W0000 00:00:1796225893.000000    1910 gpu_device.cc:2344] Cannot dlopen some GPU libraries.",
    "I1202 15:39:46.932521 140395833191296 distribute.py:229] One device: /cpu:0",
    "Traceback (most recent call last):",
    "oneDNN custom operations are on.",  # Not TF's line: no C++ prefix.
    "",
]


@pytest.mark.parametrize("line", [*NOISE, CUINIT])
def test_the_known_lines_are_harmless(line):
    assert startup_noise.is_harmless(line, gpu=False)


def test_cuinit_passes_where_there_is_a_gpu():
    assert not startup_noise.is_harmless(CUINIT, gpu=True)
    assert all(startup_noise.is_harmless(line, gpu=True) for line in NOISE)


@pytest.mark.parametrize("line", MUST_PASS)
def test_other_lines_pass(line):
    assert not startup_noise.is_harmless(line, gpu=False)


def test_the_filter_keeps_bytes_and_order_across_chunks():
    stream = "\n".join([MUST_PASS[0], *NOISE, MUST_PASS[3], CUINIT, "last, unfinished"]).encode()
    line_filter = startup_noise.LineFilter(gpu=False)
    out = b"".join(line_filter.feed(stream[i : i + 7]) for i in range(0, len(stream), 7))
    out += line_filter.finish()
    assert out.decode() == f"{MUST_PASS[0]}\n{MUST_PASS[3]}\nlast, unfinished"


# A stand-in for TensorFlow, first on PYTHONPATH: while it loads it writes
# $NOISE_TEXT to fd 2, as TF's C++ code does, then what $LOADING says.
SHIM = """
import ctypes, os
os.write(2, os.environ.get("NOISE_TEXT", "").encode())
loading = os.environ.get("LOADING", "")
if loading == "abort":  # A C++ `Check failed` and abort.
    os.write(2, b"F0000 check.cc:1] Check failed: the shim's own\\n")
    os.abort()
if loading == "bytes":  # Not UTF-8, as a library's junk or a file name can be.
    os.write(2, b"\\xff\\xfe not UTF-8: \\x80\\xc3(\\n")
if loading == "large":  # 1 MiB from C code that holds the GIL (PyDLL keeps it).
    line = b"x" * 1023 + b"\\n"
    ctypes.PyDLL(None).write(2, line * 1024, 1024 * len(line))
"""

WRITER = """
import os, sys
from resnet_app.common import startup_noise
startup_noise.install()
import tensorflow
sys.stderr.write("error: the one line\\n")
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    """A folder for PYTHONPATH whose `tensorflow` is SHIM."""
    folder = tmp_path_factory.mktemp("shim")
    (folder / "tensorflow").mkdir()
    (folder / "tensorflow" / "__init__.py").write_text(SHIM)
    return folder


def _environment(shim, **env):
    """This process's environment, with SHIM's `tensorflow` first on PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{REPO}", **env}


def _python(code, shim, *args, **env):
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        cwd=REPO,
        env=_environment(shim, **env),
        timeout=120,  # A hang fails the test.
    )


def _fd_run(shim, **env):
    text = "\n".join([*NOISE, MUST_PASS[1], CUINIT, ""])
    result = _python(WRITER, shim, NOISE_TEXT=text, **env)
    return result.returncode, result.stderr.decode()


def test_at_the_descriptor_the_noise_goes_and_the_rest_stays(shim):
    status, stderr = _fd_run(shim)
    gpu = startup_noise.has_nvidia_device()
    expected = [MUST_PASS[1], *([CUINIT] if gpu else []), "error: the one line"]
    assert status == 0 and stderr.splitlines() == expected


def test_the_environment_variable_shows_everything(shim):
    _, stderr = _fd_run(shim, **{startup_noise.SHOW_ENV: "show"})
    assert stderr.splitlines() == [*NOISE, MUST_PASS[1], CUINIT, "error: the one line"]


def test_what_comes_before_a_crash_while_tensorflow_loads_reaches_the_output(shim):
    text = "\n".join([NOISE[0], MUST_PASS[1], ""])
    result = _python(WRITER, shim, NOISE_TEXT=text, LOADING="abort")
    assert result.returncode < 0  # Aborted.
    lines = result.stderr.decode().splitlines()
    assert lines == [MUST_PASS[1], "F0000 check.cc:1] Check failed: the shim's own"]


def test_a_large_write_while_holding_the_gil_passes_whole(shim):
    """The old filter's reader was a thread: it needed the GIL the writer held."""
    result = _python(WRITER, shim, LOADING="large")
    assert result.returncode == 0, result.stderr[-500:]
    lines = result.stderr.decode().splitlines()
    assert lines == ["x" * 1023] * 1024 + ["error: the one line"]


def test_bytes_that_are_not_utf8_pass_whole(shim):
    result = _python(WRITER, shim, NOISE_TEXT=f"{NOISE[0]}\n", LOADING="bytes")
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stderr == b"\xff\xfe not UTF-8: \x80\xc3(\nerror: the one line\n"


def test_a_pipe_closed_while_tensorflow_loads_blocks_nothing(shim):
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER],
        stderr=subprocess.PIPE,
        cwd=REPO,
        env=_environment(shim, LOADING="large"),
    )
    process.stderr.close()  # The reader went away before the 1 MiB was written.
    process.wait(timeout=120)  # A filter blocked on the pipe fails the test here.


# After the window: stdout and stderr alternate, a `\r` progress line, and
# whether stderr is still the terminal.
AFTER = """
import os, sys
from resnet_app.common import startup_noise
startup_noise.install()
import tensorflow
print(os.isatty(2), sys.stderr.isatty(), flush=True)
for i in range(50):
    print("out", i, flush=True)
    sys.stderr.write(f"err {i}\\n")
    sys.stderr.flush()
sys.stderr.write("10%\\r20%\\r")
"""


def test_after_tensorflow_loads_stderr_is_the_process_own(shim):
    result = subprocess.run(
        [sys.executable, "-c", AFTER],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # One pipe, as `>f 2>&1`: the order is the writes'.
        cwd=REPO,
        env=_environment(shim),
        timeout=120,
    )
    lines = result.stdout.decode().split("\n")
    assert lines[0] == "False False"  # A pipe here; the pty test below sees a terminal.
    expected = [f"{kind} {i}" for i in range(50) for kind in ("out", "err")]
    assert lines[1:-1] == expected and lines[-1] == "10%\r20%\r"


def test_a_terminal_stays_a_terminal(shim):
    import pty

    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-c", AFTER],
        stdout=subprocess.PIPE,
        stderr=follower,
        cwd=REPO,
        env=_environment(shim),
    )
    os.close(follower)
    first = process.stdout.readline()
    os.set_blocking(leader, False)
    process.communicate(timeout=120)
    os.close(leader)
    assert first == b"True True\n"


def test_a_closed_output_pipe_never_stops_training(tmp_path):
    """`resnet-app train ... 2>&1 | head -1`: the reader goes away after one line.

    The run logs every step (more than a pipe holds), and must end as without
    the pipe: every step trained, the last checkpoint saved.
    """
    steps = 600
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resnet_app.train",
            "--dataset=shapes",
            "--model=tiny",
            "--batch_size=4",
            f"--train_steps={steps}",
            "--log_every=1",
            f"--eval_every={steps}",
            "--set=data.train_examples=32",
            "--set=data.eval_examples=8",
            "--set=data.image_size=16",
            f"--set=data.data_dir={tmp_path / 'data'}",
            f"--model_dir={tmp_path / 'run'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    process.stderr.readline()
    process.stderr.close()  # As `head -1` exits.
    process.wait(timeout=600)  # The old filter blocked here for good.
    records = read_records(tmp_path / "run")
    assert max(r["step"] for r in records if "loss" in r) == steps
    assert (tmp_path / "run" / f"ckpt-{steps}.index").exists()


def test_an_error_after_tensorflow_loads_shows_no_startup_lines(tiny_run):
    _, model_dir = tiny_run
    args = (f"--model_dir={model_dir}", "--checkpoint=ckpt-99")
    # A new interpreter each: what TensorFlow prints while it loads is the subject.
    quiet = run_command("resnet_app.evaluate", *args, fresh=True)
    assert "one of: ckpt-2, ckpt-4" in error_line(quiet)
    assert not [
        line for line in quiet.stderr.splitlines() if startup_noise.is_harmless(line, False)
    ]
    # TensorFlow did print some here: with --verbosity=1 they are all shown.
    loud = run_command("resnet_app.evaluate", *args, "--verbosity=1", fresh=True)
    shown = [line for line in loud.stderr.splitlines() if startup_noise.is_harmless(line, False)]
    assert shown, loud.stderr


def test_what_the_filter_holds_is_written_before_a_hard_exit(shim):
    code = (
        "import os, sys\n"
        "from resnet_app.common import startup_noise\n"
        "startup_noise.install()\n"
        "import tensorflow\n"
        "sys.stderr.write('Second SIGINT: exiting now\\n')\n"
        "startup_noise.restore()\n"
        "os._exit(130)\n"
    )
    result = _python(code, shim, NOISE_TEXT=NOISE[0] + "\n")
    assert result.returncode == 130
    assert result.stderr.decode().splitlines() == ["Second SIGINT: exiting now"]
