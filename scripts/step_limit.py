"""`benchmark.py limit`: where the trainer's step goes, against the machine's own limit.

The trainer profiles `--steps` steps after its first call (`train.profile_steps`);
its trace's op events (TensorFlow's XPlane) are split by kind of op. Where ops
overlap (two inter-op threads), a moment is shared equally by the kinds running;
a moment with no op running is overhead: Python, the loop, waiting for input.
The FLOPs are the model's own MAC count times 6 (forward, backward-data and
backward-weights), as the `step` rows count them; the matmul peak is this run's.
"""

from __future__ import annotations

import collections
import glob
import os

import timing

from resnet_app.common import run_dir

# Kinds of op by type (their order decides), and the optimizer's ops by name scope.
KINDS = (
    ("convolutions and matmuls", ("Conv2D", "Conv3D", "MatMul", "DepthwiseConv")),
    ("BatchNorm", ("BatchNorm",)),
    ("ReLU", ("Relu",)),
    ("adds", ("AddV2", "AddN", "BiasAdd")),
    ("slices and pads", ("Slice", "Pad", "Concat")),
    ("optimizer and variables", ("ResourceApply", "VariableOp")),
)
OPTIMIZER_SCOPES = ("/momentum/", "/SGD/", "/Adam/", "/AdamW/", "/LAMB/", "/LARS/")
OTHER, IDLE = "other ops", "no op running"


def kind_of(name: str) -> str:
    """An op event's kind, from its "scope/name:Type" name."""
    scope, _, op_type = name.rpartition(":")
    if any(part in scope for part in OPTIMIZER_SCOPES):
        return KINDS[-1][0]
    return next((kind for kind, types in KINDS if any(t in op_type for t in types)), OTHER)


def shares(events: list[tuple[int, int, str]], start: int, stop: int) -> dict[str, float]:
    """Each kind's share of [start, stop): events (begin, end, kind) overlapping in time
    split a moment equally between the kinds running; IDLE gets the moments of none. One
    sweep over the events' ends in time order."""
    changes = sorted(
        (min(max(t, start), stop), step, kind)
        for begin, end, kind in events
        for t, step in ((begin, 1), (end, -1))
    )
    found = dict.fromkeys([*(kind for kind, _ in KINDS), OTHER, IDLE], 0)
    running, time = collections.Counter(), start
    for at, step, kind in [*changes, (stop, 0, IDLE)]:
        if at > time:
            kinds = [k for k, count in running.items() if count] or [IDLE]
            for k in kinds:
                found[k] += (at - time) / len(kinds)
            time = at
        running[kind] += step
    return found


def op_events(profile_dir: str) -> list[tuple[int, int, str]]:
    """The ops of the run's trace: (begin, end, "scope/name:Type"), in ps."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(profile_dir, "**", "*.xplane.pb"), recursive=True)
    space = xplane_pb2.XSpace()
    with open(max(paths, key=os.path.getmtime), "rb") as f:
        space.ParseFromString(f.read())
    plane = next(p for p in space.planes if p.name == "/host:CPU")
    events = []
    for line in plane.lines:
        if not line.name.startswith("tf_Compute"):  # The executor's threads run the ops.
            continue
        for event in line.events:
            name = plane.event_metadata[event.metadata_id].name
            if ":" in name and "::" not in name:  # "scope/name:Type"; not "Executor::Run".
                begin = line.timestamp_ns * 1000 + event.offset_ps
                events.append((begin, begin + event.duration_ps, name))
    return events


def read_trace(profile_dir: str) -> tuple[list[tuple[int, int, str]], int, int]:
    """The op events (begin, end, kind) of the run's trace, in ps, and its start and stop."""
    events = [(begin, end, kind_of(name)) for begin, end, name in op_events(profile_dir)]
    bounds = [e[0] for e in events] + [e[1] for e in events]
    return events, min(bounds), max(bounds)


def breakdown(model_dir: str, steps: int) -> dict[str, float]:
    """Milliseconds per step of each kind, over the run's profiled steps (their sum: the
    trace's first op to its last, per step)."""
    events, start, stop = read_trace(os.path.join(model_dir, run_dir.PROFILE_DIR))
    return {kind: ps / 1e9 / steps for kind, ps in shares(events, start, stop).items()}


def text(report: dict) -> str:
    """Each variant's step against the matmul peak, and its time by kind."""
    flops = report["flops_per_image"] * report["batch_size"]
    lines = [
        f"{timing.cpu_line(report['cpu'])}",
        f"{report['model']} at {report['image_size']} px, batch {report['batch_size']}: "
        f"{flops / 1e9:.1f} GFLOP of convolutions and matmuls per step; matmul peak "
        f"{report['peak_gflops']['float32']:.0f} GFLOP/s float32, "
        f"{timing.number(report['peak_gflops']['bfloat16'], '.0f')} bfloat16",
    ]
    for variant, parts in report["variants"].items():
        peak = report["peak_gflops"]["bfloat16" if variant == "bf16" else "float32"]
        step_ms, conv_ms = sum(parts.values()), parts[KINDS[0][0]]
        step_rate, conv_rate = flops / step_ms / 1e6, flops / conv_ms / 1e6
        rows = [[kind, f"{ms:.2f}", f"{100 * ms / step_ms:.1f}%"] for kind, ms in parts.items()]
        lines += [
            f"\n{variant}: a step in {step_ms:.1f} ms runs {step_rate:.1f} GFLOP/s, "
            f"{100 * step_rate / peak:.1f}% of the matmul peak; its convolutions and matmuls "
            f"alone run at {conv_rate:.1f} GFLOP/s, {100 * conv_rate / peak:.1f}% of it\n",
            timing.markdown_table(["kind", "ms per step", "share"], rows),
        ]
    return "\n".join(lines)
