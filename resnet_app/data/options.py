"""The tf.data options every pipeline of a run uses.

tf.data's autotuning model is off: its background thread can hold an iterator's deletion
until its next optimization, up to a minute apart, delaying a finished run's exit. Its job
is done by hand: parallel maps use every CPU this process may run on (where the model
settles for CPU-bound work), and `prefetch(tf.data.AUTOTUNE)`, a tuner of its own, still
sizes its buffer.
"""

from __future__ import annotations

import os

import tensorflow as tf


def parallel_calls() -> int:
    """The `num_parallel_calls` of the pipelines' maps: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # Not on Linux.
        return max(1, os.cpu_count() or 1)


def dataset_options() -> tf.data.Options:
    """Deterministic order, parallelized maps, no autotuning model."""
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_optimization.map_parallelization = True
    options.autotune.enabled = False
    return options
