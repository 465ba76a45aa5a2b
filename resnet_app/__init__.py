"""resnet_app: ResNet image-classification training on TensorFlow 2.

Importing it picks TensorFlow's BFC allocator for CPU memory (unless set): the
default one maps a step's buffers afresh every step (docs/performance.md).
"""

import os

__version__ = "0.1.0"

CPU_ALLOCATOR_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
# Whether the import set the allocator (the benchmark's Keras rows undo it).
CPU_ALLOCATOR_DEFAULTED = CPU_ALLOCATOR_VARIABLE not in os.environ
os.environ.setdefault(CPU_ALLOCATOR_VARIABLE, "true")
