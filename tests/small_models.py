"""Small networks and starting weights shared by the step and model-averaging tests."""

import keras
import numpy as np

from resnet_app.nets.resnet import create_model

SIZE = 8  # Image height and width.


def tiny_bn(synchronized: bool) -> keras.Model:
    """The one-unit ResNet with BatchNorm, per tower or synchronized."""
    # A large weight decay makes a miscounted regularization loss visible.
    return create_model("tiny", bn_synchronized=synchronized, weight_decay=0.05, num_classes=5)


def no_bn() -> keras.Model:
    """A conv, a pool and logits: no state but the weights."""
    l2 = keras.regularizers.L2(0.05)
    return keras.Sequential(
        [
            keras.layers.Conv2D(4, 3, padding="same", activation="relu", kernel_regularizer=l2),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(5, kernel_regularizer=l2),
        ]
    )


def initial_weights(make_model, seed: int = 0) -> list[np.ndarray]:
    """Starting weights of `make_model()`'s network, the same whatever ran before."""
    keras.utils.set_random_seed(seed)
    model = make_model()
    model.build((None, SIZE, SIZE, 3))
    # Non-trivial BatchNorm parameters, so that their gradients matter.
    rng = np.random.default_rng(1)
    return [w + 0.1 * rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()]
