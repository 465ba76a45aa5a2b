"""SLURM: `srun resnet-app train ...` runs one worker per task, as `TF_CONFIG` would.

Under `srun` with several tasks and no `TF_CONFIG`, each task writes its
TF_CONFIG (from TensorFlow's `SlurmClusterResolver`) before the strategy is
made, so every TF_CONFIG path runs unchanged. `check_before_tensorflow` checks
SLURM's variables first and shares the node's GPUs out. Ports: `srun
--resv-ports`, else a block derived from SLURM_JOB_ID.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess

from absl import logging

from resnet_app.common import hardware
from resnet_app.common.errors import ConfigError, first_line

# Job-id ports: blocks of PORT_STRIDE from PORT_FLOOR, below Linux's ephemeral
# range (where outgoing connections hold ports). Job ids 1596 apart (the blocks
# that fit) share one: --resv-ports rules that out.
PORT_FLOOR = 20000
PORT_CEILING = 32768
PORT_STRIDE = 8
TASK_COUNT_VARIABLES = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
SRUN_HINT = "run it as `srun resnet-app train ...` inside the allocation, or set TF_CONFIG"


@dataclasses.dataclass(frozen=True)
class Step:
    """One task's view of a SLURM step: its SLURM_PROCID `rank`, the `hosts` and
    `tasks_per_node`, `port_base` (a node's i-th task listens on port_base + i), its
    SLURM_LOCALID and SLURMD_NODENAME (None: not set)."""

    rank: int
    num_tasks: int
    hosts: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    port_base: int
    ports_from: str
    local_id: int | None = None
    node_name: str | None = None


def _integer(name: str, minimum: int = 0) -> int:
    text = os.environ[name]
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigError(f"{name}={text!r} is not a whole number of {minimum} or more")
    return value


def _task_count() -> int:
    """The step's tasks (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS; 1 when neither is set)."""
    for name in TASK_COUNT_VARIABLES:
        if os.environ.get(name):
            return _integer(name, minimum=1)
    return 1


def _require(name: str, num_tasks: int) -> str:
    value = os.environ.get(name)
    if not value:
        raise ConfigError(
            f"SLURM runs {num_tasks} tasks but {name} is not set, so this task cannot tell "
            f"the job's workers; {SRUN_HINT}"
        )
    return value


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks-per-node list, expanded: "2(x3),1" -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ConfigError(
                f"SLURM_STEP_TASKS_PER_NODE={text!r} is not a list like '2(x3),1'; {SRUN_HINT}"
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def expand_hostnames(nodelist: str) -> list[str]:
    """The node names of a SLURM node list, by `scontrol show hostnames`."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise ConfigError(
            f"scontrol is not on PATH, and it is needed to expand SLURM_STEP_NODELIST={nodelist!r} "
            f"into the workers' host names; {SRUN_HINT} on a node with SLURM's commands"
        )
    try:
        output = subprocess.run(
            [scontrol, "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", None) or str(error) or type(error).__name__
        raise ConfigError(
            f"`scontrol show hostnames {nodelist}` failed ({first_line(RuntimeError(detail))}); "
            f"{SRUN_HINT}"
        ) from None
    return output.split()


def reserved_ports(text: str) -> list[int]:
    """The ports of SLURM_STEP_RESV_PORTS: "12000-12003" or "12000,12005" (or both mixed)."""
    ports: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if match is None or int(match.group(2) or match.group(1)) < int(match.group(1)):
            raise ConfigError(
                f"SLURM_STEP_RESV_PORTS={text!r} is not a port list like '12000-12003'; "
                "drop --resv-ports, or set TF_CONFIG"
            )
        ports += range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1)
    return ports


def choose_ports(tasks_on_busiest_node: int) -> tuple[int, str]:
    """(the first port of every node's block, whence, for the start line): the reserved
    ports if srun reserved enough, else a block chosen by the job id."""
    reserved = os.environ.get("SLURM_STEP_RESV_PORTS")
    if reserved:
        ports = reserved_ports(reserved)
        base = ports[0]
        needed = range(base, base + tasks_on_busiest_node)
        if not set(needed) <= set(ports):
            raise ConfigError(
                f"SLURM_STEP_RESV_PORTS={reserved} does not hold {tasks_on_busiest_node} "
                f"consecutive ports from {base} for the {tasks_on_busiest_node} tasks of a node; "
                f"reserve at least {tasks_on_busiest_node} (srun --resv-ports)"
            )
        return base, f"SLURM_STEP_RESV_PORTS={reserved}"
    _require("SLURM_JOB_ID", _task_count())
    job_id = _integer("SLURM_JOB_ID")
    # A block of whole strides: a node with more tasks than PORT_STRIDE takes several.
    stride = -(-max(tasks_on_busiest_node, 1) // PORT_STRIDE) * PORT_STRIDE
    slots = (PORT_CEILING - PORT_FLOOR) // stride
    if slots < 1:
        raise ConfigError(
            f"{tasks_on_busiest_node} tasks on one node need more ports than "
            f"{PORT_FLOOR}-{PORT_CEILING - 1} holds; reserve them (srun --resv-ports)"
        )
    base = PORT_FLOOR + (job_id % slots) * stride
    return base, f"SLURM_JOB_ID={job_id} (ports {base}-{base + tasks_on_busiest_node - 1})"


def read_step() -> Step | None:
    """This task's SLURM step, or None (TF_CONFIG set, or one task). No TensorFlow."""
    if "TF_CONFIG" in os.environ:
        return None
    num_tasks = _task_count()
    if num_tasks == 1:
        return None
    _require("SLURM_PROCID", num_tasks)
    rank = _integer("SLURM_PROCID")
    if rank >= num_tasks:
        raise ConfigError(
            f"SLURM_PROCID={rank} but the step has {num_tasks} tasks (0 to {num_tasks - 1})"
        )
    nodelist = _require("SLURM_STEP_NODELIST", num_tasks)
    counts = expand_tasks_per_node(_require("SLURM_STEP_TASKS_PER_NODE", num_tasks))
    base, ports_from = choose_ports(max(counts))
    local_id = _integer("SLURM_LOCALID") if os.environ.get("SLURM_LOCALID") else None
    hosts = expand_hostnames(nodelist)  # Last: every variable is checked without scontrol.
    if len(hosts) != len(counts) or sum(counts) != num_tasks:
        raise ConfigError(
            f"SLURM_STEP_NODELIST={nodelist} ({len(hosts)} node(s)) and "
            f"SLURM_STEP_TASKS_PER_NODE={os.environ['SLURM_STEP_TASKS_PER_NODE']} "
            f"({sum(counts)} task(s) on {len(counts)} node(s)) do not describe the "
            f"{num_tasks} tasks of the step; {SRUN_HINT}"
        )
    return Step(
        rank=rank,
        num_tasks=num_tasks,
        hosts=tuple(hosts),
        tasks_per_node=tuple(counts),
        port_base=base,
        ports_from=ports_from,
        local_id=local_id,
        node_name=os.environ.get("SLURMD_NODENAME") or None,
    )


def visible_gpus() -> list[str]:
    """The GPUs this task sees, without TensorFlow: CUDA_VISIBLE_DEVICES, else nvidia-smi."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [gpu.strip() for gpu in visible.split(",") if gpu.strip()]
        return [] if ids in (["-1"], ["NoDevFiles"]) else ids
    lines = hardware.nvidia_smi("--list-gpus")
    return [str(i) for i, line in enumerate(lines) if line.startswith("GPU ")]


def share_gpus(step: Step) -> str | None:
    """Gives this task its share of the node's GPUs, as `SlurmClusterResolver` would;
    returns the CUDA_VISIBLE_DEVICES set. Left alone (None) with `--gpus-per-task` or
    one task per node. (The resolver's own numbers GPUs from 0, too late.)"""
    gpus = visible_gpus()
    if not gpus or os.environ.get("SLURM_GPUS_PER_TASK") or step.local_id is None:
        return None
    if step.node_name in step.hosts:
        on_node = step.tasks_per_node[step.hosts.index(step.node_name)]
    else:
        on_node = max(step.tasks_per_node)
    if on_node == 1:
        return None
    share = len(gpus) // on_node
    if share == 0:
        raise ConfigError(
            f"{on_node} tasks on this node share {len(gpus)} GPU(s); run at most {len(gpus)} "
            "tasks per node (--ntasks-per-node), or give each its own (--gpus-per-task)"
        )
    mine = ",".join(gpus[step.local_id * share : (step.local_id + 1) * share])
    os.environ["CUDA_VISIBLE_DEVICES"] = mine
    return mine


def check_before_tensorflow() -> bool:
    """Whether this process is a worker of a SLURM step (checked, its GPUs shared)."""
    step = read_step()
    if step is not None:
        share_gpus(step)
    return step is not None


def cluster_tf_config(step: Step) -> dict:
    """This task's TF_CONFIG, from `SlurmClusterResolver`, at its own address's index
    (the resolver's rank order holds only for a block distribution over sorted nodes)."""
    from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver

    slots = max(step.tasks_per_node)
    try:
        # The resolver packs as many tasks on a node as it has GPU slots: one per
        # task, and CUDA_VISIBLE_DEVICES left as `share_gpus` set it.
        resolver = slurm_cluster_resolver.SlurmClusterResolver(
            jobs={"worker": step.num_tasks},
            port_base=step.port_base,
            gpus_per_node=slots,
            gpus_per_task=1,
            tasks_per_node=dict(zip(step.hosts, step.tasks_per_node)),
            auto_set_gpu=False,
        )
        workers = list(resolver.cluster_spec().as_dict()["worker"])
    except (RuntimeError, ValueError, KeyError) as error:
        raise ConfigError(
            f"SlurmClusterResolver refused this step ({first_line(error)}); {SRUN_HINT}"
        ) from None
    index = resolver.task_id
    if step.node_name is not None and step.local_id is not None:
        own = f"{step.node_name}:{step.port_base + step.local_id}"
        if own not in workers:
            raise ConfigError(
                f"this task's address {own} (SLURMD_NODENAME, SLURM_LOCALID) is not among the "
                f"workers SlurmClusterResolver made from SLURM_STEP_NODELIST ({', '.join(workers)})"
            )
        index = workers.index(own)
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}


def export_tf_config() -> dict | None:
    """Sets (and returns) TF_CONFIG from a SLURM step of several tasks; None if none."""
    step = read_step()
    if step is None:
        return None
    tf_config = cluster_tf_config(step)
    os.environ["TF_CONFIG"] = json.dumps(tf_config)
    logging.info(
        "SLURM: SlurmClusterResolver made this task (rank %d) worker %d of %d on %d node(s), "
        "chief %s; ports from %s",
        step.rank,
        tf_config["task"]["index"],
        step.num_tasks,
        len(step.hosts),
        tf_config["cluster"]["worker"][0],
        step.ports_from,
    )
    return tf_config
