"""`train.precision: auto`: bfloat16 where the hardware computes it natively, else float32.

bf16 on GPUs of compute capability 8.0+ or a CPU with oneDNN's AVX512_BF16 or
AMX; never fp16 (its loss scaling is a choice to make knowingly). GPUs come
from `nvidia-smi` until TensorFlow is loaded.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Sequence

from resnet_app.common import hardware

AUTO = "auto"
BF16_GPU_CAPABILITY = (8, 0)  # Ampere.


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `auto` resolved to, and why (for the start-up line)."""

    precision: str
    reason: str


def choose(cpu: hardware.CpuInfo, gpu_capabilities: Sequence[tuple[int, int]]) -> Choice:
    """The precision `auto` picks for a CPU and the GPUs' (major, minor) compute capabilities
    (none: training runs on the CPU)."""
    if gpu_capabilities:
        lowest = min(tuple(capability) for capability in gpu_capabilities)
        shown = f"{lowest[0]}.{lowest[1]}"
        if lowest >= BF16_GPU_CAPABILITY:
            return Choice("bf16", f"GPU compute capability {shown} has native bfloat16")
        return Choice(
            "fp32",
            f"GPU compute capability {shown} has no native bfloat16 (needs 8.0+); fp16 with "
            "loss scaling only when asked for (train.precision=fp16)",
        )
    model = cpu.model or "this CPU"
    if cpu.native_bf16:
        instructions = "AMX-BF16" if "AMX-BF16" in cpu.isa else "AVX512_BF16"
        return Choice("bf16", f"{model} has {instructions}, which oneDNN uses")
    if not cpu.onednn:
        why = "TensorFlow runs its Eigen kernels here, not oneDNN"
    elif cpu.bf16_capped:
        why = f"ONEDNN_MAX_CPU_ISA={cpu.isa_cap} leaves out its bfloat16 instructions"
    else:
        why = "it has no AVX512_BF16 or AMX"
    return Choice("fp32", f"bfloat16 would be emulated on {model}: {why}")


def _visible(indices: list[int]) -> list[int]:
    """The GPU indices CUDA_VISIBLE_DEVICES leaves visible."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return indices
    kept = []
    for item in visible.split(","):
        item = item.strip()
        if item.startswith(("GPU-", "MIG-")):
            return indices  # UUIDs: not mapped to indices here; all of them.
        if not item.isdigit() or int(item) not in indices:
            break  # CUDA stops at the first invalid entry ("-1", "").
        kept.append(int(item))
    return kept


def _tensorflow_gpus() -> list[tuple[int, int]]:
    import tensorflow as tf

    capabilities = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capabilities.append(tuple(details.get("compute_capability", (0, 0))))
    return capabilities


def _nvidia_smi_gpus() -> list[tuple[int, int]]:
    capabilities = []
    for line in hardware.nvidia_smi("--query-gpu=compute_cap", "--format=csv,noheader"):
        major, _, minor = line.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            capabilities.append((int(major), int(minor)))
    return [capabilities[i] for i in _visible(list(range(len(capabilities))))]


def detect_gpus() -> list[tuple[int, int]]:
    """The compute capabilities of the GPUs training would use (TF's view when loaded)."""
    if "tensorflow" in sys.modules:
        return _tensorflow_gpus()
    return _nvidia_smi_gpus()


@functools.cache
def auto_choice() -> Choice:
    """What `auto` means on this machine (read once per process)."""
    return choose(hardware.read_cpu_info(), detect_gpus())
