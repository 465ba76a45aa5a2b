"""Towers: the `tf.distribute` strategy a run uses, picked from the machine.

TF_CONFIG (or a SLURM step): `MultiWorkerMirroredStrategy` over each worker's
GPUs, or its CPU. GPUs: `MirroredStrategy`. CPU only: one device, or with
`num_towers=N` a `MirroredStrategy` over N logical CPUs, so tower code runs
(and is tested) anywhere. BatchNorm's per-replica statistics are averaged
before every evaluation and save (`moving_statistics_sync`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from resnet_app.common import checks, compat, hardware, slurm, tf_config
from resnet_app.common.errors import ConfigError


def _check_gpu_count(num_towers: int, num_gpus: int) -> None:
    if num_towers > num_gpus:
        raise ConfigError(
            f"--num_towers={num_towers} but this machine has {num_gpus} GPU(s); "
            f"use at most {num_gpus}"
        )


def worker_resolver(
    cluster: dict, num_towers: int | None, num_gpus: int
) -> tf.distribute.cluster_resolver.ClusterResolver:
    """The resolver for `MultiWorkerMirroredStrategy` to use `num_towers` of `num_gpus`:
    from `TFConfigClusterResolver` it takes every GPU, from others `num_accelerators()`."""
    task = cluster.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ConfigError(
            f"TF_CONFIG names {tf_config.training_tasks(cluster)} workers but not this one's "
            '"task"; add e.g. "task": {"type": "worker", "index": 0}, a different index on '
            "each worker"
        )
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if num_towers is None:
        return resolver
    checks.at_least("--num_towers", num_towers)
    if not num_gpus and num_towers > 1:
        raise ConfigError(
            f"--num_towers={num_towers} with TF_CONFIG: a CPU-only worker runs one replica "
            "(MultiWorkerMirroredStrategy has no CPU towers); drop --num_towers, or run "
            f"{num_towers} workers per machine"
        )
    if not num_gpus:
        return resolver
    _check_gpu_count(num_towers, num_gpus)
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        resolver.cluster_spec(),
        task_type=resolver.task_type,
        task_id=resolver.task_id,
        num_accelerators={"GPU": num_towers},
        rpc_layer=resolver.rpc_layer or "grpc",
    )


def configure_towers(num_towers: int | None) -> None:
    """Makes `num_towers` logical CPU devices when there are no GPUs; call before TF runs ops."""
    if num_towers is None:
        return
    checks.at_least("--num_towers", num_towers)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        _check_gpu_count(num_towers, len(gpus))
        return
    if num_towers == 1:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * num_towers
        )
    except RuntimeError:
        # Already initialized (a second run in one process): use those there are.
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing < num_towers:
            raise ConfigError(
                f"--num_towers={num_towers}, but TensorFlow already started with {existing} "
                "CPU device(s) in this process; run in a fresh process"
            ) from None


def mirrored_strategy(devices: list[str]) -> tf.distribute.MirroredStrategy:
    """`MirroredStrategy(devices)` whose collective groups cannot collide with an earlier one's
    (a second strategy of another size in one process would join them and abort)."""
    compat.advance_collective_key_base()
    return tf.distribute.MirroredStrategy(devices)


def create_strategy(
    num_towers: int | None = None, timeout: float | None = None
) -> tf.distribute.Strategy:
    """The strategy for this machine; `timeout`: the seconds a collective waits for a
    peer before `DeadlineExceededError` (None: only TensorFlow's heartbeats)."""
    slurm.export_tf_config()  # Under srun: the step's TF_CONFIG, unless one is set.
    cluster = tf_config.read()
    tf_config.check(cluster, "evaluate")  # train.py refused the evaluator's before TensorFlow.
    if tf_config.is_evaluator(cluster):
        logging.info(
            "TF_CONFIG makes this task the evaluator: it evaluates on this machine alone, "
            "outside the training cluster"
        )
    elif cluster is not None and tf_config.training_tasks(cluster) > 1:
        num_gpus = len(tf.config.list_physical_devices("GPU"))
        resolver = worker_resolver(cluster, num_towers, num_gpus)
        compat.keep_call_cancellation()  # A stalled peer must not crash the survivor.
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
        logging.info(
            "Multi-worker: %d replicas over %d workers (this one: %s %d)",
            strategy.num_replicas_in_sync,
            tf_config.training_tasks(cluster),
            resolver.task_type,
            resolver.task_id,
        )
        return strategy
    configure_towers(num_towers)
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        devices = [device.name for device in gpus[: num_towers or len(gpus)]]
    elif num_towers and num_towers > 1:
        devices = [device.name for device in tf.config.list_logical_devices("CPU")[:num_towers]]
    else:
        devices = []
    if len(devices) > 1:
        logging.info("%d towers: %s", len(devices), ", ".join(devices))
        return mirrored_strategy(devices)
    device = devices[0] if devices else "/cpu:0"
    logging.info("One device: %s", device)
    return tf.distribute.OneDeviceStrategy(device)


def describe_devices(strategy: tf.distribute.Strategy) -> str:
    """What the replicas run on: "2 x NVIDIA A100-SXM4-40GB", or "1 x CPU (AMD EPYC ...: AVX2;
    oneDNN off: Eigen kernels), 2 cores" (towers on CPU devices count as replicas)."""
    gpus = tf.config.list_physical_devices("GPU")
    replicas = strategy.num_replicas_in_sync
    if gpus:
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
        return f"{replicas} x {name}"
    cores = len(os.sched_getaffinity(0))
    return f"{replicas} x CPU ({hardware.read_cpu_info().describe()}), {cores} cores"


def distribute_datasets(
    strategy: tf.distribute.Strategy,
    dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
) -> tf.data.Dataset | tf.distribute.DistributedDataset:
    """`strategy.distribute_datasets_from_function(dataset_fn)`; on one CPU, the dataset
    itself: the distributed iterator slows a CPU step a lot (docs/performance.md)."""
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        (device,) = strategy.extended.worker_devices
        if tf.DeviceSpec.from_string(device).device_type == "CPU":
            return dataset_fn(tf.distribute.InputContext())
    return strategy.distribute_datasets_from_function(dataset_fn)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes the run's files (always, unless multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type or resolver.task_type == "chief":
        return True
    spec = resolver.cluster_spec().as_dict()
    return resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in spec


def worker_index(strategy: tf.distribute.Strategy) -> int:
    """This process's task index (0 unless multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    return int(resolver.task_id or 0) if resolver is not None and resolver.task_type else 0


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def broadcast_from_chief(strategy: tf.distribute.Strategy, values: list[float]) -> list[float]:
    """The chief's `values` on every worker (one machine: `values`); every worker calls it
    at the same point. For what only the chief reads (the live LR override)."""
    if not is_multi_worker(strategy):
        return values
    return _gathered(strategy, values)[: len(values)]  # Replica 0's: the chief's.


def gather_from_workers(strategy: tf.distribute.Strategy, value: float) -> list[float]:
    """`value` from every replica, in replica order (one machine: just `value`)."""
    if not is_multi_worker(strategy):
        return [value]
    return _gathered(strategy, [value])


def any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
    """Whether `flag` is true on any worker; every worker calls it at the same point."""
    return max(gather_from_workers(strategy, float(flag))) > 0


_GATHERS: dict = {}  # strategy id -> (strategy, its traced all-gather).


def _gathered(strategy: tf.distribute.Strategy, values: list[float]) -> list[float]:
    """Every replica's `values`, concatenated in replica order."""
    if id(strategy) not in _GATHERS:

        def replica_gather(tensor):  # tf.identity: a tensor on the replica's own device.
            return tf.distribute.get_replica_context().all_gather(tf.identity(tensor), axis=0)

        @tf.function
        def gather(tensor):
            return strategy.experimental_local_results(strategy.run(replica_gather, (tensor,)))[0]

        _GATHERS[id(strategy)] = (strategy, gather)
    return _GATHERS[id(strategy)][1](tf.constant(values, tf.float64)).numpy().tolist()


def moving_statistics_sync(
    model: tf.keras.Model, strategy: tf.distribute.Strategy
) -> Callable[[], None]:
    """A function (cross-replica context) that averages the model's non-trainable variables
    across replicas: Keras 3 BatchNorm updates its moving statistics per replica, and
    being linear in the batch statistics, their mean is what one batch would give."""
    variables = list(model.non_trainable_variables)
    if not variables or strategy.num_replicas_in_sync == 1:
        return lambda: None

    @tf.function
    def sync():
        # A closure, as averaging's is: arguments of `run` would be split per replica.
        strategy.run(lambda: assign_replica_mean(variables))

    return sync


def assign_replica_mean(variables: list[tf.Variable]) -> None:
    """In replica context: sets every replica's copy of each variable to their mean."""
    context = tf.distribute.get_replica_context()
    values = [tf.identity(v.value) for v in variables]  # Tensors, not variables.
    means = context.all_reduce(tf.distribute.ReduceOp.MEAN, values)
    for variable, mean in zip(variables, means):
        variable.assign(mean)


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    """A collective op: its name, type, the bytes one replica sends, and the op types
    leading to it from the top graph (("While", "If"): in a cond in a loop)."""

    name: str
    type: str
    bytes: int
    path: tuple[str, ...]


COLLECTIVE_TYPES = ("CollectiveReduceV2", "CollectiveGatherV2", "NcclAllReduce")


def collective_ops(graph: tf.Graph, path: tuple[str, ...] = ()) -> list[CollectiveOp]:
    """Every replica's cross-replica reductions and gathers in a traced graph and the
    functions it calls."""
    found = []
    for op in graph.get_operations():
        if op.type in COLLECTIVE_TYPES:
            tensor = op.inputs[0]
            size = tensor.shape.num_elements() if tensor.shape.is_fully_defined() else 0
            found.append(CollectiveOp(op.name, op.type, size * tensor.dtype.size, path))
        for attr in op.node_def.attr.values():
            names = [attr.func.name] if attr.HasField("func") else []
            names += [f.name for f in attr.list.func]
            for name in names:
                function = compat.graph_function(graph, name)
                if getattr(function, "graph", None) is not None:
                    found += collective_ops(function.graph, (*path, op.type))
    return found
