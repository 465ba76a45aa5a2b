"""The training stream's randomness: stateless seeds drawn from the one `--seed`.

Every random choice of the training stream is a function of (seed, epoch), or of
(seed, epoch, example id), computed with TensorFlow's stateless ops: the order
of an epoch (`permutation`), the shuffle of streamed records (`stream_seed` with
`RECORDS`) and each example's augmentation (`example_seed`). Nothing depends on
what was drawn before, so the stream can be entered at any example position
(`InputPipeline.train_dataset(start_example=...)`) and a resumed run redraws
exactly what the interrupted one would have drawn.
"""

from __future__ import annotations

import tensorflow as tf

# Independent streams of randomness drawn from the one --seed (MIX: Mixup and
# CutMix, one draw per batch number; SAMPLE: class-balanced sampling).
ORDER, AUGMENT, RECORDS, MIX, SAMPLE = 1, 2, 3, 4, 5


def stream_seed(seed: int, stream: int, epoch) -> tf.Tensor:
    """An int64 [2] seed for one stream of randomness in one epoch.

    Args:
      seed: the run's `--seed`.
      stream: `ORDER`, `AUGMENT` or `RECORDS`.
      epoch: the epoch (an int or an int tensor).

    Returns:
      An int64 [2] tensor, for stateless ops.
    """
    base = tf.constant([seed, stream], tf.int64)
    return tf.random.experimental.stateless_fold_in(base, tf.cast(epoch, tf.int64))


def augment_key(seed: int, epoch, copy: int = 0) -> tf.Tensor:
    """An int64 key shared by one epoch's augmentations: a 64-bit hash of (seed, epoch).

    (`stateless_fold_in` returns [hash(seed, stream), epoch]: its first element
    alone does not depend on the epoch, so the key is drawn from the whole pair.)

    Args:
      seed: the run's `--seed`.
      epoch: the epoch (an int or an int tensor).
      copy: with repeated augmentation (`data/repeats.py`), which copy of each
        example: copy c > 0 draws from a key of its own; copy 0 is every run's.

    Returns:
      An int64 scalar tensor.
    """
    pair = stream_seed(seed, AUGMENT, epoch)
    if copy:
        pair = tf.random.experimental.stateless_fold_in(pair, copy)
    return tf.random.stateless_uniform([], pair, minval=None, maxval=None, dtype=tf.int64)


def example_seed(seed: int, epoch, example_id) -> tf.Tensor:
    """The seed of one training example's augmentation in one epoch.

    [epoch key, id]: the stateless ops use the pair as a key, so distinct ids
    (and epochs, through the key's 64-bit hash) draw independent numbers.

    Args:
      seed: the run's `--seed`.
      epoch: the epoch (an int or an int tensor).
      example_id: the example's index in its split.

    Returns:
      An int64 [2] tensor.
    """
    return tf.stack([augment_key(seed, epoch), tf.cast(example_id, tf.int64)])


def permutation(size: int, seed: int, epoch) -> tf.Tensor:
    """A permutation of range(size) that depends only on (seed, epoch).

    Args:
      size: examples in the epoch.
      seed: the run's `--seed`.
      epoch: the epoch (an int or an int tensor).

    Returns:
      An int64 [size] tensor: the example indices in visiting order.
    """
    order_seed = stream_seed(seed, ORDER, epoch)
    return tf.random.experimental.stateless_shuffle(tf.range(size, dtype=tf.int64), order_seed)
