"""The Keras side of the benchmarks: resnet_app's network trained as a user writes `fit`.

With Keras's stock BatchNormalization (`baseline_model`); `fit_recipe` trains a
recipe with Keras SGD, a `tf.data` pipeline over its images held in memory, the
split the trainer evaluates as `validation_data`, and its learning rate step by
step (Keras's `LearningRateScheduler` would make it a staircase). Recipes with
parts it does not reproduce are refused (`unmirrored`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def baseline_model(create: Callable, stock_layers: bool = True):
    """`create()`'s model, with Keras's stock BatchNormalization when asked (the swap
    holds for this process); RuntimeError if it holds other BatchNorm layers than asked."""
    import keras

    from resnet_app.common import compat
    from resnet_app.nets import layers as net_layers

    if stock_layers:  # What a user writing the ResNet with Keras would get.
        net_layers.BatchNorm = keras.layers.BatchNormalization
    model = create()
    layers = compat.nested_layers(model)
    norms = {type(x) for x in layers if isinstance(x, keras.layers.BatchNormalization)}
    wanted = keras.layers.BatchNormalization if stock_layers else net_layers.BatchNorm
    if norms != {wanted}:
        raise RuntimeError(f"expected only {wanted.__name__} layers, built {norms}")
    return model


# What `fit_recipe` reproduces: other settings changed from their defaults are refused.
_MIRRORED = """
    model. schedule. data.dataset data.data_dir data.num_classes data.class_names
    data.coarse_labels data.validation_split data.eval_split data.channels
    data.preprocessing data.image_size data.mean data.std data.dtype data.seed
    data.train_examples data.eval_examples data.augment.crop_padding data.augment.flip
    data.augment.cutout_size optimizer.class optimizer.learning_rate optimizer.momentum
    optimizer.nesterov train.batch_size train.epochs train.train_steps train.eval_every
    train.log_every train.steps_per_loop train.checkpoint_every train.keep_checkpoints
    train.seed train.label_smoothing train.precision train.eval_batch_size
