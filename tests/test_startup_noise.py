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


WRITER = """
import os, sys
from resnet_app.common import startup_noise
startup_noise.install()
os.write(2, sys.argv[1].encode())   # As TensorFlow's C++ writes: to the descriptor.
sys.stderr.write("error: the one line\\n")
"""


def _fd_run(env):
    text = "\n".join([*NOISE, MUST_PASS[1], CUINIT, ""])
    return subprocess.run(
        [sys.executable, "-c", WRITER, text],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, **env},
    )


def test_at_the_descriptor_the_noise_goes_and_the_rest_stays():
    result = _fd_run({})
    gpu = startup_noise.has_nvidia_device()
    expected = [MUST_PASS[1], *([CUINIT] if gpu else []), "error: the one line"]
    assert result.stderr.splitlines() == expected


def test_the_environment_variable_shows_everything():
    result = _fd_run({startup_noise.SHOW_ENV: "show"})
    assert result.stderr.splitlines() == [*NOISE, MUST_PASS[1], CUINIT, "error: the one line"]


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


def test_what_the_filter_holds_is_written_before_a_hard_exit():
    code = (
        "import os, sys\n"
        "from resnet_app.common import startup_noise\n"
        "startup_noise.install()\n"
        f"os.write(2, {NOISE[0]!r}.encode() + b'\\n')\n"
        "sys.stderr.write('Second SIGINT: exiting now\\n')\n"
        "startup_noise.restore()\n"
        "os._exit(130)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert result.returncode == 130
    assert result.stderr.splitlines() == ["Second SIGINT: exiting now"]
