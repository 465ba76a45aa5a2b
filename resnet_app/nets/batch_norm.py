"""BatchNorm on TensorFlow's fused kernel: Keras's layer, faster to train and to serve.

Keras 3 normalizes in separate element-wise passes; `FusedBatchNormV3` does
it in one (and folds into the conv in inference). `BatchNorm` keeps Keras's
variables and moving-average rule; synchronized statistics, masks, renorm,
float64 and a frozen layer in training take Keras's own path.
"""

from __future__ import annotations

import keras
import tensorflow as tf

# What the fused kernel takes (its parameters are float32); float64 takes Keras's path.
_KERNEL_DTYPES = (tf.float32, tf.bfloat16, tf.float16)


class BatchNorm(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization`, trained through the fused kernel (NHWC, 4-D)."""

    def call(self, inputs, training=None, mask=None):
        fused = (
            not self.renorm
            and mask is None
            and len(inputs.shape) == 4
            and self.axis in (-1, 3)
            and inputs.dtype in _KERNEL_DTYPES
        )
        if not fused or (training and (not self.trainable or self.synchronized)):
            return super().call(inputs, training=training, mask=mask)
        channels = inputs.shape[-1]
        gamma = self.gamma if self.scale else tf.ones([channels])
        beta = self.beta if self.center else tf.zeros([channels])
        moving = {}
        if not training:  # Normalized by the moving statistics.
            moving = {
                "mean": tf.cast(self.moving_mean, tf.float32),
                "variance": tf.cast(self.moving_variance, tf.float32),
            }
        # Mixed precision: bfloat16/float16 images, float32 parameters and compute.
        outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
            inputs,
            tf.cast(gamma, tf.float32),
            tf.cast(beta, tf.float32),
            epsilon=self.epsilon,
            data_format="NHWC",
            is_training=bool(training),
            **moving,
        )
        if training:
            # The kernel's variance has Bessel's correction; Keras's moving one is biased.
            count = tf.cast(tf.reduce_prod(tf.shape(inputs)[:-1]), tf.float32)
            variance = variance * tf.math.divide_no_nan(count - 1.0, count)
            momentum = self.momentum
            self.moving_mean.assign(self.moving_mean * momentum + mean * (1.0 - momentum))
            self.moving_variance.assign(
                self.moving_variance * momentum + variance * (1.0 - momentum)
            )
        return tf.cast(outputs, self.compute_dtype)
