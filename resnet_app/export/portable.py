"""The classifier that TFLite and ONNX files hold: fixed-size uint8 images in, probabilities out.

Converters want one static graph without string ops or `map_fn`, so the
portable classifier takes images already brought to one size (`input_size`:
CIFAR's training size, or ImageNet's evaluation resize, whose centre crop is
taken inside) and does the rest of the evaluation preprocessing itself.
`fixed_size_image` brings any image to that size as evaluation would, so the
parity report and predict feed the pixels the SavedModel sees.
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
    """One uint8 image of any size as the portable classifier takes it (`Family.served_image`)."""
    return families.of(preprocessing).served_image(image, preprocessing)


def split_images(split, preprocessing: Preprocessing, count: int | None = None):
    """(uint8 [N, S, S, C] images at `input_size`, int64 labels) of a `data.sources.Split`'s
    first `count` examples (None: all), in the run's channels."""
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
                    content if content is not None else tf.io.read_file(split.files[i]), channels
                )
            images.append(fixed_size_image(image, preprocessing))
            labels.append(split.labels[i])
    if not images:
        size = input_size(preprocessing)
        return np.zeros((0, size, size, channels), np.uint8), np.zeros(0, np.int64)
    # Class ids, or multi-hot rows for multi-label data.
    return np.stack([np.asarray(image) for image in images]), np.stack(labels).astype(np.int64)


class PortableClassifier(tf.Module):
    """A run's network with its preprocessing, as one function for converters.

    `classify(images)`: uint8 [batch, S, S, C] (S = `input_size`, C the run's
    channels) -> {"probabilities": float32 [batch, classes]}: softmax(logits /
    temperature), with `tta="flip"` averaged with the mirror image's;
    multi-label, each class's sigmoid.
    """

    def __init__(
        self,
        model,
        preprocessing: Preprocessing,
        temperature: float = 1.0,
        tta: str = "none",
        multi_label: bool = False,
    ):
        super().__init__(name="resnet_app_portable")
        self.model = model
        self.multi_label = multi_label
        # The converter freezes the variables it can reach from the module; Keras 3's
        # own Variable objects hide them, and the file would have NaN weights.
        self.weights = [variable.value for variable in model.weights]
        self.preprocessing = preprocessing
        self.temperature = float(temperature)
        self.tta = tta
        size = input_size(preprocessing)
        spec = tf.TensorSpec([None, size, size, preprocessing.channels], tf.uint8, name="images")
        self.classify = tf.function(self._classify, input_signature=[spec])

    def _classify(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        config = self.preprocessing
        pixels = families.of(config).crop_served(tf.cast(images, tf.float32), config)
        # Constants made in the graph: some converters drop captured tensors.
        mean = tf.constant(np.asarray(config.mean, np.float32))
        std = tf.constant(np.asarray(config.std, np.float32))
        pixels = (pixels - mean) / std
        # Grouped convs (ResNeXt) as dense ones: not every converter has the grouped op.
        with grouped_conv.forced("split"):
            _, probabilities = classify_pixels(
                self.model, pixels, self.tta, self.temperature, self.multi_label
            )
        return {"probabilities": probabilities}


def classify_pixels(model, pixels, tta_mode: str, temperature: float, multi_label: bool):
    """(logits, probabilities) of preprocessed images: softmax(logits / T); with flip the
    views' averaged probabilities, the logits their log (`engine/tta.py`); multi-label,
    each class's sigmoid."""
    if tta_mode == tta.FLIP and not multi_label:
        logits = tta.mean_probability_logits(tta.view_logits(model, pixels, tta.FLIP), temperature)
        return logits, tf.nn.softmax(logits)
    logits = tf.cast(model(pixels, training=False), tf.float32)
    return logits, tf.sigmoid(logits) if multi_label else tf.nn.softmax(logits / temperature)
