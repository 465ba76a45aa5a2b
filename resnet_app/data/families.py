"""The two preprocessing families (the CIFAR and ImageNet recipes) as objects.

`of(preprocessing)` gives the `Family` of `Preprocessing.family`, which answers what the
pipeline and the exports ask: `augment` (one training example's part), `evaluate` (one
evaluation image), `crops` (whether multi-crop evaluation applies), `eval_resize` (the
shorter side before evaluation's central crop), and for a portable export
(`export/portable.py`) `served_size`, `served_image`, `crop_served` and `resize_text`.
No TensorFlow at module level: command-line checks read `title` and `crops` before it loads.
"""

from __future__ import annotations

from typing import ClassVar

from resnet_app.common.errors import ConfigError

EVAL_CROP_FRACTION = 0.875  # 224 / 256


class Family:
    """One family. Each gives `augment(image, seed, config, encoded, resize)`: one training
    example's {"image": ...} and per-example draws, from uint8 pixels (or encoded bytes) and
    its int64 [2] seed; `evaluate(image, config, encoded, resize, crops)`: one evaluation
    image (with `crops`, [5, size, size, 3]); `eval_resize(eval_resize, eval_image_size,
    size)`: the shorter side before the central crop, refusing settings that cannot work;
    `served_size(config)`: the portable classifier's input size."""

    name: ClassVar[str]
    title: ClassVar[str]
    crops: ClassVar[bool]
    resize_text: ClassVar[str]

    def served_image(self, image, config):
        """One uint8 image of any size as the portable classifier takes it."""
        import tensorflow as tf

        size = self.served_size(config)
        image = tf.convert_to_tensor(image)
        if image.shape[0] != size or image.shape[1] != size:
            image = tf.image.resize(tf.cast(image, tf.float32), [size, size])
        return tf.cast(tf.clip_by_value(tf.round(tf.cast(image, tf.float32)), 0, 255), tf.uint8)

    def crop_served(self, pixels, config):
        """What the portable classifier does to its float input before normalizing it."""
        return pixels


class Cifar(Family):
    """He et al. 2015: pad, random crop, flip; whole images, normalized, in evaluation."""

    name, title, crops = "cifar", "CIFAR recipe", False
    resize_text = "the whole image to input_size x input_size"

    def augment(self, image, seed, config, encoded, resize):
        from resnet_app.data import preprocessing

        if encoded or resize:
            image = preprocessing.resize_only(image, config, encoded=encoded)
        # Only the draws: `preprocessing.cifar_train_batch` applies them batch-wise.
        return preprocessing.cifar_augment(image, seed, config)

    def evaluate(self, image, config, encoded, resize=True, crops=False):
        from resnet_app.data import preprocessing

        if crops:
            raise ConfigError(
                "the CIFAR recipe evaluates whole images: there are no corner crops; use --tta=flip"
            )
        if encoded or resize:
            image = preprocessing.resize_only(image, config, encoded=encoded)
        return preprocessing.cifar_eval(image, config)

    def eval_resize(self, eval_resize, eval_image_size, size):
        if eval_image_size:
            raise ConfigError(
                f"data.eval_image_size={eval_image_size}: the CIFAR recipe evaluates "
                f"whole images at the training size ({size} px); drop it, or use "
                "data.preprocessing=imagenet"
            )
        return eval_resize or round(size / EVAL_CROP_FRACTION)

    def served_size(self, config):
        return config.image_size


class Imagenet(Family):
    """Szegedy et al. 2015 crops in training; the shorter side resized and the centre kept."""

    name, title, crops = "imagenet", "ImageNet recipe", True
    resize_text = "shorter side to input_size, then the centre square"

    def augment(self, image, seed, config, encoded, resize):
        from resnet_app.data import preprocessing

        return {"image": preprocessing.imagenet_train(image, seed, config, encoded=encoded)}

    def evaluate(self, image, config, encoded, resize=True, crops=False):
        from resnet_app.data import preprocessing

        return preprocessing.imagenet_eval(image, config, encoded=encoded, corners=crops)

    def eval_resize(self, eval_resize, eval_image_size, size):
        eval_size = eval_image_size or size
        resized = eval_resize or round(eval_size / EVAL_CROP_FRACTION)
        if resized < eval_size:
            raise ConfigError(
                f"eval_resize={resized} is smaller than the evaluation size {eval_size}; "
                "the central crop needs eval_resize >= it (usually the size / 0.875)"
            )
        return resized

    def served_size(self, config):
        return config.eval_resize

    def served_image(self, image, config):
        import tensorflow as tf

        from resnet_app.data import preprocessing

        size = self.served_size(config)
        # The shorter side to `size`, the centre; a long strip costs only its crop.
        image = preprocessing.resized_crops(tf.convert_to_tensor(image), size, size)[0]
        return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)

    def crop_served(self, pixels, config):
        offset = (config.eval_resize - config.eval_size) // 2
        size = config.eval_size
        return pixels[:, offset : offset + size, offset : offset + size, :]


FAMILIES: dict[str, Family] = {family.name: family for family in (Cifar(), Imagenet())}


def named(name: str) -> Family:
    """The family called `name` ("cifar" or "imagenet")."""
    return FAMILIES[name]


def of(config) -> Family:
    """The family of a `Preprocessing`."""
    return FAMILIES[config.family]
