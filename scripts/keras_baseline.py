"""The Keras baseline the benchmarks compare against: a user's model for `model.fit`.

A user writing the ResNet with Keras would get Keras's stock layers, so the
baseline is resnet_app's architecture with `keras.layers.BatchNormalization`
in place of resnet_app's fused-kernel BatchNorm (`nets/layers.py`); with
`stock_layers=False` it keeps resnet_app's own layers, which tells the gain of
the trainer's loop from that of its layers. `scripts/benchmark.py` times it on
synthetic batches; `scripts/time_to_accuracy.py` trains it to a target.
"""

from __future__ import annotations

from typing import Callable


def baseline_model(create: Callable, stock_layers: bool = True):
    """The model `create()` builds, with Keras's stock BatchNormalization when asked.

    Args:
      create: builds the model (called once, after the layer swap).
      stock_layers: swap in `keras.layers.BatchNormalization` (in this process:
        the benchmarks run each variant in a process of its own).

    Raises:
      RuntimeError: when the model holds other BatchNorm layers than the ones
        asked for (the comparison would measure the wrong layers).
    """
    import keras

    from resnet_app.common import compat
    from resnet_app.nets import layers as net_layers

    if stock_layers:  # What a user writing the ResNet with Keras would get.
        net_layers.BatchNorm = keras.layers.BatchNormalization
    model = create()
    norms = {
        type(layer)
        for layer in compat.nested_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
    }
    wanted = keras.layers.BatchNormalization if stock_layers else net_layers.BatchNorm
    if norms != {wanted}:
        raise RuntimeError(f"expected only {wanted.__name__} layers, built {norms}")
    return model
