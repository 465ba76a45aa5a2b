"""Repeated augmentation (Hoffer et al. 2020; timm's `--aug-repeats`, torchvision's
`RASampler`): each example k times per epoch, each copy augmented on its own.

The samplers' rule: the epoch's permutation repeated element-wise ([a, a, a, b, b, b, ...]),
keeping its first E elements, the examples rounded down to a multiple of 256 (here also of
the global batch, so no batch spans two epochs). Element m of the list goes to replica
m mod R, so an example's k copies go to k consecutive replicas of one step; `placement`
puts each element where this pipeline's sharding sends that replica's example. Copy c
draws from its own key (`seeds.augment_key(..., copy=c)`), a function of (seed, epoch,
id, copy): the stream can still be entered anywhere. No TensorFlow at module level.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from resnet_app.common.errors import ConfigError

ROUND = 256  # The samplers round an epoch's examples down to a multiple of this.


def epoch_length(num_examples: int, repeats: int, global_batch: int) -> int:
    """Examples per epoch: all of them; with repeats, rounded down to a multiple of 256 (below
    256, all) and of the global batch."""
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
    """int64 [global_batch]: for each position q of a global batch in this pipeline's
    stream, the element m of the samplers' list that belongs there.

    Position q goes to worker w = q mod S as its example l = q div S; its towers take
    slices of b = batch / (S * T) examples, so it is example i = l mod b of tower t = l div b,
    replica r = w * T + t, which the samplers give element m = i * R + r.
    """
    replicas = shards * replicas_per_shard
    per_replica = global_batch // replicas
    q = np.arange(global_batch)
    worker, local = q % shards, q // shards
    tower, index = local // per_replica, local % per_replica
    return index * replicas + worker * replicas_per_shard + tower


def epoch_list(order: Any, repeats: int, length: int, arrange: np.ndarray) -> tuple:
    """One epoch of the stream from its permutation `order`: (example indices, copy
    numbers), int64 [length] each (`length`: `epoch_length`, `arrange`: `placement`)."""
    import tensorflow as tf  # The rest of this module is read before TensorFlow loads.

    batch = len(arrange)
    positions = np.arange(length)
    source = positions // batch * batch + arrange[positions % batch]  # Where each comes from.
    source = tf.constant(source, tf.int64)
    return tf.gather(order, source // repeats), source % repeats
