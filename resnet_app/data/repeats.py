"""Repeated augmentation (Hoffer et al. 2020): each example k times per epoch, each copy
augmented on its own (`data.augment.repeats`; timm's `--aug-repeats`, torchvision's
`RASampler`).

The samplers' rule, which this follows: an epoch's permutation is repeated
element-wise, each example k times in a row ([a, a, a, b, b, b, ...]), and the
epoch keeps the first E elements of that list, E being the training examples
rounded down to a multiple of 256; so an epoch has about as many examples as
without repeats, but only about 1/k of the distinct ones. Here E is also rounded
down to a multiple of the global batch, so that no batch spans two epochs.

Across replicas, the samplers give element m of the list to rank m mod R, as its
(m div R)-th example; so the k copies of an example go to k consecutive
replicas of the same step. A step's global batch is therefore a contiguous
piece of the list, and `placement` puts each of its elements where this
pipeline's sharding sends that rank's example: workers take the stream positions
congruent to their index (`InputPipeline.train_dataset`), and each worker's
towers take consecutive slices of its batch. With one replica nothing moves.

Copy c of an example draws its augmentation from its own key (`seeds.augment_key`
with `copy=c`), so the copies differ, and each is a function of (seed, epoch,
id, copy): the stream can still be entered anywhere, and a resumed run redraws
exactly. `epoch_length` and `placement` need no TensorFlow (the `schedule` tool).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from resnet_app.common.errors import ConfigError

# torchvision's and timm's samplers round an epoch's examples down to a multiple of this.
ROUND = 256


def epoch_length(num_examples: int, repeats: int, global_batch: int) -> int:
    """Examples per epoch: all of them without repeats; with repeats, rounded down to a
    multiple of 256 (the samplers' rule; below 256, all) and of the global batch."""
    if repeats <= 1:
        return num_examples
    rounded = num_examples // ROUND * ROUND or num_examples
    length = rounded // global_batch * global_batch
    if not length:
        raise ConfigError(
            f"data.augment.repeats: an epoch keeps whole global batches of the {num_examples} "
            f"training examples, and a batch of {global_batch} is more: use a smaller batch"
        )
    return length


def placement(global_batch: int, shards: int, replicas_per_shard: int) -> np.ndarray:
    """For each position q of a global batch in this pipeline's stream, the element m
    of the samplers' list that belongs there (int64 [global_batch]).

    Position q goes to worker w = q mod S, as that worker's example l = q div S; the
    worker's towers take consecutive slices of b = batch / (S * T) examples, so it is
    example i = l mod b of tower t = l div b: replica r = w * T + t. The samplers
    give that replica's i-th example of the step as element m = i * R + r.
    """
    replicas = shards * replicas_per_shard
    per_replica = global_batch // replicas
    q = np.arange(global_batch)
    worker, local = q % shards, q // shards
    tower, index = local // per_replica, local % per_replica
    return index * replicas + worker * replicas_per_shard + tower


def epoch_list(order: Any, repeats: int, length: int, arrange: np.ndarray) -> tuple:
    """One epoch of the stream: (example indices, copy numbers), int64 [length] each.

    Args:
      order: the epoch's permutation of the examples.
      repeats: k.
      length: `epoch_length`, a multiple of the global batch.
      arrange: `placement` of a global batch.
    """
    import tensorflow as tf  # The rest of this module is read before TensorFlow loads.

    batch = len(arrange)
    positions = np.arange(length)
    source = positions // batch * batch + arrange[positions % batch]  # Where each one comes from.
    source = tf.constant(source, tf.int64)
    return tf.gather(order, source // repeats), source % repeats
