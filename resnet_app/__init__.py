"""resnet_app: ResNet image-classification training on TensorFlow 2.

Importing the package picks TensorFlow's BFC allocator for CPU memory unless
the environment sets `TF_CPU_ALLOCATOR_USE_BFC`: TF's default hands every
tensor back to malloc, and with its Eigen kernels (CPUs without oneDNN) a
step's buffers were mapped afresh every step (docs/performance.md).
"""

import os

__version__ = "0.1.0"

CPU_ALLOCATOR_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
# Whether the import set the allocator (the benchmark's Keras rows undo it).
CPU_ALLOCATOR_DEFAULTED = CPU_ALLOCATOR_VARIABLE not in os.environ
os.environ.setdefault(CPU_ALLOCATOR_VARIABLE, "true")
