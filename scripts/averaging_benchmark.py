"""All-reduce against model averaging: collectives, bytes and images/sec per step.

  python scripts/averaging_benchmark.py [--model=resnet20] [--towers=2] [--intervals=1,4,16]

Trains the same model with the trainer's step (`step.TrainStep`) on `--towers`
logical CPU devices (MirroredStrategy), once with the gradient all-reduce and
once with model averaging for each interval K, on random 32x32 images, and
prints one row each:
- collectives/step: cross-replica collective ops executed per step, counted
  in a profiler trace of one call of `--steps` steps (one per all-reduce, not
  per replica);
- bytes/step: what one replica sends into them per step, from the sizes of
  those ops' inputs in the traced graph (a ring all-reduce moves about twice
  that over each link);
- images/sec: the median of `--windows` timed calls of `--steps` steps each,
  after a warm-up call.
Ratios are against the all-reduce row. Model averaging moves the weights and
the optimizer slots (2x the parameters with momentum) once every K steps; the
all-reduce moves the gradients (1x) and the example count every step. Within
one machine the per-step metrics reach one device by copies, not a
collective, so they are not counted (across workers they are one collective
of 16 bytes per step). On this shared 2-core CPU the towers compete for the
same cores, and a collective costs little next to the step, so images/sec
shows the cost of the computation more than that of the communication.
"""

import collections
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time

from absl import flags

from resnet_app.common import cli

_MODEL = flags.DEFINE_string("model", "resnet20", "A model preset.")
_TOWERS = flags.DEFINE_integer("towers", 2, "Logical CPU devices (replicas).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Global batch.")
_INTERVALS = flags.DEFINE_list("intervals", ["1", "4", "16"], "Averaging intervals K.")
_STEPS = flags.DEFINE_integer("steps", 32, "Steps per compiled call (a multiple of every K).")
_WINDOWS = flags.DEFINE_integer("windows", 3, "Timed calls per measurement (median).")


def build(interval: int | None):
    """The strategy, model, optimizer and TrainStep; interval None: all-reduce."""
    import contextlib

    import numpy as np
    import tensorflow as tf

    from resnet_app.common import distribute
    from resnet_app.engine import averaging, optim
    from resnet_app.engine.step import TrainStep
    from resnet_app.engine.sync import ModelAverage
    from resnet_app.engine.tower import Tower
    from resnet_app.nets.resnet import create_model

    devices = [d.name for d in tf.config.list_logical_devices("CPU")[: _TOWERS.value]]
    strategy = distribute.mirrored_strategy(devices)
    local = averaging.local_variables() if interval else contextlib.nullcontext()
    with strategy.scope(), local:
        model = create_model(_MODEL.value, num_classes=10)
        model.build((None, 32, 32, 3))
        optimizer = optim.create_optimizer({"class": "momentum", "learning_rate": 0.01})
        optimizer.build(model.trainable_variables)
    policy = None
    if interval:
        policy = ModelAverage(averaging.ModelAveraging(model, optimizer, strategy, interval))
    rng = np.random.default_rng(0)
    batch = {
        "image": rng.normal(size=(_BATCH.value, 32, 32, 3)).astype(np.float32),
        "label": rng.integers(0, 10, _BATCH.value).astype(np.int32),
        "mask": np.ones(_BATCH.value, np.float32),
    }
    dataset = tf.data.Dataset.from_tensors(batch).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    return TrainStep(Tower(model, optimizer), strategy, policy), iterator


def executed_collectives(step, iterator, rates) -> collections.Counter:
    """{op name: executions} of the collective ops in one profiled call."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    directory = tempfile.mkdtemp(prefix="averaging_benchmark_")
    try:
        options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=3)
        tf.profiler.experimental.start(directory, options=options)
        step.loop(iterator, rates)
        tf.profiler.experimental.stop()
        space = xplane_pb2.XSpace()
        (path,) = glob.glob(os.path.join(directory, "plugins", "profile", "*", "*.xplane.pb"))
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    counts = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                # "while/body/_1/while/cond/then/_210/while/cond/CollectiveReduceV2:<type>"
                name, _, kind = plane.event_metadata[event.metadata_id].name.partition(":")
                if kind.startswith(("Collective", "Nccl")):
                    counts[name] += 1
    return counts


def measure(interval: int | None) -> dict:
    import tensorflow as tf

    from resnet_app.common import distribute

    step, iterator = build(interval)
    steps, replicas = _STEPS.value, _TOWERS.value
    rates = [0.01] * steps
    step.loop(iterator, rates)  # Traces, compiles and warms up.
    function = step.compiled_loop(iterator).get_concrete_function(
        iterator, tf.constant(rates), tf.constant(len(rates)), None
    )
    sizes = {op.name: op.bytes for op in distribute.collective_ops(function.graph)}
    calls, sent = 0, 0
    executed_collectives(step, iterator, rates)  # A process's first trace can miss ops.
    # A busy machine's trace can drop events, never add them: the larger of
    # two traces' counts, op by op.
    executed = executed_collectives(step, iterator, rates) | executed_collectives(
        step, iterator, rates
    )
    for name, count in executed.items():
        # The profiler prefixes the op's name with the loop's and cond's frames.
        matches = [op for op in sizes if name == op or name.endswith("/" + op)]
        if len(matches) != 1:
            raise RuntimeError(f"cannot match executed op {name} to the graph: {matches}")
        calls += count
        sent += count * sizes[matches[0]]
    timings = []
    for _ in range(_WINDOWS.value):
        start = time.perf_counter()
        step.loop(iterator, rates)
        timings.append(time.perf_counter() - start)
    return {
        "collectives": calls / replicas / steps,
        "bytes": sent / replicas / steps,
        "images": steps * _BATCH.value / statistics.median(timings),
    }


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    from resnet_app.common import distribute

    intervals = [int(k) for k in _INTERVALS.value]
    if any(k < 1 or _STEPS.value % k for k in intervals):
        cli.fail(f"--intervals={_INTERVALS.value}: each must divide --steps={_STEPS.value}")
    distribute.configure_towers(_TOWERS.value)
    rows = [("allreduce", "-", measure(None))]
    rows += [("model_average", str(k), measure(k)) for k in intervals]
    base = rows[0][2]
    lines = [
        f"{_MODEL.value}, global batch {_BATCH.value} on {_TOWERS.value} CPU towers, "
        f"{_STEPS.value} steps per call",
        f"{'sync':<14}{'K':>3}{'collectives/step':>18}{'ratio':>7}{'bytes/step':>12}"
        f"{'ratio':>7}{'images/sec':>12}{'ratio':>7}",
    ]
    for mode, k, row in rows:
        lines.append(
            f"{mode:<14}{k:>3}{row['collectives']:>18.3f}"
            f"{row['collectives'] / base['collectives']:>7.3f}{row['bytes']:>12.0f}"
            f"{row['bytes'] / base['bytes']:>7.3f}{row['images']:>12.0f}"
            f"{row['images'] / base['images']:>7.2f}"
        )
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    cli.run(main)
