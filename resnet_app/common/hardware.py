"""The CPU a process runs on (its model, the instruction sets that decide its speed); nvidia-smi.

TF uses oneDNN by default only on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI
or AMX (else its Eigen kernels), and emulates bfloat16, several times slower,
without AVX512_BF16 or AMX. No TensorFlow here: `turn_on_onednn` runs before it loads.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
import sys

# /proc/cpuinfo flag -> the name people use, in order of capability.
ISA_FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_bf16": "AVX512_BF16",
    "amx_bf16": "AMX-BF16",
}
# Values of ONEDNN_MAX_CPU_ISA below which oneDNN uses no bfloat16 instructions.
NO_BF16_CAPS = frozenset(
    {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}
)
# /proc/cpuinfo flags on which TensorFlow turns oneDNN on by default.
ONEDNN_DEFAULT_FLAGS = frozenset(
    {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}
)
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    """What the CPU offers: its model, its `ISA_FLAGS` by usual name, `ONEDNN_MAX_CPU_ISA`
    and `TF_ENABLE_ONEDNN_OPTS` if set, and whether TensorFlow uses oneDNN."""

    model: str
    isa: tuple[str, ...]
    isa_cap: str | None = None
    onednn: bool = True
    onednn_forced: str | None = None

    @property
    def bf16_capped(self) -> bool:
        """Whether `ONEDNN_MAX_CPU_ISA` leaves out the bfloat16 instructions."""
        return bool(self.isa_cap) and self.isa_cap.upper() in NO_BF16_CAPS

    @property
    def native_bf16(self) -> bool:
        """Whether bfloat16 math runs on bfloat16 instructions (AVX512_BF16 or AMX, by oneDNN)."""
        if self.bf16_capped or not self.onednn:
            return False
        return "AVX512_BF16" in self.isa or "AMX-BF16" in self.isa

    def describe(self) -> str:
        """E.g. "AMD EPYC 7B13: AVX2, AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2); oneDNN on"."""
        isa = ", ".join(self.isa) or "no AVX2"
        cap = f" (ONEDNN_MAX_CPU_ISA={self.isa_cap})" if self.isa_cap else ""
        forced = f" ({ONEDNN_VARIABLE}={self.onednn_forced})" if self.onednn_forced else ""
        onednn = f"oneDNN {'on' if self.onednn else 'off: Eigen kernels'}{forced}"
        return f"{self.model or platform.machine()}: {isa}{cap}; {onednn}"

    def to_dict(self) -> dict:
        """For JSON reports."""
        return {**dataclasses.asdict(self), "isa": list(self.isa), "native_bf16": self.native_bf16}

    @classmethod
    def from_dict(cls, data: dict) -> CpuInfo:
        """The `CpuInfo` of a `to_dict` result (`native_bf16` is derived again)."""
        names = [field.name for field in dataclasses.fields(cls)]
        return cls(**{**{name: data[name] for name in names}, "isa": tuple(data["isa"])})


def onednn_enabled(flags: set[str] | frozenset[str], forced: str | None) -> bool:
    """Whether TensorFlow uses oneDNN: `TF_ENABLE_ONEDNN_OPTS` if set, else its default rule."""
    if forced:
        return forced.strip().lower() in ("1", "true")
    return bool(ONEDNN_DEFAULT_FLAGS & set(flags))


def onednn_wins(cpu: CpuInfo, compute_dtype: str) -> bool:
    """Whether to turn oneDNN on where TensorFlow's default left its Eigen kernels: AVX2
    CPUs in float32 (docs/performance.md). Its AVX2 kernels have no bfloat16 or float16
    convolution (TF fails to build one), and a TF_ENABLE_ONEDNN_OPTS that is set stays."""
    eigen = not cpu.onednn and not cpu.onednn_forced
    return eigen and "AVX2" in cpu.isa and compute_dtype == "float32"


def turn_on_onednn(compute_dtype: str) -> str | None:
    """Sets TF_ENABLE_ONEDNN_OPTS=1 where `onednn_wins`, before TensorFlow loads (it reads
    the variable on import); why, for the run's log, or None."""
    cpu = read_cpu_info()
    if "tensorflow" in sys.modules or nvidia_smi("-L") or not onednn_wins(cpu, compute_dtype):
        return None
    os.environ[ONEDNN_VARIABLE] = "1"
    model = cpu.model or "this CPU"
    return (
        f"oneDNN turned on ({ONEDNN_VARIABLE}=1): TensorFlow's default on {model} is its "
        f"Eigen kernels, and oneDNN's AVX2 kernels train faster in fp32; set {ONEDNN_VARIABLE}=0 "
        "to keep Eigen"
    )


def parse_cpuinfo(
    text: str, isa_cap: str | None = None, onednn_forced: str | None = None
) -> CpuInfo:
    """The `CpuInfo` of a /proc/cpuinfo text's first processor, under these variables."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    isa = tuple(name for flag, name in ISA_FLAGS.items() if flag in flags)
    return CpuInfo(
        model=model,
        isa=isa,
        isa_cap=isa_cap or None,
        onednn=onednn_enabled(flags, onednn_forced),
        onednn_forced=onednn_forced or None,
    )


def read_cpu_info(path: str = "/proc/cpuinfo") -> CpuInfo:
    """This machine's `CpuInfo` (model unknown and no flags where /proc is missing)."""
    cap, forced = os.environ.get("ONEDNN_MAX_CPU_ISA"), os.environ.get(ONEDNN_VARIABLE)
    try:
        with open(path) as f:
            return parse_cpuinfo(f.read(), cap, forced)
    except OSError:
        return dataclasses.replace(parse_cpuinfo("", cap, forced), model=platform.processor())


def nvidia_smi(*arguments: str) -> list[str]:
    """The lines `nvidia-smi ARGUMENTS` prints; none without it, or when it fails."""
    if not shutil.which("nvidia-smi"):
        return []
    command = ["nvidia-smi", *arguments]
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=60, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []
