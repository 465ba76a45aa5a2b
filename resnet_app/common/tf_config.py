"""`TF_CONFIG`, as written by hand, by `common/slurm.py`, or by Kubernetes operators. No TensorFlow.

Training tasks are the "worker" replicas and the "chief" if any (which then
writes the run's files; else worker 0 does). An "evaluator" runs `resnet-app
evaluate --watch` alone; the trainers ignore it. Other jobs ("ps", "master"),
several chiefs and a task outside the cluster are refused by `check`.
"""

from __future__ import annotations

import json
import os

from resnet_app.common.errors import ConfigError

CHIEF, WORKER, EVALUATOR = "chief", "worker", "evaluator"
TRAINING_JOBS = (CHIEF, WORKER)
KNOWN_JOBS = (*TRAINING_JOBS, EVALUATOR)
WATCH_COMMAND = "resnet-app evaluate --watch --model_dir=RUN_DIR"

EXAMPLE = (  # For the errors.
    '{"cluster": {"worker": ["host0:12345", "host1:12345"]}, "task": {"type": "worker", '
    '"index": 0}}'
)


def read() -> dict | None:
    """`TF_CONFIG`, parsed (None when unset); ConfigError unless an object of job lists."""
    text = os.environ.get("TF_CONFIG")
    if text is None:
        return None
    try:
        tf_config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"TF_CONFIG is not valid JSON ({error}); unset it or fix it") from None
    shown = text if len(text) <= 40 else text[:37] + "..."
    if not isinstance(tf_config, dict):
        raise ConfigError(
            f"TF_CONFIG is JSON but not an object ({shown}); set it like {EXAMPLE}, or unset it"
        )
    cluster = tf_config.get("cluster", {})
    # A job lists its tasks' addresses (or maps task indices to them).
    if not isinstance(cluster, dict) or not all(
        isinstance(tasks, (list, dict)) for tasks in cluster.values()
    ):
        raise ConfigError(
            f'TF_CONFIG\'s "cluster" is not an object of address lists ({shown}); set it like '
            f"{EXAMPLE}, or unset it"
        )
    return tf_config


def training_tasks(tf_config: dict) -> int:
    """The tasks that train together: the chief (if any) and the workers."""
    cluster = tf_config.get("cluster", {})
    return sum(len(cluster.get(job, [])) for job in TRAINING_JOBS)


def task_type(tf_config: dict | None) -> str | None:
    """This task's "type" in TF_CONFIG (None without TF_CONFIG or a task)."""
    task = (tf_config or {}).get("task")
    return task.get("type") if isinstance(task, dict) else None


def is_evaluator(tf_config: dict | None) -> bool:
    return task_type(tf_config) == EVALUATOR


def check(tf_config: dict | None, command: str) -> None:
    """Refuses, in one line, a TF_CONFIG that `command` ("train" or "evaluate") cannot run."""
    if tf_config is None:
        return
    cluster = tf_config.get("cluster", {})
    other = sorted(set(cluster) - set(KNOWN_JOBS))
    if other:
        raise ConfigError(
            f'TF_CONFIG has a "{other[0]}" job: resnet_app trains with '
            "MultiWorkerMirroredStrategy, whose tasks are chief and worker replicas (plus an "
            f"evaluator); drop the {other[0]} replicas"
        )
    if len(cluster.get(CHIEF, [])) > 1:
        raise ConfigError(
            f"TF_CONFIG names {len(cluster[CHIEF])} chiefs; a job has at most one: make the "
            "others worker replicas"
        )
    kind = task_type(tf_config)
    if kind == EVALUATOR:
        if command == "train":
            raise ConfigError(
                "TF_CONFIG makes this task the evaluator, which does not train: run "
                f"`{WATCH_COMMAND}` in it (docs/distributed.md, Kubernetes)"
            )
        return
    if kind is None or training_tasks(tf_config) <= 1:
        return  # No task (refused by distribute.worker_resolver), or one machine.
    index = tf_config["task"].get("index")
    if kind not in TRAINING_JOBS or not isinstance(index, int):
        raise ConfigError(
            f"TF_CONFIG's task {json.dumps(tf_config['task'])} is not a training task; give "
            '"type": "chief" or "worker" and an integer "index"'
        )
    tasks = cluster.get(kind, [])
    if isinstance(tasks, list) and not 0 <= index < len(tasks):
        raise ConfigError(
            f"TF_CONFIG's task is {kind} {index}, but its cluster lists {len(tasks)} {kind} "
            "task(s); give each task its own index from 0"
        )
