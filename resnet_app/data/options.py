"""The tf.data options every pipeline of a run uses.

tf.data's autotuning model is off. Its background thread can keep an
iterator's deletion waiting until its next optimization, which comes up to a
minute apart once a pipeline has run for a while. Measured here with TF 2.21,
over runs of 40 s or more: 7 of 25 logged their "Done:" line and then took 33
to 41 s more to exit; with the model off, 14 of 14 exited within 1 s. The
model's job is done by hand instead:

- parallel maps use every CPU this process may run on (`parallel_calls`),
  which is where the model settles for CPU-bound decoding and augmentation;
  without the model, TF would use at most 16;
- `prefetch(tf.data.AUTOTUNE)` keeps sizing its buffer: that tuner is not the
  model and stays on.

Measured on 2 cores, the training pipeline alone, one process per setting:
JPEG folders at 224 px (the ImageNet recipe) 1,957 and 2,133 images/s with
the model against 2,023 and 1,995 without; `shapes` at batch 128, 15,746
against 25,780.
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
    """Deterministic order, parallelized maps, no autotuning model (see the module doc)."""
    options = tf.data.Options()
    options.deterministic = True
    options.experimental_optimization.map_parallelization = True
    options.autotune.enabled = False
    return options
