"""Grouped 3x3 convs on CPU: each exact formulation of resnet_app/nets/grouped_conv.py, timed.

    python scripts/grouped_conv_benchmark.py                      # float32, batch 16
    TF_ENABLE_ONEDNN_OPTS=0 python scripts/grouped_conv_benchmark.py
    python scripts/grouped_conv_benchmark.py --dtype=bfloat16 --formulations=native,block_diagonal

For each of ResNeXt-50 32x4d's grouped 3x3 convs (widths 128, 256, 512, 1024
at 56, 28, 14, 7 px, 32 groups; "/2" the stride-2 conv of a stage's first
block, padded 1 on each side and run VALID, as the app's symmetric padding
does) and each formulation, one training step of that conv alone is timed:
forward, then the gradients with respect to the input and the kernel (a fixed
random upstream gradient), in a `tf.function`, after a warm-up, as the median
of --windows windows of about --window_seconds each. Beside it, ResNet-50's
dense 3x3 conv of that stage (half the width) is timed the same way.

Formulations too slow to time at --batch (--slow, by default native_xla, the
path `keras.layers.Conv2D(groups=...)` takes) are timed at --slow_batch and
scaled to --batch (marked "~"). One that fails (native's gradient without
oneDNN) is marked "fails".

Exactness, on a --check_batch input: the max abs difference of the output and
of both gradients against native (native_xla where native fails), and against
a float64 block-diagonal reference, each relative to the reference's max abs
value. In bfloat16 the references stay float32 native and float64.

Then the whole-network sum: ResNeXt-50 runs 16 grouped convs (3, 4, 6, 3
blocks; a stride-2 conv first in stages 2-4), ResNet-50 16 dense 3x3 convs of
half the width: each formulation's per-conv times summed over them.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from absl import app, flags

_FORMULATIONS = flags.DEFINE_list(
    "formulations",
    None,
    "Formulations to run (default: every one in grouped_conv_alternatives.py).",
)
_SHAPES = flags.DEFINE_list("shapes", None, "Shapes to run, e.g. s1,s2/2 (default: all).")
_BATCH = flags.DEFINE_integer("batch", 16, "Batch of the timed steps.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
_WINDOWS = flags.DEFINE_integer("windows", 5, "Timed windows (median).")
_WINDOW_SECONDS = flags.DEFINE_float("window_seconds", 0.3, "Length of a window, about.")
_SLOW = flags.DEFINE_list("slow", ["native_xla"], "Formulations timed at --slow_batch.")
_SLOW_BATCH = flags.DEFINE_integer("slow_batch", 2, "Their batch; times are scaled to --batch.")
_CHECK_BATCH = flags.DEFINE_integer("check_batch", 2, "Batch of the exactness check.")
_JIT = flags.DEFINE_boolean(
    "jit", False, "Compile each whole step with XLA (jit_compile=True), as the app's jit variant."
)
_GROUPS = 32

# name: (input size, grouped width, stride, convs of this shape in ResNeXt-50 / ResNet-50)
SHAPES = {
    "s1": (56, 128, 1, 3),
    "s2/2": (56, 256, 2, 1),
    "s2": (28, 256, 1, 3),
    "s3/2": (28, 512, 2, 1),
    "s3": (14, 512, 1, 5),
    "s4/2": (14, 1024, 2, 1),
    "s4": (7, 1024, 1, 2),
}
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_line() -> str:
    model, present = "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "?":
                    model = value.strip()
                elif key.strip() == "flags" and not present:
                    present = set(value.split())
    except OSError:
        pass
    marks = " ".join(f"{flag}={'yes' if flag in present else 'no'}" for flag in CPU_FLAGS)
    return f"CPU: {model}, {os.cpu_count()} cores; {marks}"


def onednn_line() -> str:
    from tensorflow.python.util import _pywrap_util_port

    variable = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    active = _pywrap_util_port.IsMklEnabled()
    return (
        f"oneDNN: {'on' if active else 'off (Eigen kernels)'}; TF_ENABLE_ONEDNN_OPTS="
        f"{variable if variable is not None else 'unset (TF default: on only with AVX512_VNNI, '}"
        f"{'' if variable is not None else 'AVX512_BF16, AVX_VNNI or AMX)'}"
    )


def make_step(fn, groups: int, stride: int, dtype):
    """A tf.function: (x, kernel variable, upstream) -> (y, dx, dkernel)."""
    import tensorflow as tf

    def step(x, kernel, upstream):
        with tf.GradientTape() as tape:
            tape.watch(x)
            if stride > 1:  # the app's symmetric padding: pad 1 on each side, then VALID
                y = fn(
                    tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]),
                    tf.cast(kernel, dtype),
                    groups,
                    stride,
                    "VALID",
                )
            else:
                y = fn(x, tf.cast(kernel, dtype), groups, stride, "SAME")
            loss = tf.reduce_sum(tf.cast(y, upstream.dtype) * upstream)
        dx, dkernel = tape.gradient(loss, [x, kernel])
        return y, dx, dkernel

    return tf.function(step, jit_compile=_JIT.value or None)


def inputs(batch: int, size: int, width: int, in_per_group: int, stride: int, dtype, seed: int):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((batch, size, size, width), np.float32))
    kernel = tf.Variable(
        rng.standard_normal((3, 3, in_per_group, width), np.float32)
        * np.sqrt(2 / (9 * in_per_group))
    )
    out = size // stride
    upstream = tf.constant(rng.standard_normal((batch, out, out, width), np.float32))
    return tf.cast(x, dtype), kernel, upstream


def time_step(step, args, warmed: bool = False) -> float:
    """Seconds per step: the median of the windows after a warm-up (none if `warmed`)."""
    if not warmed:
        step(*args)  # trace and warm
    start = time.perf_counter()
    step(*args)
    first = time.perf_counter() - start
    if first > 2 * _WINDOW_SECONDS.value:  # slow: single steps, about 3 s of them
        times = [first]
        for _ in range(min(_WINDOWS.value, int(3 / first)) - 1):
            start = time.perf_counter()
            step(*args)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    count = max(1, round(_WINDOW_SECONDS.value / first))
    times = []
    for _ in range(_WINDOWS.value):
        start = time.perf_counter()
        for _ in range(count):
            step(*args)
        times.append((time.perf_counter() - start) / count)
    return statistics.median(times)


def rel_errors(results, reference) -> tuple[float, float, float]:
    import numpy as np

    return tuple(
        float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))
        for a, b in zip(results, reference)
    )


def run_shape(name: str, names: list[str]) -> dict:
    import grouped_conv_alternatives  # Next to this script.
    import numpy as np
    import tensorflow as tf

    from resnet_app.nets import grouped_conv

    size, width, stride, _ = SHAPES[name]
    dtype = tf.as_dtype(_DTYPE.value)
    per_group = width // _GROUPS
    row = {"time": {}, "err_native": {}, "err_fp64": {}, "failed": set(), "scaled": set()}

    # Exactness on a small batch.
    x, kernel, upstream = inputs(_CHECK_BATCH.value, size, width, per_group, stride, tf.float64, 1)
    ref64 = [
        t.numpy()
        for t in make_step(grouped_conv.block_diagonal, _GROUPS, stride, tf.float64)(
            x, tf.Variable(tf.cast(kernel, tf.float64)), tf.cast(upstream, tf.float64)
        )
    ]
    x32 = tf.cast(x, tf.float32)
    native_ref = None
    steps, float32_results = {}, {}

    def get_step(formulation):
        if formulation not in steps:
            conv = grouped_conv_alternatives.FORMULATIONS[formulation]
            steps[formulation] = make_step(conv, _GROUPS, stride, dtype)
        return steps[formulation]

    for ref_name in ("native", "native_xla"):
        try:
            if dtype == tf.float32:
                step = get_step(ref_name)
            else:
                step = make_step(
                    grouped_conv_alternatives.FORMULATIONS[ref_name], _GROUPS, stride, tf.float32
                )
            native_ref = [t.numpy().astype(np.float64) for t in step(x32, kernel, upstream)]
            row["reference"] = ref_name
            float32_results[ref_name] = native_ref
            break
        except tf.errors.InvalidArgumentError:
            row["failed"].add(ref_name)
    for formulation in names:
        if formulation in row["failed"]:
            continue
        if dtype == tf.float32 and formulation in float32_results:
            results = float32_results[formulation]
        else:
            try:
                results = [
                    t.numpy() for t in get_step(formulation)(tf.cast(x, dtype), kernel, upstream)
                ]
            except tf.errors.InvalidArgumentError:
                row["failed"].add(formulation)
                continue
        row["err_native"][formulation] = rel_errors(results, native_ref)
        row["err_fp64"][formulation] = rel_errors(results, ref64)

    # Timing.
    dense = make_step(grouped_conv.native, 1, stride, dtype)
    row["dense"] = time_step(
        dense, inputs(_BATCH.value, size, width // 2, width // 2, stride, dtype, 2)
    )
    for formulation in names:
        if formulation in row["failed"]:
            continue
        batch = _SLOW_BATCH.value if formulation in _SLOW.value else _BATCH.value
        # The check ran the reference's step at its shape: no second warm-up for a slow one.
        warmed = formulation in float32_results and batch == _CHECK_BATCH.value
        args = inputs(batch, size, width, per_group, stride, dtype, 2)
        seconds = time_step(get_step(formulation), args, warmed)
        if batch != _BATCH.value:
            seconds *= _BATCH.value / batch
            row["scaled"].add(formulation)
        row["time"][formulation] = seconds
    return row


def main(argv: list[str]) -> None:
    del argv
    import grouped_conv_alternatives  # Next to this script.
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # one tf.function per formulation: retracing warnings
    names = _FORMULATIONS.value or list(grouped_conv_alternatives.FORMULATIONS)
    shapes = _SHAPES.value or list(SHAPES)
    for name in names:
        if name not in grouped_conv_alternatives.FORMULATIONS:
            raise app.UsageError(f"unknown formulation {name!r}")
    for name in shapes:
        if name not in SHAPES:
            raise app.UsageError(f"unknown shape {name!r}")
    print(cpu_line())
    print(onednn_line())
    print(
        f"TF {tf.__version__}, {_DTYPE.value}, batch {_BATCH.value}, groups {_GROUPS}, "
        f"{'whole step XLA-compiled, ' if _JIT.value else ''}"
        f"forward + both gradients, ms/step (median of {_WINDOWS.value} windows)"
    )
    start = time.perf_counter()
    rows = {}
    for shape in shapes:
        rows[shape] = row = run_shape(shape, names)
        size, width, stride, _ = SHAPES[shape]
        native = row["time"].get("native")
        xla = row["time"].get("native_xla")
        print(
            f"\n{shape}: {size}px in, width {width} ({width // _GROUPS}/group), stride {stride}; "
            f"ResNet-50 dense {width // 2}: {row['dense'] * 1e3:.1f} ms; "
            f"exactness vs {row.get('reference')}"
        )
        print(
            f"  {'formulation':<15}{'ms':>10}{'x native':>10}{'x xla':>8}{'x R50':>8}"
            f"   rel err vs native (y, dx, dk)    vs float64 (y, dx, dk)"
        )
        for name in names:
            if name in row["failed"]:
                print(f"  {name:<15}{'fails':>10}")
                continue
            ms = row["time"][name] * 1e3
            mark = "~" if name in row["scaled"] else ""
            ratio = f"{row['time'][name] / native:.2f}" if native else "-"
            ratio_xla = f"{row['time'][name] / xla:.3f}" if xla else "-"
            errors = " ".join(f"{e:.1e}" for e in row["err_native"][name])
            errors64 = " ".join(f"{e:.1e}" for e in row["err_fp64"][name])
            print(
                f"  {name:<15}{mark + f'{ms:.1f}':>10}{ratio:>10}{ratio_xla:>8}"
                f"{row['time'][name] / row['dense']:>8.2f}   {errors}    {errors64}"
            )
        sys.stdout.flush()

    if set(shapes) == set(SHAPES):
        dense_sum = sum(rows[s]["dense"] * SHAPES[s][3] for s in SHAPES)
        print(f"\nWhole network, 16 convs: ResNet-50's dense 3x3 convs {dense_sum * 1e3:.0f} ms")
        best = 0.0
        for name in names:
            if any(name not in rows[s]["time"] for s in SHAPES):
                print(f"  {name:<15}{'fails':>10}")
                continue
            total = sum(rows[s]["time"][name] * SHAPES[s][3] for s in SHAPES)
            print(f"  {name:<15}{total * 1e3:>10.0f} ms  x R50 {total / dense_sum:.2f}")
        picks = {s: min(rows[s]["time"], key=rows[s]["time"].get) for s in SHAPES}
        best = sum(rows[s]["time"][picks[s]] * SHAPES[s][3] for s in SHAPES)
        print(
            f"  {'best per shape':<15}{best * 1e3:>10.0f} ms  x R50 {best / dense_sum:.2f}  "
            + ", ".join(f"{s}: {p}" for s, p in picks.items())
        )
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    app.run(main)
