"""The Keras baseline the benchmarks compare against: a user's model for `model.fit`.

A user writing the ResNet with Keras would get Keras's stock layers, so the
baseline is resnet_app's architecture with `keras.layers.BatchNormalization`
in place of resnet_app's fused-kernel BatchNorm (`nets/layers.py`); with
`stock_layers=False` it keeps resnet_app's own layers, which tells the gain of
the trainer's loop from that of its layers. `scripts/benchmark.py` times it on
synthetic batches.

`fit_recipe` trains a resnet_app recipe with it and `model.fit`, written as a
user would: Keras's `SGD(momentum, nesterov)`, the L2 penalty as the layers'
kernel regularizers, from-logits cross-entropy (label smoothing through one-hot
targets), the images through `tf.data` (shuffle, `map` with resize,
normalize, pad and random crop, flip and Cutout as the recipe asks, batch,
prefetch), the test split as `validation_data`, and Keras's default
`jit_compile="auto"`. The learning rate is the recipe's, step by step, as a
`LearningRateSchedule`: Keras's `LearningRateScheduler` callback sets it once
per epoch, which would turn a per-step warmup and decay into a staircase.
Recipes with parts it does not reproduce are refused (`unmirrored`).
`scripts/time_to_accuracy.py` times it to a target accuracy.
"""

from __future__ import annotations

from collections.abc import Callable


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


# What `fit_recipe` reproduces of a recipe: settings outside these, changed from
# their defaults, are refused (`unmirrored`). Model keys go to the same model
# builder; the schedule becomes a table of per-step rates.
MIRRORED = (
    "model.",
    "schedule.",
    "data.dataset",
    "data.image_size",
    "data.mean",
    "data.std",
    "data.dtype",
    "data.seed",
    "data.train_examples",
    "data.eval_examples",
    "data.augment.crop_padding",
    "data.augment.flip",
    "data.augment.cutout_size",
    "optimizer.class",
    "optimizer.learning_rate",
    "optimizer.momentum",
    "optimizer.nesterov",
    "train.batch_size",
    "train.epochs",
    "train.train_steps",
    "train.eval_every",
    "train.log_every",
    "train.steps_per_loop",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.seed",
    "train.label_smoothing",
    "train.precision",
    "train.eval_batch_size",
)


def unmirrored(resolved) -> list[str]:
    """The recipe's settings that `fit_recipe` does not reproduce (empty: all are)."""
    from resnet_app import config
    from resnet_app.config.differences import changes

    found = [
        key
        for key in changes(config.resolve(), resolved)
        if not any(key == m or (m.endswith(".") and key.startswith(m)) for m in MIRRORED)
    ]
    if resolved.data.dataset != "shapes":
        found.append(f"data.dataset={resolved.data.dataset} (fit here reads shapes)")
    kind = resolved.optimizer.to_dict().get("class")
    if kind not in ("momentum", "sgd"):
        found.append(f"optimizer.class={kind}")
    if resolved.train.precision == "fp16":
        found.append("train.precision=fp16")
    return found


