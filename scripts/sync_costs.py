"""`benchmark.py sync`: all-reduce against local SGD, per step, on CPU towers.

The trainer's step on --towers logical CPU devices and random 32x32 images,
with the gradient all-reduce and with local SGD (`sync.mode=model_average`)
averaging every K steps, for each K of --intervals. Per step: the collectives
executed (a profiler trace of one call; one per all-reduce, not per replica),
the bytes one replica sends into them (from the graph) and images/s.
"""

from __future__ import annotations

import collections
import glob
import os
import shutil
import tempfile
import time

import timing
from timing import median


def build(options: dict, interval: int | None):
    """The TrainStep and its distributed iterator; interval None: all-reduce."""
    import contextlib

    import numpy as np
    import tensorflow as tf

    from resnet_app.common import distribute
    from resnet_app.engine import local_sgd, optim
    from resnet_app.engine.step import Tower, TrainStep
    from resnet_app.nets.resnet import create_model

    devices = [d.name for d in tf.config.list_logical_devices("CPU")[: options["towers"]]]
    strategy = distribute.mirrored_strategy(devices)
    local = local_sgd.local_variables() if interval else contextlib.nullcontext()
    with strategy.scope(), local:
        model = create_model(options["model"], num_classes=10)
        model.build((None, 32, 32, 3))
        optimizer = optim.create_optimizer({"class": "momentum", "learning_rate": 0.01})
        optimizer.build(model.trainable_variables)
    policy = local_sgd.LocalSGD(model, optimizer, strategy, interval) if interval else None
    rng, batch = np.random.default_rng(0), options["batch_size"]
    images = {
        "image": rng.normal(size=(batch, 32, 32, 3)).astype(np.float32),
        "label": rng.integers(0, 10, batch).astype(np.int32),
        "mask": np.ones(batch, np.float32),
    }
    dataset = tf.data.Dataset.from_tensors(images).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    return TrainStep(Tower(model, optimizer), strategy, policy), iterator


def executed_collectives(step, iterator, rates) -> collections.Counter:
    """{op name: executions} of the collective ops in one profiled call."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    directory = tempfile.mkdtemp(prefix="sync_costs_")
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


def measure(options: dict, interval: int | None) -> dict:
    import tensorflow as tf

    from resnet_app.common import distribute

    step, iterator = build(options, interval)
    steps, replicas = options["steps"], options["towers"]
    rates = [0.01] * steps
    step.loop(iterator, rates)  # Traces, compiles and warms up.
    function = step.compiled_loop(iterator).get_concrete_function(
        iterator, tf.constant(rates), tf.constant(len(rates)), None
    )
    sizes = {op.name: op.bytes for op in distribute.collective_ops(function.graph)}
    # A process's first trace can miss ops; a busy machine's trace can drop events,
    # never add them: the first is dropped, then the larger count of two.
    traces = [executed_collectives(step, iterator, rates) for _ in range(3)]
    executed = traces[1] | traces[2]
    calls, sent = 0, 0
    for name, count in executed.items():
        # The profiler prefixes the op's name with the loop's and cond's frames.
        matches = [op for op in sizes if name == op or name.endswith("/" + op)]
        if len(matches) != 1:
            raise RuntimeError(f"cannot match executed op {name} to the graph: {matches}")
        calls += count
        sent += count * sizes[matches[0]]
    seconds = []
    for _ in range(options["windows"]):
        start = time.perf_counter()
        step.loop(iterator, rates)
        seconds.append(time.perf_counter() - start)
    return {
        "collectives": calls / replicas / steps,
        "bytes": sent / replicas / steps,
        "images": steps * options["batch_size"] / median(seconds),
    }


def sync(options: dict) -> dict:
    intervals, steps = [int(k) for k in options["intervals"].split(",")], options["steps"]
    if any(k < 1 or steps % k for k in intervals):
        timing.fail(f"--intervals={options['intervals']}: each must divide --steps={steps}")
    from resnet_app.common import distribute

    distribute.configure_towers(options["towers"])
    rows = {"allreduce": measure(options, None)}
    rows.update({f"model_average {k}": measure(options, k) for k in intervals})
    shown = {k: options[k] for k in ("model", "batch_size", "towers", "steps")}
    return {"cpu": timing.cpu().to_dict(), **shown, "rows": rows}


def text(report: dict) -> str:
    base, table, forms = report["rows"]["allreduce"], [], (".3f", ".0f", ".0f")
    for name, row in report["rows"].items():
        mode, _, k = name.partition(" ")
        table.append([mode, k or "-"])
        for key, form in zip(base, forms):
            table[-1] += [format(row[key], form), f"{row[key] / base[key]:.3f}"]
    header = ["sync", "K", "collectives/step", "ratio", "bytes/step", "ratio", "images/s", "ratio"]
    settings = f"{report['model']}, global batch {report['batch_size']} on {report['towers']}"
    return (
        f"{timing.cpu_line(report['cpu'])}\n{settings} CPU towers, {report['steps']} steps "
        f"per call\n\n{timing.markdown_table(header, table)}"
    )


def add_parser(commands) -> None:
    sub = commands.add_parser("sync", help="all-reduce against local SGD, per step")
    sub.add_argument("--model", default="resnet20", help="a model preset")
    sub.add_argument("--towers", type=int, default=2, help="logical CPU devices (replicas)")
    sub.add_argument("--batch_size", type=int, default=64, help="global batch")
    sub.add_argument("--intervals", default="1,4,16", help="local SGD's intervals K")
    sub.add_argument("--steps", type=int, default=32, help="steps per call, a multiple of each K")
    sub.add_argument("--windows", type=int, default=3, help="timed calls (their median)")
    sub.add_argument("--json", action="store_true", help="one JSON object, not a table")
    sub.set_defaults(rounds=1)
