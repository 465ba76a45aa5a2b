"""The training stream's randomness: stateless seeds drawn from the one `--seed`.

Every random choice of the training stream is a function of (seed, epoch), or
of (seed, epoch, example id): the epoch's order (`permutation`), the shuffle of
streamed records (`stream_seed` with `RECORDS`) and each example's
augmentation (`example_seed`). Nothing depends on what was drawn before, so
the stream can be entered at any example and a resumed run redraws exactly
what the interrupted one would have drawn.
"""

from __future__ import annotations

import tensorflow as tf

# Independent streams of randomness drawn from the one --seed (MIX: Mixup and
# CutMix, one draw per batch number; SAMPLE: class-balanced sampling).
ORDER, AUGMENT, RECORDS, MIX, SAMPLE = 1, 2, 3, 4, 5


def stream_seed(seed: int, stream: int, epoch) -> tf.Tensor:
    """The int64 [2] seed of one stream (`ORDER`, ...) in one epoch (an int or int tensor)."""
    base = tf.constant([seed, stream], tf.int64)
    return tf.random.experimental.stateless_fold_in(base, tf.cast(epoch, tf.int64))


def augment_key(seed: int, epoch, copy: int = 0) -> tf.Tensor:
    """The int64 key of one epoch's augmentations: a 64-bit hash of (seed, epoch).

    (`stateless_fold_in` returns [hash(seed, stream), epoch], whose first element
    does not depend on the epoch: the key is drawn from the whole pair.) With
    repeated augmentation (`data/repeats.py`), copy c > 0 of each example draws
    from a key of its own; copy 0 is every run's.
    """
    pair = stream_seed(seed, AUGMENT, epoch)
    if copy:
        pair = tf.random.experimental.stateless_fold_in(pair, copy)
    return tf.random.stateless_uniform([], pair, minval=None, maxval=None, dtype=tf.int64)


def example_seed(seed: int, epoch, example_id) -> tf.Tensor:
    """The int64 [2] seed of one example's augmentation in one epoch: [epoch key, id]."""
    return tf.stack([augment_key(seed, epoch), tf.cast(example_id, tf.int64)])


def permutation(size: int, seed: int, epoch) -> tf.Tensor:
    """int64 [size]: the example indices of an epoch in visiting order, from (seed, epoch)."""
    order_seed = stream_seed(seed, ORDER, epoch)
    return tf.random.experimental.stateless_shuffle(tf.range(size, dtype=tf.int64), order_seed)
