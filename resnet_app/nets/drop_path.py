"""Stochastic depth's and dropout's randomness: a stateless hash of (example key, block).

A resumed run, on any number of towers, must draw exactly what the
uninterrupted run drew, so the draws are a hash, not a random stream: the
step gives each example a 64-bit key (`example_keys`: seed, step and example
id), and block `b` keeps its branch for that example when
`uniform(key, b) >= rate_b` (Huang et al. 2016). The hash is splitmix64's
finalizer in wrapping uint64 arithmetic; it runs on every device and under XLA.
"""

from __future__ import annotations

import tensorflow as tf

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_DROPOUT_STREAM = 0xD50F_0D50F  # Keeps dropout's draws apart from stochastic depth's.


def _constant(value: int) -> tf.Tensor:
    return tf.constant(value, tf.uint64)


def mix(values: tf.Tensor) -> tf.Tensor:
    """splitmix64 of uint64 `values`, elementwise."""
    shift = tf.bitwise.right_shift
    z = values + _constant(_GOLDEN)
    z = tf.bitwise.bitwise_xor(z, shift(z, _constant(30))) * _constant(_MIX1)
    z = tf.bitwise.bitwise_xor(z, shift(z, _constant(27))) * _constant(_MIX2)
    return tf.bitwise.bitwise_xor(z, shift(z, _constant(31)))


def _as_uint64(values) -> tf.Tensor:
    return tf.bitcast(tf.cast(values, tf.int64), tf.uint64)


def _unit_float(hashes: tf.Tensor) -> tf.Tensor:
    """float32 in [0, 1) from the top 24 bits of uint64 hashes (exact in float32)."""
    bits = tf.bitwise.right_shift(hashes, _constant(40))
    return tf.cast(bits, tf.float32) * (1.0 / (1 << 24))


def example_keys(seed: int, step, example_ids, copies=None) -> tf.Tensor:
    """uint64 [batch]: each example's key at a training step (seed, step and id mixed).

    With repeated augmentation, `copies` (which of an example's copies each
    is) mixes in too, so copies drop apart; copy 0 keeps the plain key.
    """
    key = mix(mix(_as_uint64(seed)) + _as_uint64(step))
    keys = mix(key + _as_uint64(example_ids))
    if copies is None:
        return keys
    return tf.where(copies > 0, mix(keys + _as_uint64(copies)), keys)


def uniform(keys: tf.Tensor, block: int) -> tf.Tensor:
    """float32 [batch] in [0, 1): block `block`'s draw for each example key."""
    return _unit_float(mix(keys + _constant(block + 1)))


def block_rates(rate: float, blocks: int) -> list[float]:
    """Each block's drop rate, rising linearly to `rate` (timm's rule): rate * (b + 1) / blocks."""
    return [rate * (index + 1) / blocks for index in range(blocks)]


def drop(branch: tf.Tensor, keys: tf.Tensor, block: int, rate: float) -> tf.Tensor:
    """`branch`, each example's kept with probability 1 - rate and scaled by 1 / (1 - rate)."""
    keep = tf.cast(uniform(keys, block) >= rate, branch.dtype)
    scale = tf.cast(1.0 / (1.0 - rate), branch.dtype)
    return branch * tf.reshape(keep * scale, [-1, 1, 1, 1])


def dropout(inputs: tf.Tensor, keys: tf.Tensor, block: int, rate: float) -> tf.Tensor:
    """Inverted dropout of `inputs` [batch, ...]: each element draws from its example's key."""
    shape = tf.shape(inputs)
    count = tf.reduce_prod(shape[1:])
    base = mix(mix(keys + _constant(_DROPOUT_STREAM)) + _constant(block + 1))
    index = tf.cast(tf.range(count), tf.uint64)
    drawn = _unit_float(mix(base[:, None] + index[None, :]))
    keep = tf.cast(drawn >= rate, inputs.dtype) * tf.cast(1.0 / (1.0 - rate), inputs.dtype)
    return inputs * tf.reshape(keep, shape)
