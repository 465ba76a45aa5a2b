"""Input pipeline throughput, side by side with what training consumes.

  python scripts/input_benchmark.py [--batch_size=128] [--imagenet_batch_size=32]
      [--randaugment_ops=2 --randaugment_magnitude=9 --erase_probability=0.25]
      [--auto_augment=ta_wide|imagenet|augmix --augmix_jsd=12]

Measures, in one run on this machine (images/sec, the median of 3 timed windows
after a warm-up):
- the CIFAR-style training pipeline on `shapes` (in memory, pad-crop-flip);
- the ImageNet-style training pipeline on a folder of JPEGs written for the
  run (ImageNet-like 500x375 images, fused decode-and-crop, resize to 224);
- ResNet-20 training steps fed by `synthetic` data (free input) and by the
  `shapes` pipeline. Their ratio says whether training is input-bound: 1.00
  means the pipeline costs the training nothing.
The augmentation flags turn RandAugment, an op policy (TrivialAugment,
AutoAugment, AugMix; `--augmix_jsd` makes each example three views) and
random erasing on in both pipelines (and in the `shapes` pipeline that feeds
ResNet-20). Rates count examples, whatever their views.
Ratios matter, not absolute numbers: shared machines are noisy.
"""

import os
import statistics
import sys
import tempfile
import time

from absl import flags

from resnet_app.common import cli

_BATCH = flags.DEFINE_integer("batch_size", 128, "Global batch for the CIFAR-style runs.")
_IMAGENET_BATCH = flags.DEFINE_integer("imagenet_batch_size", 32, "Batch for ImageNet style.")
_WINDOWS = flags.DEFINE_integer("windows", 3, "Timed windows per measurement (median).")
_STEPS = flags.DEFINE_integer("steps", 30, "Batches per timed window.")
_JPEGS = flags.DEFINE_integer("jpegs", 256, "JPEG files written for the ImageNet-style run.")
_TRAIN = flags.DEFINE_boolean("train", True, "Also measure ResNet-20 training consumption.")
_RA_OPS = flags.DEFINE_integer("randaugment_ops", 0, "RandAugment ops per image (0: off).")
_RA_MAGNITUDE = flags.DEFINE_float("randaugment_magnitude", 9.0, "RandAugment magnitude M.")
_ERASE = flags.DEFINE_float("erase_probability", 0.0, "Random erasing probability (0: off).")
_POLICY = flags.DEFINE_string("auto_augment", "none", "An op policy: ta_wide, imagenet, augmix.")
_JSD = flags.DEFINE_float("augmix_jsd", 0.0, "AugMix's consistency loss weight (3 views).")


def augmentation() -> dict:
    """The data settings the augmentation flags set (flat names: `data_config` groups them)."""
    return {
        "randaugment_ops": _RA_OPS.value,
        "randaugment_magnitude": _RA_MAGNITUDE.value,
        "erase_probability": _ERASE.value,
        "augment": {"auto_augment": _POLICY.value, "augmix_jsd": _JSD.value},
    }


def describe_augmentation() -> str:
    """E.g. ", RandAugment N=2 M=9, erasing p=0.25", or "" when both are off."""
    parts = []
    if _RA_OPS.value:
        parts.append(f"RandAugment N={_RA_OPS.value} M={_RA_MAGNITUDE.value:g}")
    if _POLICY.value != "none":
        parts.append(_POLICY.value + (f" with 3 views (JSD {_JSD.value:g})" if _JSD.value else ""))
    if _ERASE.value:
        parts.append(f"erasing p={_ERASE.value:g}")
    return "".join(f", {part}" for part in parts)


def images_per_second(next_batch, batch_size: int) -> float:
    """Median images/sec over the timed windows, after a warm-up window."""
    steps = _STEPS.value
    for _ in range(steps):
        next_batch()
    rates = []
    for _ in range(_WINDOWS.value):
        start = time.perf_counter()
        for _ in range(steps):
            next_batch()
        rates.append(steps * batch_size / (time.perf_counter() - start))
    return statistics.median(rates)


