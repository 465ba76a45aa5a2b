"""`tf.random.stateless_uniform` for a whole batch of seeds in one set of ops.

That op takes one seed, so drawing each example's numbers from its own seed costs an op
call per example. `uniform_rows(seeds, count)` gives row i equal, bit for bit, to
`tf.random.stateless_uniform([count], seeds[i])` (float32, TensorFlow's CPU algorithm;
`tests/test_batches.py` checks it against the op). What TensorFlow computes
(Philox-4x32-10, `tensorflow/core/lib/random/philox_random.h`):
- the int64 seed (s0, s1) is scrambled by one Philox block on the counter (s0 lo, s0 hi,
  s1 lo, s1 hi) with key (0x3ec8f720, 0x02461e29): the block's first two words are the key,
  its last two the counter's high half, its low half 0;
- output block g is Philox on that counter plus g (low word), four 32-bit words each;
- a word w becomes the float with w's low 23 bits as mantissa and exponent 0, minus 1.
Words are held in uint64 tensors below 2^32, so a 32x32-bit product is exact.
"""

from __future__ import annotations

import tensorflow as tf

_LOW = 0xFFFFFFFF
_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
_KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
_SCRAMBLE_KEY = (0x3EC8F720, 0x02461E29)
_ROUNDS = 10


def _constant(value: int) -> tf.Tensor:
    return tf.constant(value, tf.uint64)


def _block(counter: list[tf.Tensor], key: list[tf.Tensor]) -> list[tf.Tensor]:
    """Philox-4x32-10 on four word tensors and a two-word key (broadcast together)."""
    low, shift = _constant(_LOW), _constant(32)
    xor = tf.bitwise.bitwise_xor
    for _ in range(_ROUNDS):
        product_0 = _constant(_MULTIPLIERS[0]) * counter[0]
        product_1 = _constant(_MULTIPLIERS[1]) * counter[2]
        counter = [
            xor(xor(tf.bitwise.right_shift(product_1, shift), counter[1]), key[0]),
            tf.bitwise.bitwise_and(product_1, low),
            xor(xor(tf.bitwise.right_shift(product_0, shift), counter[3]), key[1]),
            tf.bitwise.bitwise_and(product_0, low),
        ]
        key = [tf.bitwise.bitwise_and(k + _constant(step), low) for k, step in zip(key, _KEY_STEPS)]
    return counter


def _words(value: tf.Tensor) -> list[tf.Tensor]:
    """An int64 tensor's low and high 32 bits, as uint64 tensors."""
    bits = tf.bitcast(tf.cast(value, tf.int64), tf.uint64)
    return [
        tf.bitwise.bitwise_and(bits, _constant(_LOW)),
        tf.bitwise.right_shift(bits, _constant(32)),
    ]


def uniform_rows(seeds: tf.Tensor, count: int) -> tf.Tensor:
    """float32 [rows, count]: row i is `tf.random.stateless_uniform([count], seeds[i])`,
    bit for bit, for int64 `seeds` [rows, 2]."""
    seeds = tf.convert_to_tensor(seeds, tf.int64)
    first, second = _words(seeds[:, 0]), _words(seeds[:, 1])
    mixed = _block(first + second, [_constant(k) for k in _SCRAMBLE_KEY])
    key, high = mixed[:2], mixed[2:]
    blocks = []
    for block in range((count + 3) // 4):
        start = tf.fill(tf.shape(high[0]), _constant(block))
        blocks.extend(_block([start, tf.zeros_like(start), *high], key))
    words = tf.stack(blocks[:count], axis=1)
    mantissa = tf.bitwise.bitwise_and(words, _constant(0x7FFFFF))
    ones = tf.bitwise.bitwise_or(mantissa, _constant(127 << 23))
    return tf.bitcast(tf.cast(ones, tf.uint32), tf.float32) - 1.0