def fit_recipe(
    resolved, pipeline, train_steps: int, eval_every: int, write: Callable[[dict], None]
):
    """Trains the recipe with `model.fit`, as a Keras user would write it; returns the model.

    The events go to `write` (see `run_timing.py`): the start, the first step
    and the end of every `eval_every` steps, and an evaluation of the test
    split after each (Keras's validation: `steps_per_epoch=eval_every`).

    Args:
      resolved: the recipe's config (`unmirrored` must find nothing).
      pipeline: its `InputPipeline` (the trainer's data, sizes and normalization).
      train_steps: the steps to train, a multiple of `eval_every`.
      eval_every: steps between evaluations.
      write: takes each event.
    """
    import time

    import keras
    import tensorflow as tf

    from resnet_app.engine.plan import plan_run
    from resnet_app.nets import factory

    size, classes = pipeline.preprocessing.image_size, pipeline.num_classes
    smoothing, seed = resolved.train.label_smoothing, resolved.train.seed
    keras.utils.set_random_seed(seed)
    train, test = fit_datasets(resolved, pipeline)
    plan = plan_run(resolved, pipeline.num_train_examples, size)
    rates = [plan.schedule(step, plan.steps_per_epoch) for step in range(train_steps)]

    class StepRates(keras.optimizers.schedules.LearningRateSchedule):
        """The recipe's learning rate at each step (the optimizer's iteration)."""

        def __init__(self, values):
            self.values = tf.constant(values, tf.float32)

        def __call__(self, step):
            last = tf.shape(self.values)[0] - 1
            return tf.gather(self.values, tf.minimum(tf.cast(step, tf.int32), last))

    options = resolved.optimizer.to_dict()
    model = baseline_model(
        lambda: factory.create_run_model(resolved, classes, size, resolved.train.precision)
    )
    model.compile(
        optimizer=keras.optimizers.SGD(
            StepRates(rates),
            momentum=options.get("momentum") or 0.0,
            nesterov=bool(options.get("nesterov")),
        ),
        loss=(
            keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing)
            if smoothing
            else keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        ),
        metrics=["accuracy"],
    )

    class Clock(keras.callbacks.Callback):
        """The events: the start, the first step, each interval's end, each evaluation."""

        epoch, test_started = 0, 0.0

        def on_train_begin(self, logs=None):
            write({"step": 0, "event": "start", "time": time.time()})

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, index, logs=None):
            if (self.epoch == 0 and index == 0) or index == eval_every - 1:
                write({"step": self.epoch * eval_every + index + 1, "time": time.time()})

        def on_test_begin(self, logs=None):
            self.test_started = time.monotonic()

        def on_epoch_end(self, epoch, logs=None):
            write(
                {
                    "step": (epoch + 1) * eval_every,
                    "top1": float(logs["val_accuracy"]),
                    "time": time.time(),
                    "seconds": time.monotonic() - self.test_started,
                }
            )

    model.fit(
        train,
        epochs=train_steps // eval_every,
        steps_per_epoch=eval_every,
        validation_data=test,
        callbacks=[Clock()],
        verbose=0,
    )
    return model


def fit_datasets(resolved, pipeline):
    """The `tf.data` pipelines a Keras user would write for the recipe: (train, test).

    The images are the trainer's (the dataset's own, a prefix when the recipe
    limits them), resized and normalized as its pipeline does; training's are
    shuffled, augmented as the recipe asks, batched and prefetched.

    Args:
      resolved: the recipe's config.
      pipeline: its `InputPipeline` (the sizes, normalization and counts).
    """
    import numpy as np
    import tensorflow as tf

    from resnet_app.data import shapes

    prep = pipeline.preprocessing
    size, augment = prep.image_size, prep.augment
    mean, std = np.asarray(prep.mean, np.float32), np.asarray(prep.std, np.float32)
    batch, classes = resolved.train.batch_size, pipeline.num_classes
    smoothing, seed = resolved.train.label_smoothing, resolved.train.seed

    def prepare(image, label):  # Resized back onto the 0-255 grid, as the trainer's are.
        image = tf.image.resize(tf.cast(image, tf.float32), [size, size])
        image = tf.clip_by_value(tf.round(image), 0, 255)
        return (image - mean) / std, (tf.one_hot(label, classes) if smoothing else label)

    def random_augment(image, label):
        if augment.crop_padding:  # Pad with zeros after normalizing: the mean colour.
            pad = augment.crop_padding
            image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
            image = tf.image.random_crop(image, [size, size, 3])
        if augment.flip:
            image = tf.image.random_flip_left_right(image)
        if augment.cutout_size:
            side = augment.cutout_size
            top, left = tf.unstack(tf.random.uniform([2], 0, size - side + 1, tf.int32))
            square = [[top, size - side - top], [left, size - side - left], [0, 0]]
            image = image * (1 - tf.pad(tf.ones([side, side, 1]), square))
        return image, label

    def split(name, count):  # The trainer's images: the dataset's own, a prefix of `count`.
        images, labels = shapes.load(name)
        return images[:count], labels[:count].astype(np.int32)

    train = (
        tf.data.Dataset.from_tensor_slices(split("train", pipeline.num_train_examples))
        .shuffle(pipeline.num_train_examples, seed=seed)
        .repeat()
        .map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
        .map(random_augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    test = (
        tf.data.Dataset.from_tensor_slices(split("test", pipeline.num_eval_examples()))
        .map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(resolved.train.eval_batch_size or batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    return train, test
