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
prefetch), the split the trainer evaluates as `validation_data`, and Keras's
default `jit_compile="auto"`. The images are the recipe's dataset held in
memory as NumPy arrays: the source's own arrays (`idx:`, `cifar:`, `shapes`,
small tfds sets), or an image folder or table decoded once into arrays, as a
Keras user who loads a folder into memory would; streamed sources are refused.
The learning rate is the recipe's, step by step, as a `LearningRateSchedule`:
Keras's `LearningRateScheduler` callback sets it once per epoch, which would
turn a per-step warmup and decay into a staircase. The model computes in the
trainer's precision (`fit_precision`) and takes the run's channels.
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
# builder; the schedule becomes a table of per-step rates; the data keys are
# mirrored by reading the trainer's pipeline (its splits after train_examples
# and validation_split, its classes, channels, size and normalization).
MIRRORED = (
    "model.",
    "schedule.",
    "data.dataset",
    "data.data_dir",
    "data.num_classes",
    "data.class_names",
    "data.coarse_labels",
    "data.validation_split",
    "data.eval_split",
    "data.channels",
    "data.preprocessing",
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


def unmirrored(resolved, pipeline=None) -> list[str]:
    """The recipe's settings that `fit_recipe` does not reproduce (empty: all are).

    The config alone tells most of them, before any data loads. What only the
    loaded data tells (a tfds set too large to hold in memory is streamed; an
    "auto" recipe picks the ImageNet recipe for large images) is checked when
    `pipeline`, the recipe's `InputPipeline`, is given.
    """
    from resnet_app import config
    from resnet_app.config.differences import changes
    from resnet_app.data import sources

    found = [
        key
        for key in changes(config.resolve(), resolved)
        if not any(key == m or (m.endswith(".") and key.startswith(m)) for m in MIRRORED)
    ]
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
    if pipeline is not None:
        found += _unmirrored_data(pipeline)
    return found


def _unmirrored_data(pipeline) -> list[str]:
    """What of the loaded data `fit_datasets` cannot read as the trainer does."""
    dataset = pipeline.config.dataset
    found = []
    splits = (pipeline.train_split, pipeline.eval_split())
    if any(split is not None and not split.indexed for split in splits):
        found.append(f"data.dataset={dataset} (streamed: fit holds the images in memory)")
    if pipeline.multi_label:
        found.append(f"data.dataset={dataset} (multi-label: fit takes one class per image)")
    if pipeline.preprocessing.family != "cifar":
        size = pipeline.preprocessing.image_size
        found.append(
            f"data.preprocessing={pipeline.preprocessing.family} (chosen for {size} px; "
            "fit does the CIFAR recipe)"
        )
    return found


def fit_precision(resolved) -> str:
    """The precision the trainer computes in for this recipe on this machine.

    A resolved config already holds "auto"'s choice (`Config` asks
    `auto_precision.auto_choice`, as the trainer's does); a config built
    another way may still say "auto", which is resolved here the same way.
    """
    from resnet_app.common import auto_precision

    precision = resolved.train.precision
    if precision == auto_precision.AUTO:
        return auto_precision.auto_choice().precision
    return precision


def fit_recipe(
    resolved, pipeline, train_steps: int, eval_every: int, write: Callable[[dict], None]
):
    """Trains the recipe with `model.fit`, as a Keras user would write it; returns the model.

    The events go to `write` (see `run_timing.py`): the start, the first step
    and the end of every `eval_every` steps, and an evaluation of the split
    the trainer evaluates after each (Keras's validation:
    `steps_per_epoch=eval_every`).

    Args:
      resolved: the recipe's config (`unmirrored` must find nothing).
      pipeline: its `InputPipeline` (the trainer's data, sizes and normalization).
      train_steps: the steps to train, a multiple of `eval_every`.
      eval_every: steps between evaluations.
      write: takes each event.
    """
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
    precision, depth = fit_precision(resolved), pipeline.channels
    model = baseline_model(
        lambda: factory.create_run_model(resolved, classes, size, precision, depth)
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

    model.fit(
        train,
        epochs=train_steps // eval_every,
        steps_per_epoch=eval_every,
        validation_data=test,
        callbacks=[_clock(write, eval_every)],
        verbose=0,
    )
    return model


def _clock(write: Callable[[dict], None], eval_every: int):
    """The Keras callback that writes `fit_recipe`'s events to `write`."""
    import time

    import keras

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

    return Clock()


def fit_datasets(resolved, pipeline):
    """The `tf.data` pipelines a Keras user would write for the recipe: (train, evaluation).

    The images are the trainer's: its training split (after the recipe's
    `train_examples` limit and `validation_split` hold-out) and the split it
    evaluates (the holdout when one is held out), as NumPy arrays in memory
    (`split_arrays`), resized and normalized as its pipeline does; training's
    are shuffled, augmented as the recipe asks, batched and prefetched.

    Args:
      resolved: the recipe's config.
      pipeline: its `InputPipeline` (the splits, sizes, channels and normalization).
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
        resize = tuple(images.shape[1:3]) != (size, size)

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

    examples = split_arrays(pipeline.train_split, pipeline)
    held_out = split_arrays(pipeline.eval_split(), pipeline)
    train = (
        tf.data.Dataset.from_tensor_slices(examples)
        .shuffle(len(examples[1]), seed=seed)
        .repeat()
        .map(prepare_for(examples[0]), num_parallel_calls=tf.data.AUTOTUNE)
        .map(random_augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    evaluation = (
        tf.data.Dataset.from_tensor_slices(held_out)
        .map(prepare_for(held_out[0]), num_parallel_calls=tf.data.AUTOTUNE)
        .batch(resolved.train.eval_batch_size or batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    return train, evaluation


def split_arrays(split, pipeline):
    """A split's (uint8 [N, H, W, channels] images, int32 [N] labels) held in memory.

    Pixels the source holds are brought to the run's channels; encoded files
    are decoded once, as the trainer decodes them, and dropped (with their
    labels) when they do not decode, as the trainer skips them. Decoded images
    that do not all have one size are resized to the training size the way
    `fit_datasets` resizes, so that they stack into one array.

    Raises:
      ValueError: for a streamed split (`unmirrored` names it first).
    """
    import numpy as np

    from resnet_app.data import channels

    if split is None or not split.indexed:
        kind = "synthetic" if split is None else "streamed"
        raise ValueError(
            f"data.dataset={pipeline.config.dataset} is {kind}: fit reads images held in "
            "memory; give an in-memory source (idx:, cifar:, folder:, csv:, shapes)"
        )
    if split.images is not None:
        images = channels.convert_array(split.images, pipeline.channels)
        return images, split.labels.astype(np.int32)
    decoded, labels = _decode_files(split, pipeline.channels)
    if len({image.shape for image in decoded}) > 1:
        size = pipeline.preprocessing.image_size
        decoded = [_resized(image, size) for image in decoded]
    shape = (0, 1, 1, pipeline.channels)
    images = np.stack(decoded) if decoded else np.zeros(shape, np.uint8)
    return images, np.asarray(labels, np.int32)


def _decode_files(split, depth: int) -> tuple[list, list]:
    """Each file of an encoded split decoded to uint8 pixels with `depth` channels."""
    import tensorflow as tf

    from resnet_app.data import preprocessing

    read = split.lookup()
    stream = (
        tf.data.Dataset.range(split.num_examples)
        .map(read, num_parallel_calls=tf.data.AUTOTUNE)
        .map(
            lambda content, label: (preprocessing.decode_image(content, depth), label),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        .ignore_errors(log_warning=True)
    )
    decoded, labels = [], []
    for image, label in stream.as_numpy_iterator():
        decoded.append(image)
        labels.append(label)
    return decoded, labels


def _resized(image, size: int):
    """One image at `size` x `size`, rounded back onto uint8 pixels as `fit_datasets` rounds."""
    import numpy as np
    import tensorflow as tf

    if image.shape[:2] == (size, size):
        return image
    resized = tf.image.resize(tf.cast(image, tf.float32), [size, size])
    return np.clip(np.round(resized.numpy()), 0, 255).astype(np.uint8)
