"""Stochastic depth's randomness: one uniform number per (example key, block), hashed, stateless.

Stochastic depth (Huang et al. 2016) drops a residual branch per example in
training. Its draws must not depend on which tower an example lands on, nor on
what was drawn before, so that a run resumed at any step, on any number of
towers, draws exactly what the uninterrupted run drew. So the draws are a hash:
the training step gives each example a 64-bit key (`example_keys`: from the
seed, the step and the example's id), and block `b` keeps its branch for that
example when `uniform(key, b) >= rate_b`. The hash is splitmix64's finalizer
(Steele et al. 2014), in uint64 arithmetic, which wraps as the algorithm needs;
it runs on every device and under XLA.

`block_rates(rate, blocks)`: the rates rise linearly with depth, the last block
dropping at `rate` (Huang et al.'s linear decay rule, as timm applies it).
"""

from __future__ import annotations

import tensorflow as tf

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


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


def example_keys(seed: int, step, example_ids, copies=None) -> tf.Tensor:
    """uint64 [batch]: each example's key at a training step (seed, step and id mixed).

    With repeated augmentation, `copies` (which of an example's k copies each is,
    all in one step) mixes in too, so the copies drop their blocks apart as
    timm's per-sample draws do; copy 0 keeps the key of a run without repeats.
    """
    key = mix(mix(_as_uint64(seed)) + _as_uint64(step))
    keys = mix(key + _as_uint64(example_ids))
    if copies is None:
        return keys
    return tf.where(copies > 0, mix(keys + _as_uint64(copies)), keys)


def uniform(keys: tf.Tensor, block: int) -> tf.Tensor:
    """float32 [batch] in [0, 1): block `block`'s draw for each example key."""
    bits = tf.bitwise.right_shift(mix(keys + _constant(block + 1)), _constant(40))
    return tf.cast(bits, tf.float32) * (1.0 / (1 << 24))  # 24 bits: exact in float32.


def block_rates(rate: float, blocks: int) -> list[float]:
    """The drop rate of each of `blocks` residual blocks: rate * (b + 1) / blocks."""
    return [rate * (index + 1) / blocks for index in range(blocks)]


def drop(branch: tf.Tensor, keys: tf.Tensor, block: int, rate: float) -> tf.Tensor:
    """`branch` with each example's kept with probability 1 - rate, scaled by 1 / (1 - rate).

    The expected output is `branch` (inverted scaling, as timm's DropPath), so
    evaluation uses the branch as it is.
    """
    keep = tf.cast(uniform(keys, block) >= rate, branch.dtype)
    scale = tf.cast(1.0 / (1.0 - rate), branch.dtype)
    return branch * tf.reshape(keep * scale, [-1, 1, 1, 1])


_DROPOUT_STREAM = 0xD50F_0D50F  # Keeps dropout's draws apart from stochastic depth's.


def dropout(inputs: tf.Tensor, keys: tf.Tensor, block: int, rate: float) -> tf.Tensor:
    """Inverted dropout of `inputs` [batch, ...], each element's draw a hash of its example's key.

    Element i of example e is kept when the uniform of (keys[e], block, i) is
    at least `rate`, and scaled by 1 / (1 - rate), so the expected output is
    `inputs` and evaluation uses it as it is. The draws depend on the example
    and the element only, not on the tower or on earlier draws.
    """
    shape = tf.shape(inputs)
    count = tf.reduce_prod(shape[1:])
    base = mix(mix(keys + _constant(_DROPOUT_STREAM)) + _constant(block + 1))
    index = tf.cast(tf.range(count), tf.uint64)
    bits = tf.bitwise.right_shift(mix(base[:, None] + index[None, :]), _constant(40))
    uniform = tf.cast(bits, tf.float32) * (1.0 / (1 << 24))
    keep = tf.cast(uniform >= rate, inputs.dtype) * tf.cast(1.0 / (1.0 - rate), inputs.dtype)
    return inputs * tf.reshape(keep, shape)
