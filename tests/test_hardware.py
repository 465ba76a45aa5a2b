"""The CPU description: model, instruction sets, oneDNN, native bfloat16, the bf16 warning."""

import logging

import pytest

from resnet_app.common import hardware
from tests import runs
from tests.commands import run_code

AVX512_BF16 = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse4_1 avx avx2 fma avx512f avx512dq avx512_bf16 amx_bf16 amx_tile

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse4_1 avx avx2 fma avx512f avx512dq avx512_bf16 amx_bf16 amx_tile
"""
AVX2 = """processor\t: 0
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse4_1 avx avx2 fma
"""


def test_an_avx512_bf16_cpu_has_native_bf16():
    cpu = hardware.parse_cpuinfo(AVX512_BF16)
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"
    assert cpu.isa == ("AVX2", "AVX-512", "AVX512_BF16", "AMX-BF16")
    assert cpu.native_bf16
    assert cpu.onednn  # TensorFlow's rule: AVX512_BF16 or AMX turn it on.
    assert cpu.describe() == f"{cpu.model}: AVX2, AVX-512, AVX512_BF16, AMX-BF16; oneDNN on"


def test_an_avx2_cpu_emulates_bf16():
    cpu = hardware.parse_cpuinfo(AVX2)
    assert (cpu.model, cpu.isa) == ("AMD EPYC 7B12", ("AVX2",))
    assert not cpu.native_bf16
    assert not cpu.onednn  # No VNNI, bfloat16 or AMX: TensorFlow's own Eigen kernels.
    assert cpu.describe() == "AMD EPYC 7B12: AVX2; oneDNN off: Eigen kernels"


@pytest.mark.parametrize(
    "cap, native_bf16", [("AVX2", False), ("avx512_core", False), ("AVX512_CORE_AMX", True)]
)
def test_an_isa_cap_removes_what_it_caps(cap, native_bf16):
    cpu = hardware.parse_cpuinfo(AVX512_BF16, isa_cap=cap)
    assert cpu.native_bf16 == native_bf16
    assert cpu.describe().endswith(f"(ONEDNN_MAX_CPU_ISA={cap}); oneDNN on")


@pytest.mark.parametrize("value, onednn", [("0", False), ("false", False), ("1", True)])
def test_tf_enable_onednn_opts_decides_over_the_cpu(value, onednn):
    for text in (AVX512_BF16, AVX2):
        cpu = hardware.parse_cpuinfo(text, onednn_forced=value)
        assert cpu.onednn == onednn
        assert cpu.describe().endswith(f"(TF_ENABLE_ONEDNN_OPTS={value})")
    # bfloat16 instructions are only used through oneDNN.
    assert hardware.parse_cpuinfo(AVX512_BF16, onednn_forced=value).native_bf16 == onednn


@pytest.mark.parametrize(
    "cpu",
    [
        hardware.parse_cpuinfo(AVX512_BF16),
        hardware.parse_cpuinfo(AVX2, isa_cap="AVX2", onednn_forced="1"),
    ],
)
def test_a_json_report_reads_back_as_the_same_cpu(cpu):
    # scripts/benchmark.py describes the CPU of its JSON report this way.
    assert hardware.CpuInfo.from_dict(cpu.to_dict()) == cpu


@pytest.mark.parametrize("value", [None, "0", "1"])
def test_the_onednn_rule_agrees_with_tensorflow_here(value):
    """TensorFlow's own answer on this machine, in a fresh process, against the rule."""
    env = {} if value is None else {hardware.ONEDNN_VARIABLE: value}
    code = (
        "from tensorflow.python.util import _pywrap_util_port as port\n"
        "from resnet_app.common import hardware\n"
        "print(port.IsMklEnabled(), hardware.read_cpu_info().onednn)"
    )
    result = run_code(code, env=env, unset=(hardware.ONEDNN_VARIABLE,))
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout.split()
    assert out[0] == out[1], out


def test_bf16_training_on_a_cpu_without_it_warns_once_with_the_cost(caplog):
    from resnet_app.engine import setup

    with caplog.at_level(logging.WARNING):
        setup.warn_if_bf16_is_emulated(hardware.parse_cpuinfo(AVX2))
        setup.warn_if_bf16_is_emulated(hardware.parse_cpuinfo(AVX512_BF16))
        setup.warn_if_bf16_is_emulated(hardware.parse_cpuinfo(AVX512_BF16, onednn_forced="0"))
    first, without_onednn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "AMD EPYC 7B12: AVX2" in first and "--precision=fp32" in first
    assert "5x slower" in first
    assert "TF_ENABLE_ONEDNN_OPTS=0" in without_onednn


NO_AVX2 = """processor\t: 0
model name\t: Intel(R) Core(TM)2 Duo CPU
flags\t\t: fpu sse4_1
"""


@pytest.mark.parametrize(
    "text, forced, dtype, wins",
    [
        (AVX2, None, "float32", True),
        (AVX2, None, "bfloat16", False),  # oneDNN's AVX2 kernels: no bfloat16 convolution.
        (AVX2, None, "float16", False),
        (AVX2, "0", "float32", False),  # The user's setting stays.
        (AVX512_BF16, None, "float32", False),  # TensorFlow turns oneDNN on itself.
        (NO_AVX2, None, "float32", False),
    ],
)
def test_onednn_is_turned_on_for_float32_where_tensorflow_left_eigen_on_avx2(
    text, forced, dtype, wins
):
    assert hardware.onednn_wins(hardware.parse_cpuinfo(text, onednn_forced=forced), dtype) == wins


@pytest.mark.parametrize(
    "precision, turned_on",
    [("auto", True), pytest.param("bf16", False, marks=pytest.mark.slow)],  # A process each.
)
def test_the_trainer_turns_onednn_on_before_tensorflow_loads(tmp_path, precision, turned_on):
    """A fresh `resnet_app.train` on an AVX2-only CPU (its cpuinfo text): TensorFlow loads
    with TF_ENABLE_ONEDNN_OPTS=1 in fp32, and the run's start record says so."""
    code = (
        "import os, sys\n"
        "from resnet_app.common import cli, hardware\n"
        "hardware.read_cpu_info = lambda: hardware.parse_cpuinfo(\n"
        f"    {AVX2!r}, None, os.environ.get(hardware.ONEDNN_VARIABLE))\n"
        "from resnet_app import train\n"
        "sys.argv[0] = 'train'\n"
        "try:\n"
        "    cli.run(train.main)\n"
        "finally:\n"
        "    import tensorflow.python.util._pywrap_util_port as port\n"
        "    print(os.environ.get(hardware.ONEDNN_VARIABLE), port.IsMklEnabled())\n"
    )
    args = ["--dataset=shapes", "--model=tiny", f"--model_dir={tmp_path}", "--train_steps=2"]
    args += ["--set=data.eval_examples=8", f"--set=train.precision={precision}"]
    result = run_code(code, *args, unset=(hardware.ONEDNN_VARIABLE,), fresh=True)
    assert result.returncode == 0, result.stderr[-2000:]
    start = next(r for r in runs.read_records(tmp_path) if r.get("event") == "start")
    assert ("oneDNN turned on (TF_ENABLE_ONEDNN_OPTS=1)" in result.stderr) == turned_on
    assert ("(TF_ENABLE_ONEDNN_OPTS=1)" in start["devices"]) == turned_on
    if turned_on:
        assert result.stdout.split()[-2:] == ["1", "True"]
    if precision == "auto":  # Resolved before, and its reason given after, the choice.
        assert "auto: fp32, as bfloat16 would be emulated on AMD EPYC 7B12: it has no" in (
            result.stderr
        )
