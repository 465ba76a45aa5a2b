"""A lost or stalled worker: the survivors save the last step every worker completed.

When a worker dies (or stalls past `sync.timeout`, or misses TensorFlow's
heartbeats) the next collective fails on the others, and TensorFlow aborts their
collectives for good. Each survivor (`survive`) puts back `last_step.LastStep`'s
copy (a step's collectives return on every worker alike or fail), saves it unless
a checkpoint of that step or later is there (under a lock file: the chief may be
the one lost), and stops with one line (`WorkerLostError`, exit status 3).
Everything here is local: no collective can run any more.
"""

from __future__ import annotations

import fcntl
import os
import re

import tensorflow as tf
from absl import logging

from resnet_app.common import checkpoint, distribute, run_dir, tf_config
from resnet_app.common.errors import WorkerLostError, first_line
from resnet_app.engine.last_step import LastStep

# What a failed collective raises when a peer is gone, stalled or refused.
PEER_ERRORS = (
    tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
    tf.errors.CancelledError,
)  # fmt: skip
_TASK = re.compile(r"/job:(worker|chief)/replica:\d+/task:(\d+)")
_REASONS = (
    ("stopped sending heartbeats", "it stopped sending heartbeats"),
    ("Connection reset", "its connection was reset"),
    ("failed to connect", "it cannot be reached"),
    ("Connection refused", "it cannot be reached"),
    ("Socket closed", "its connection was closed"),
)


def survive(run, last: LastStep | None, error: Exception) -> WorkerLostError:
    """Saves what this survivor holds of the last complete step (`last`; None:
    `sync.keep_last_step` off, nothing saved) after `error`; returns the error to raise."""
    lost = describe_lost(run.strategy, error, run.config.sync.timeout)
    if last is None:
        latest = checkpoint.list_checkpoints(run.model_dir)
        kept = os.path.basename(latest[-1][1]) if latest else "no checkpoint"
        return WorkerLostError(
            f"{lost}; with sync.keep_last_step=false the steps since {kept} are lost; restart "
            "every worker with the same command to resume"
        )
    step = last.restore()
    # The step and data position of `step`, on this worker's copies only.
    position = int(run.data_position.numpy())
    position += (step - int(run.global_step.numpy())) * run.config.train.batch_size
    for variable, value in ((run.global_step, step), (run.data_position, position)):
        for local in run.strategy.experimental_local_results(variable):
            local.assign(value)
    return WorkerLostError(
        f"{lost} at step {step}; {_save(run, step)}; restart every worker with the same "
        "command to resume from it (python -m resnet_app.launch restarts them itself)"
    )


def describe_lost(
    strategy: tf.distribute.Strategy, error: Exception, timeout: float | None = None
) -> str:
    """ "worker 1 of 2 (host:port) was lost (why)", from the error and the cluster."""
    resolver = strategy.cluster_resolver
    spec = resolver.cluster_spec().as_dict()
    me = (resolver.task_type, int(resolver.task_id))
    text = str(error)
    named = sorted({(kind, int(index)) for kind, index in _TASK.findall(text)} - {me})
    # The training tasks only: an evaluator (a TFJob's) is not in the collectives.
    tasks = [(kind, i) for kind in tf_config.TRAINING_JOBS for i in range(len(spec.get(kind, [])))]
    others = [task for task in tasks if task != me]
    if not named and len(others) == 1:
        named = others  # Two workers: the other one.
    why = next((reason for key, reason in _REASONS if key in text), None)
    if isinstance(error, tf.errors.DeadlineExceededError):
        why = f"it did not answer within sync.timeout={timeout:g} s" if timeout else "timed out"
    why = why or first_line(error)
    if not named:
        return f"a worker of {len(tasks)} was lost ({why})"
    who = ", ".join(f"{kind} {index} ({spec[kind][index]})" for kind, index in named)
    return f"{who} of {len(tasks)} was lost ({why})"


def _save(run, step: int) -> str:
    """Saves `step` in the run directory unless it or a later step is there; says what was done."""
    directory, name = run.model_dir, run_dir.checkpoint_name(step)
    if not run.checkpoints.finite():
        return (
            f"its weights are not finite, so nothing was saved after the checkpoints in {directory}"
        )
    with run_dir.open_append(os.path.join(directory, run_dir.SURVIVOR_LOCK_FILE)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        steps = [saved for saved, _ in checkpoint.list_checkpoints(directory)]
        if steps and max(steps) >= step:
            newest = run_dir.checkpoint_name(max(steps))
            return f"{newest} in {directory} already holds every step completed"
        prefix = os.path.join(directory, name)
        run.checkpoints.write_now(prefix)
    where = "this worker" if run.chief else f"worker {distribute.worker_index(run.strategy)}"
    logging.warning("Saved %s (step %d), the last complete step, to %s", name, step, directory)
    return f"{where} saved {name} in {directory}, the last step every worker completed"