"""
MIRRORED = tuple(_MIRRORED.split())


def unmirrored(resolved, pipeline=None) -> list[str]:
    """The recipe's settings that `fit_recipe` does not reproduce (empty: all are).

    What only the loaded data tells (a streamed split, "auto" picking the
    ImageNet recipe) is checked when `pipeline`, its `InputPipeline`, is given.
    """
    from resnet_app import config
    from resnet_app.config.differences import changes
    from resnet_app.data import sources

    changed = changes(config.resolve(), resolved)
    found = [k for k in changed if not any(k.startswith(m) for m in MIRRORED if m[-1] == ".")]
    found = [k for k in found if k not in MIRRORED]
    dataset = resolved.data.dataset
    kind, _ = sources.parse(dataset)
    if kind is None:
        found.append(f"data.dataset={dataset} (fit reads a dataset's images)")
    elif kind.scheme == "tfrecord":
        found.append(f"data.dataset={dataset} (streamed: fit holds the images in memory)")
    if resolved.data.preprocessing == "imagenet":
        found.append("data.preprocessing=imagenet (fit does the CIFAR recipe)")
    kind = resolved.optimizer.to_dict().get("class")
    if kind not in ("momentum", "sgd"):
        found.append(f"optimizer.class={kind}")
    if resolved.train.precision == "fp16":
        found.append("train.precision=fp16")
    if pipeline is None:
        return found
    dataset, splits = pipeline.config.dataset, (pipeline.train_split, pipeline.eval_split())
    if any(split is not None and not split.indexed for split in splits):
        found.append(f"data.dataset={dataset} (streamed: fit holds the images in memory)")
    if pipeline.multi_label:
        found.append(f"data.dataset={dataset} (multi-label: fit takes one class per image)")
    family, size = pipeline.preprocessing.family, pipeline.preprocessing.image_size
    if family != "cifar":
        found.append(
            f"data.preprocessing={family} (chosen for {size} px; fit does the CIFAR recipe)"
        )
    return found


def fit_precision(resolved) -> str:
    """The precision the trainer computes in for this recipe here ("auto" resolved)."""
    from resnet_app.common import auto_precision

    precision = resolved.train.precision
    return auto_precision.auto_choice().precision if precision == auto_precision.AUTO else precision


def fit_recipe(
    resolved, pipeline, train_steps: int, eval_every: int, write: Callable, from_folder=False
):
    """Trains the recipe with `model.fit` for `train_steps` (data: `fit_datasets`); returns
    the model.

    The events (`race.py`) go to `write`: the start, the first step, and every
    `eval_every` steps a mark and an evaluation (`steps_per_epoch=eval_every`).
    """
    import keras
    import tensorflow as tf

    from resnet_app.engine.plan import plan_run
    from resnet_app.nets import factory

    size, classes = pipeline.preprocessing.image_size, pipeline.num_classes
    smoothing, seed = resolved.train.label_smoothing, resolved.train.seed
    keras.utils.set_random_seed(seed)
    train, test = fit_datasets(resolved, pipeline, from_folder)
    plan = plan_run(resolved, pipeline.num_train_examples, size)
    rates = [plan.schedule(step, plan.steps_per_epoch) for step in range(train_steps)]
    values = tf.constant(rates, tf.float32)

    class StepRates(keras.optimizers.schedules.LearningRateSchedule):
        def __call__(self, step):  # The recipe's rate at the optimizer's iteration.
            return tf.gather(values, tf.minimum(tf.cast(step, tf.int32), len(rates) - 1))

    options, precision = resolved.optimizer.to_dict(), fit_precision(resolved)
    create = lambda: factory.create_run_model(resolved, classes, size, precision, pipeline.channels)  # noqa: E731
    model = baseline_model(create)
    momentum, nesterov = options.get("momentum") or 0.0, bool(options.get("nesterov"))
    optimizer = keras.optimizers.SGD(StepRates(), momentum=momentum, nesterov=nesterov)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if smoothing:
        loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=smoothing)
    model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])

    class Clock(keras.callbacks.Callback):  # The events.
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
            seconds = time.monotonic() - self.test_started
            top1, step = float(logs["val_accuracy"]), (epoch + 1) * eval_every
            write({"step": step, "top1": top1, "time": time.time(), "seconds": seconds})

    epochs = dict(epochs=train_steps // eval_every, steps_per_epoch=eval_every, verbose=0)
    model.fit(train, validation_data=test, callbacks=[Clock()], **epochs)
    return model


def fit_datasets(resolved, pipeline, from_folder: bool = False):
    """The `tf.data` pipelines a Keras user would write: (train, evaluation).

    Over the trainer's own splits held in memory (`split_arrays`), or with
    `from_folder` read from `folder:DIR` by Keras's `image_dataset_from_directory`
    and `.cache()`d; resized and normalized as the trainer's pipeline does, and
    training's shuffled, augmented, batched.
    """
    import numpy as np
    import tensorflow as tf

    prep = pipeline.preprocessing
    size, augment, depth = prep.image_size, prep.augment, pipeline.channels
    mean, std = np.asarray(prep.mean, np.float32), np.asarray(prep.std, np.float32)
    batch, classes = resolved.train.batch_size, pipeline.num_classes
    smoothing, seed = resolved.train.label_smoothing, resolved.train.seed

    def prepare_for(images):
        """Normalizing, and resizing when the arrays are not at the size (as a user would)."""
        resize = images is not None and tuple(images.shape[1:3]) != (size, size)

        def prepare(image, label):  # Resized back onto the 0-255 grid, as the trainer's are.
            image = tf.cast(image, tf.float32)
            if resize:
                image = tf.clip_by_value(tf.round(tf.image.resize(image, [size, size])), 0, 255)
            return (image - mean) / std, (tf.one_hot(label, classes) if smoothing else label)

        return prepare

    def random_augment(image, label):
        if augment.crop_padding:  # Pad with zeros after normalizing: the mean colour.
            pad = augment.crop_padding
            image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
            image = tf.image.random_crop(image, [size, size, depth])
        if augment.flip:
            image = tf.image.random_flip_left_right(image)
        if augment.cutout_size:
            side = augment.cutout_size
            top, left = tf.unstack(tf.random.uniform([2], 0, size - side + 1, tf.int32))
            square = [[top, size - side - top], [left, size - side - left], [0, 0]]
            image = image * (1 - tf.pad(tf.ones([side, side, depth]), square))
        return image, label

    if from_folder:
        names = ("train", pipeline.eval_split_name)
        train, held_out = (folder_split(resolved, pipeline, name) for name in names)
        train_images = eval_images = None
    else:
        examples = split_arrays(pipeline.train_split, pipeline)
        evaluated = split_arrays(pipeline.eval_split(), pipeline)
        train, held_out = map(tf.data.Dataset.from_tensor_slices, (examples, evaluated))
        train_images, eval_images = examples[0], evaluated[0]
    train = (
        train.shuffle(pipeline.num_train_examples, seed=seed)
        .repeat()
        .map(prepare_for(train_images), num_parallel_calls=tf.data.AUTOTUNE)
        .map(random_augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    evaluation = (
        held_out.map(prepare_for(eval_images), num_parallel_calls=tf.data.AUTOTUNE)
        .batch(resolved.train.eval_batch_size or batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    return train, evaluation


def folder_split(resolved, pipeline, name: str):
    """A split of `folder:DIR` as a Keras user reads class folders: unbatched, resized to
    the training size, cached in memory after its first pass."""
    import keras

    from resnet_app.data.sources import folder

    root = resolved.data.dataset.removeprefix(folder.PREFIX)
    size = pipeline.preprocessing.image_size
    return keras.utils.image_dataset_from_directory(
        os.path.join(root, name),
        color_mode="grayscale" if pipeline.channels == 1 else "rgb",
        batch_size=None,
        image_size=(size, size),
        shuffle=False,
    ).cache()


def split_arrays(split, pipeline):
    """A split's (uint8 [N, H, W, channels] images, int32 [N] labels) in memory.

    Encoded files are decoded once as the trainer decodes them (those that do
    not decode are dropped, as it skips them), and resized to the training
    size when their sizes differ. A streamed split raises ValueError.
    """
    import numpy as np
    import tensorflow as tf

    from resnet_app.data import channels, preprocessing

    if split is None or not split.indexed:
        kind = "synthetic" if split is None else "streamed"
        raise ValueError(
            f"data.dataset={pipeline.config.dataset} is {kind}: fit reads images held in "
            "memory; give an in-memory source (idx:, cifar:, folder:, csv:, shapes)"
        )
    if split.images is not None:
        images = channels.convert_array(split.images, pipeline.channels)
        return images, split.labels.astype(np.int32)
    size, depth, parallel = pipeline.preprocessing.image_size, pipeline.channels, tf.data.AUTOTUNE
    decode = lambda content, label: (preprocessing.decode_image(content, depth), label)  # noqa: E731
    stream = tf.data.Dataset.range(split.num_examples).map(split.lookup(), parallel)
    pairs = list(stream.map(decode, parallel).ignore_errors(log_warning=True).as_numpy_iterator())
    images = [image for image, _ in pairs]

    def resized(image):  # As `fit_datasets` resizes, rounded back onto uint8 pixels.
        if image.shape[:2] == (size, size):
            return image
        image = tf.image.resize(tf.cast(image, tf.float32), [size, size]).numpy()
        return np.clip(np.round(image), 0, 255).astype(np.uint8)

    if len({image.shape for image in images}) > 1:
        images = [resized(image) for image in images]
    images = np.stack(images) if images else np.zeros((0, 1, 1, depth), np.uint8)
    return images, np.asarray([label for _, label in pairs], np.int32)