def pipeline_rate(dataset, batch_size: int) -> float:
    iterator = iter(dataset)

    def next_batch():
        # Touch the data so that nothing is left lazily unevaluated.
        return next(iterator)["image"].numpy()

    return images_per_second(next_batch, batch_size)


def write_jpegs(directory: str, count: int) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:375, 0:500]
    for i in range(count):
        folder = os.path.join(directory, "train", f"class{i % 4}")
        os.makedirs(folder, exist_ok=True)
        phases = rng.uniform(0, 6, 3)
        image = np.stack(
            [
                128 + 100 * np.sin(x / (9 + 3 * c) + p) * np.cos(y / 13 - p)
                for c, p in enumerate(phases)
            ],
            -1,
        )
        image += rng.normal(0, 12, image.shape)
        encoded = tf.io.encode_jpeg(np.clip(image, 0, 255).astype(np.uint8), quality=90)
        tf.io.write_file(os.path.join(folder, f"{i}.jpg"), encoded)


def training_rate(pipeline, batch_size: int) -> float:
    import keras
    import tensorflow as tf

    from resnet_app.engine import consistency, losses
    from resnet_app.nets.resnet import create_model

    model = create_model("resnet20", num_classes=pipeline.num_classes)
    model.build((None, 32, 32, 3))
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_of = losses.Loss(jsd_weight=_JSD.value)

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            # With AugMix's views, all three in one pass, as the trainer's tower runs them.
            logits = model(consistency.stacked_images(batch), training=True)
            logits, batch = consistency.split(logits, batch)
            total, _ = loss_of(logits, batch)
            loss = total / tf.cast(tf.shape(logits)[0], tf.float32) + tf.add_n(model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    iterator = iter(pipeline.train_dataset(batch_size))
    return images_per_second(lambda: step(next(iterator)).numpy(), batch_size)


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    from resnet_app.data import input_pipeline
    from resnet_app.data.settings import data_config

    rows = []
    extra = augmentation()
    shapes = input_pipeline.create_pipeline(data_config(dataset="shapes", **extra))
    cifar = pipeline_rate(shapes.train_dataset(_BATCH.value), _BATCH.value)
    rows.append((f"CIFAR style: shapes, 32 px, pad-crop-flip{describe_augmentation()}", cifar))
    with tempfile.TemporaryDirectory() as directory:
        write_jpegs(directory, _JPEGS.value)
        folder = input_pipeline.create_pipeline(
            data_config(dataset=f"folder:{directory}", image_size=224, **extra)
        )
        imagenet = pipeline_rate(folder.train_dataset(_IMAGENET_BATCH.value), _IMAGENET_BATCH.value)
        name = f"ImageNet style: 500x375 JPEG files, crop to 224{describe_augmentation()}"
        rows.append((name, imagenet))
    if _TRAIN.value:
        # The same settings: with AugMix's views, synthetic batches carry them too.
        synthetic = input_pipeline.create_pipeline(
            data_config(dataset="synthetic", image_size=32, **extra)
        )
        free = training_rate(synthetic, _BATCH.value)
        fed = training_rate(shapes, _BATCH.value)
        rows.append(("ResNet-20 training, synthetic input", free))
        rows.append(("ResNet-20 training, shapes pipeline", fed))
    width = max(len(name) for name, _ in rows)
    lines = [f"{'measurement':<{width}}  images/sec"]
    lines += [f"{name:<{width}}  {rate:10.0f}" for name, rate in rows]
    if _TRAIN.value:
        lines.append(f"CIFAR pipeline / ResNet-20 consumption: {cifar / free:.1f}x")
        lines.append(f"ResNet-20 fed by shapes / by synthetic: {fed / free:.2f}")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    cli.run(main)
