"""The CPU description: model, instruction sets, native bfloat16, and the bf16 warning."""

import logging

import pytest

from resnet_app.common import hardware

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
    assert cpu.native_bf16 and cpu.avx512
    assert cpu.describe() == f"{cpu.model}: AVX2, AVX-512, AVX512_BF16, AMX-BF16"


def test_an_avx2_cpu_emulates_bf16():
    cpu = hardware.parse_cpuinfo(AVX2)
    assert (cpu.model, cpu.isa) == ("AMD EPYC 7B12", ("AVX2",))
    assert not cpu.native_bf16 and not cpu.avx512


@pytest.mark.parametrize(
    "cap, native_bf16, avx512",
    [("AVX2", False, False), ("avx512_core", False, True), ("AVX512_CORE_AMX", True, True)],
)
def test_an_isa_cap_removes_what_it_caps(cap, native_bf16, avx512):
    cpu = hardware.parse_cpuinfo(AVX512_BF16, isa_cap=cap)
    assert (cpu.native_bf16, cpu.avx512) == (native_bf16, avx512)
    assert cpu.describe().endswith(f"(ONEDNN_MAX_CPU_ISA={cap})")


def test_bf16_training_on_a_cpu_without_it_warns_once_with_the_cost(caplog):
    from resnet_app.engine import setup

    with caplog.at_level(logging.WARNING):
        setup.warn_if_bf16_is_emulated(hardware.parse_cpuinfo(AVX2))
        setup.warn_if_bf16_is_emulated(hardware.parse_cpuinfo(AVX512_BF16))
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "AMD EPYC 7B12: AVX2" in warning and "--precision=fp32" in warning
    assert "5x slower" in warning
