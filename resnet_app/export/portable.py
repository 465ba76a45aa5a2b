"""The classifier that TFLite and ONNX files hold: fixed-size uint8 images in, probabilities out.

Converters and small runtimes want one static graph without string ops or
`map_fn`, so the portable classifier takes images already brought to one size
(`input_size`), and does the rest of the run's evaluation preprocessing inside:

- CIFAR family: images of the training size (`image_size`); normalized with
  the run's mean and std.
- ImageNet family: square images of the evaluation resize (`eval_resize`, 256
  for 224), i.e. the shorter side already resized to it and the centre
  squared; the centre crop of the evaluation size (`eval_size`) is taken
  inside, as evaluation does.

`fixed_size_image` brings any image to that size exactly as evaluation would,
so a caller (the parity report, predict) feeds the same pixels the SavedModel
sees. Probabilities are `softmax(logits / temperature)` (the run's fitted
temperature, 1 without one); with `tta="flip"` they are averaged with those of
the horizontally flipped image (twice the compute).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from resnet_app.data import channels as image_channels
from resnet_app.data import families
from resnet_app.data.preprocessing import Preprocessing, decode_image
from resnet_app.engine import tta
from resnet_app.nets import grouped_conv


def input_size(preprocessing: Preprocessing) -> int:
    """The height and width of the portable classifier's input (`Family.served_size`)."""
    return families.of(preprocessing).served_size(preprocessing)


def fixed_size_image(image: tf.Tensor, preprocessing: Preprocessing) -> tf.Tensor:
    """One uint8 image of any size as the portable classifier takes it (uint8, rounded).

    CIFAR family: resized to `image_size` when it differs (as evaluation does
    for files). ImageNet family: the shorter side resized to `eval_resize`,
    then the centre square cropped (`Family.served_image`).
    """
    return families.of(preprocessing).served_image(image, preprocessing)


def split_images(split, preprocessing: Preprocessing, count: int | None = None):
    """(uint8 [N, S, S, C] images at `input_size`, int64 [N] labels) of a split's first examples.

    C is the run's channels: images of the other kind are converted.

    Args:
      split: a `data.sources.Split` (arrays, files or records).
      preprocessing: the run's preprocessing.
      count: at most this many examples (None: all).
    """
    total = split.num_examples if count is None else min(count, split.num_examples)
    channels = preprocessing.channels
    images, labels = [], []
    if not split.indexed:
        for example in split.stream.evaluation(1, 0).take(total):
            image = decode_image(example["image"], channels)
            images.append(fixed_size_image(image, preprocessing))
            labels.append(np.asarray(example["label"]))
    else:
        for i in range(total):
            if split.images is not None:
                image = image_channels.convert(split.images[i], channels)
            else:
                content = split.contents[i] if split.contents is not None else None
                image = decode_image(
                    content if content is not None else tf.io.read_file(split.files[i]),
                    channels,
                )
            images.append(fixed_size_image(image, preprocessing))
            labels.append(split.labels[i])
    size = input_size(preprocessing)
    stacked = (
        np.stack([np.asarray(image) for image in images])
        if images
        else np.zeros((0, size, size, channels), np.uint8)
    )
    # Class ids, or multi-hot rows for multi-label data.
    return stacked, np.stack(labels).astype(np.int64) if labels else np.zeros(0, np.int64)


class PortableClassifier(tf.Module):
    """A run's network with its preprocessing, as one function for converters.

    `classify(images)`: uint8 [batch, S, S, C] with S = `input_size` and C
    the run's channels (1: greyscale, 3: RGB) ->
    {"probabilities": float32 [batch, classes]}.
    """

    def __init__(
        self,
        model,
        preprocessing: Preprocessing,
        temperature: float = 1.0,
        tta: str = "none",
        batch: int | None = None,
        multi_label: bool = False,
    ):
        super().__init__(name="resnet_app_portable")
        self.model = model
        self.multi_label = multi_label
        # The converter freezes variables it can reach from the module; Keras 3
        # keeps them behind its own Variable objects, which it cannot see, and
        # would write a file with empty (NaN) weights.
        self.weights = [variable.value for variable in model.weights]
        self.preprocessing = preprocessing
        self.temperature = float(temperature)
        self.tta = tta
        size = input_size(preprocessing)
        spec = tf.TensorSpec([batch, size, size, preprocessing.channels], tf.uint8, name="images")
        self.classify = tf.function(self._classify, input_signature=[spec])

    def _classify(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        # Grouped convs (ResNeXt) as one dense conv per group: every converter
        # and runtime has the dense op, not all have the grouped one.
        with grouped_conv.forced("split"):
            return self._classify_images(images)

    def _classify_images(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        config = self.preprocessing
        pixels = families.of(config).crop_served(tf.cast(images, tf.float32), config)
        # Constants made in the graph: some converters drop captured tensors.
        mean = tf.constant(np.asarray(config.mean, np.float32))
        std = tf.constant(np.asarray(config.std, np.float32))
        pixels = (pixels - mean) / std
        if self.tta == tta.FLIP:  # The views' averaged probabilities (`engine/tta.py`).
            views = tta.view_logits(self.model, pixels, tta.FLIP)
            return {
                "probabilities": tf.nn.softmax(tta.mean_probability_logits(views, self.temperature))
            }
        logits = tf.cast(self.model(pixels, training=False), tf.float32)
        if self.multi_label:  # Each class's own probability.
            return {"probabilities": tf.sigmoid(logits)}
        return {"probabilities": tf.nn.softmax(logits / self.temperature)}
