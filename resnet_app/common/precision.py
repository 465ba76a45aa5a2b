"""The names `train.precision` takes and what each computes in (no TensorFlow).

One table for the config's check, the images' dtype and the model's Keras
dtype policy; `auto` (`auto_precision.py`) resolves to one of these names.
"""

# train.precision -> the dtype the layers compute in (and the images' dtype,
# `data.dtype`, unless set). Weights stay float32 in every mixed precision.
COMPUTE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

# train.precision -> the Keras dtype policy its model is built under.
KERAS_POLICIES = {
    name: dtype if dtype == "float32" else f"mixed_{dtype}"
    for name, dtype in COMPUTE_DTYPES.items()
}
