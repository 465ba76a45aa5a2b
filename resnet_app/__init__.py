"""resnet_app: ResNet image-classification training on TensorFlow 2.

Importing the package picks TensorFlow's BFC allocator for CPU memory
(`TF_CPU_ALLOCATOR_USE_BFC=true`) unless the environment already sets it; TF
reads the variable when it first creates its devices, so a process that ran
TensorFlow before importing resnet_app keeps its allocator. TF's default CPU
allocator hands every tensor of a step back to malloc, and with TF's own
(Eigen) kernels, used on CPUs without AVX512_VNNI, AVX512_BF16 or AMX, the
step's buffers were then mapped afresh every step (17,700 to 51,800 page
faults per step of ResNet-20 at batch 128, against about 1,600 with BFC):
with the distributed input of `OneDeviceStrategy`, the trainer ran at 0.59x
Keras `fit`, two towers slower still. The BFC allocator keeps the memory and
reuses it (docs/performance.md, "On CPUs without oneDNN").
"""

import os

__version__ = "0.1.0"

CPU_ALLOCATOR_VARIABLE = "TF_CPU_ALLOCATOR_USE_BFC"
# Whether the import set the allocator (the benchmark's Keras rows undo it).
CPU_ALLOCATOR_DEFAULTED = CPU_ALLOCATOR_VARIABLE not in os.environ
os.environ.setdefault(CPU_ALLOCATOR_VARIABLE, "true")
