"""Is `shapes` learnable but not trivial? ResNet-20 against a linear classifier.

  python scripts/check_shapes.py [--epochs=2] [--linear_examples=20000]

Trains ResNet-20 on the `shapes` training pipeline with plain Keras `fit`
(SGD with Nesterov momentum, batch 128, linear warm-up then cosine decay from
0.2), and reports the exact test accuracy after every epoch. Then fits a linear
classifier on raw pixels (ridge regression to one-hot targets, closed form) and
reports its test accuracy. The training engine's own recipe replaces the Keras
loop once it exists; this script checks the dataset, not the trainer.
"""

import sys
import time

from absl import flags

from resnet_app.common import cli
from resnet_app.common.errors import ConfigError

_EPOCHS = flags.DEFINE_integer("epochs", 2, "ResNet-20 training epochs (0 to skip).")
_LINEAR = flags.DEFINE_integer("linear_examples", 20_000, "Training images for the ridge fit.")
_BATCH = 128


def linear_accuracy(pipeline, count: int) -> float:
    import numpy as np

    def features(images):
        flat = images.reshape(len(images), -1).astype(np.float64) / 255
        return np.concatenate([flat, np.ones((len(images), 1))], axis=1)

    train, test = pipeline.train_split, pipeline.eval_split("test")
    design = features(train.images[:count])
    targets = np.eye(pipeline.num_classes)[train.labels[:count]]
    weights = np.linalg.solve(design.T @ design + 10 * np.eye(design.shape[1]), design.T @ targets)
    return float(np.mean(np.argmax(features(test.images) @ weights, 1) == test.labels))


def main(argv: list[str]) -> None:
    cli.reject_positional(argv)
    if _EPOCHS.value < 0 or _LINEAR.value < 1:
        raise ConfigError("--epochs must be 0 or more and --linear_examples 1 or more")
    import keras

    from resnet_app.data import input_pipeline
    from resnet_app.engine import exact_eval
    from resnet_app.nets.resnet import create_model

    pipeline = input_pipeline.create_pipeline(input_pipeline.DataConfig(dataset="shapes"))
    if _EPOCHS.value:
        steps = pipeline.num_train_examples // _BATCH
        train = pipeline.train_dataset(_BATCH).map(lambda batch: (batch["image"], batch["label"]))
        model = create_model("resnet20", num_classes=pipeline.num_classes)
        schedule = keras.optimizers.schedules.CosineDecay(
            0.0, _EPOCHS.value * steps, warmup_target=0.2, warmup_steps=200
        )
        model.compile(
            keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        start = time.perf_counter()
        for epoch in range(_EPOCHS.value):
            model.fit(train, epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)
            result = exact_eval.evaluate(model, pipeline, 500, split="test")
            sys.stdout.write(
                f"ResNet-20 epoch {epoch + 1}: test accuracy {result.accuracy:.4f} "
                f"({result.examples} images), {time.perf_counter() - start:.0f} s\n"
            )
            sys.stdout.flush()
    accuracy = linear_accuracy(pipeline, _LINEAR.value)
    sys.stdout.write(
        f"linear (ridge on pixels, {_LINEAR.value} images): test accuracy {accuracy:.4f}\n"
    )


if __name__ == "__main__":
    cli.run(main)
