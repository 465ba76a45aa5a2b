"""Session setup: the CPU is split into 3 logical devices, so that tests can
run towers (MirroredStrategy replicas) on any machine. This must happen before
TensorFlow initializes its devices, hence at import, before any test runs."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

NUM_LOGICAL_CPUS = 3

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
)
