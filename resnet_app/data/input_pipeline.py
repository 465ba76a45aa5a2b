"""Input pipelines: `--dataset` to batches of preprocessed images.

`InputPipeline(DataConfig(...))` loads a source (`data/sources/`); its `train_dataset` and
`eval_dataset` build tf.data pipelines (a run's comes from `run_pipeline`). A batch is a dict:
- "image": [batch, size, size, channels] (1 for greyscale data, else 3), normalized;
- "label": int32 [batch] (multi-label data: float32 [batch, classes] multi-hot);
- "id": int64 [batch], the example's index in its split (-1 for padding);
- "mask": float32 [batch], 1 for a real example, 0 for padding;
- "copy": int64 [batch], with repeated augmentation only: which copy this is (`repeats.py`);
- "augmix_views": [batch, 2, size, size, channels], with AugMix's consistency loss only.

Training: epoch e visits every example once, in an order that is a function of (seed, e)
only (a stateless permutation of indices, or for streamed data seeded file and buffer
shuffles), and each example's augmentation is seeded by (seed, e, id) (`seeds.py`). So the
stream can be entered at any example (`start_example`) without replaying what came before:
exact resumption. Batches may span an epoch boundary. With S pipelines (workers), pipeline
s keeps the positions congruent to s modulo S, so the S batches of a step are the global
batch one pipeline would make.

Evaluation visits every example of the split once and pads with masked examples, so every
replica gets a full batch at every step and "mask"-weighted metrics count each example once.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf
from absl import logging

from resnet_app.common import compat
from resnet_app.common.errors import ConfigError
from resnet_app.data import (
    batches,
    channels,
    class_balance,
    decode_once,
    families,
    image_choices,
    mixing,
    options,
    preprocessing,
    repeats,
    seeds,
    sources,
)
from resnet_app.data.image_choices import Recorded, choose_recipe, describe_choice
from resnet_app.data.preprocessing import Preprocessing
from resnet_app.data.settings import DataConfig
from resnet_app.data.sources.base import round_robin

compat.trace_as_written()  # The maps below trace resnet_app code as written.

SYNTHETIC_SPLIT_SIZES = {"train": 50_000, "test": 10_000}


def _limit(split: sources.Split, count: int | None) -> sources.Split:
    if count is None or count >= split.num_examples:
        return split
    return split.slice(None, count)


class InputPipeline:
    """A loaded dataset (`source`: None for synthetic data) and its resolved `preprocessing`;
    builds tf.data pipelines. `default_image_size` is the model preset's, for data without
    a size of its own; `recorded` what the run's data_info.json records (`run_pipeline`)."""

    def __init__(
        self,
        config: DataConfig,
        default_image_size: int | None = None,
        model_name: str | None = None,
        recorded: Recorded | None = None,
    ):
        self.config = config
        source = sources.load_source(config)
        if source is not None:
            # Limit, then hold out: --train_examples=N --validation_split=M trains on N - M.
            train = _limit(source.split("train"), config.train_examples)
            source = dataclasses.replace(source, splits={**source.splits, "train": train})
            source = sources.hold_out(source, config.validation_split)
            self.class_names = source.class_names
            self.train_split = source.split("train")
            if config.eval_split:
                source.split(config.eval_split)  # Fails early, naming the splits.
            if config.sampling == "balanced":
                _check_balanced_sampling(config.dataset, self.train_split, source.multi_label)
        else:
            self.class_names = [str(i) for i in range(config.num_classes)]
            self.train_split = None
        self.source = source
        self._eval_splits: dict[str, sources.Split] = {}
        self._decoding: set[str] = set()  # The splits `_in_memory` has tried.
        self.num_classes = len(self.class_names)
        # Several labels per image: "label" is a float32 [classes] multi-hot row.
        self.multi_label = bool(source is not None and source.multi_label)

        chosen = image_choices.choose(
            config, source, self.train_split, recorded or Recorded(), default_image_size, model_name
        )
        self.facts, self.image_size = chosen.facts, chosen.image_size
        self.channels, self.channels_origin = chosen.channels, chosen.channels_origin
        self.stats_origin = chosen.stats_origin
        mean, std, size = chosen.mean, chosen.std, chosen.image_size.size
        family = choose_recipe(config.preprocessing, size)
        eval_size = config.eval_image_size
        resize = families.named(family).eval_resize(config.eval_resize, eval_size, size)
        self.preprocessing = Preprocessing(  # Its fields in order.
            family, size, mean, std, config.dtype, resize, eval_size, config.augment
        )
        logging.info(
            "Dataset %s: %s training examples%s, splits %s; %s; %s; mean %s, std %s, %s",
            config.dataset,
            self.num_train_examples,
            f", multi-label over {self.num_classes} classes" if self.multi_label else "",
            ", ".join(source.splits) if source else "synthetic",
            self.describe(),
            self.channels_origin,
            [round(m, 2) for m in mean],
            [round(s, 2) for s in std],
            self.stats_origin,
        )

    def describe(self) -> str:
        """The image size and recipe, and why, for the start-up log line."""
        config = self.preprocessing
        text = describe_choice(self.image_size, self.config.preprocessing, config.family)
        if config.eval_image_size:
            text += f"; evaluated at {config.eval_image_size} px (data.eval_image_size)"
        return text

    @property
    def eval_split_name(self) -> str:
        """The split evaluated by default: --eval_split, else holdout, validation, test."""
        if self.config.eval_split or self.source is None:
            return self.config.eval_split or "test"
        return self.source.default_eval_split()

    def epoch_examples(self, global_batch: int) -> int:
        """Examples in one training epoch (with repeated augmentation, `repeats.epoch_length`)."""
        return repeats.epoch_length(
            self.num_train_examples, self.config.augment.repeats, global_batch
        )

    @property
    def num_train_examples(self) -> int:
        if self.train_split is None:
            return self.config.train_examples or SYNTHETIC_SPLIT_SIZES["train"]
        return self.train_split.num_examples

    def eval_split(self, name: str | None = None) -> sources.Split | None:
        """The evaluation split (limited by `eval_examples`); None for synthetic."""
        if self.source is None:
            return None
        name = name or self.eval_split_name
        if name not in self._eval_splits:  # Limiting copies arrays: do it once.
            self._eval_splits[name] = _limit(self.source.split(name), self.config.eval_examples)
        return self._eval_splits[name]

    def num_eval_examples(self, name: str | None = None) -> int:
        split = self.eval_split(name)
        if split is None:
            return self.config.eval_examples or SYNTHETIC_SPLIT_SIZES["test"]
        return split.num_examples

    def training_preprocessing(self, image_size: int | None = None) -> Preprocessing:
        """Training's preprocessing at `image_size` (progressive resizing; default: the run's)."""
        if not image_size or image_size == self.preprocessing.image_size:
            return self.preprocessing
        return dataclasses.replace(self.preprocessing, image_size=image_size)

    @staticmethod
    def _augment_batch(batch: dict, config: Preprocessing) -> dict:
        """The batch's part of the augmentation; AugMix's views, when the consistency
        loss is on, split into the "image" (the first) and "augmix_views"."""
        batch = dict(batch)
        if "choices" in batch:
            choices, draws = batch.pop("choices"), batch.pop("draws", None)
            batch["image"] = preprocessing.cifar_train_batch(batch["image"], choices, config, draws)
        if config.augment.views > 1:
            views = batch.pop("image")
            batch.update(image=views[:, 0], augmix_views=views[:, 1:])
        return batch

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The example indices of training epoch `epoch` in visiting order (indexed data)."""
        return self._epoch_order(epoch).numpy()

    def _epoch_order(self, epoch) -> tf.Tensor:
        """A permutation of the indices, or with data.sampling=balanced class-balanced draws."""
        seed, labels = self.config.seed, self.train_split.labels
        if self.config.sampling == "balanced":
            return class_balance.balanced_order(labels, self.num_classes, seed, epoch)
        return seeds.permutation(self.num_train_examples, seed, epoch)

    def train_dataset(
        self,
        global_batch_size: int,
        start_example: int = 0,
        num_shards: int = 1,
        shard_index: int = 0,
        image_size: int | None = None,
        replicas_per_shard: int = 1,
    ) -> tf.data.Dataset:
        """Pipeline `shard_index` of `num_shards`' batches of the infinite training stream,
        entered at example `start_example` (normally step * global_batch_size), at
        `image_size` (progressive resizing; default: the run's; the examples and their draws
        do not depend on it), over `replicas_per_shard` towers (with repeated augmentation,
        where each copy goes)."""
        if global_batch_size % num_shards:
            raise ConfigError(
                f"global batch size {global_batch_size} is not divisible by the "
                f"{num_shards} input pipelines"
            )
        if start_example % num_shards:
            raise ConfigError(f"start_example={start_example} must be a multiple of {num_shards}")
        batch = global_batch_size // num_shards
        config = self.training_preprocessing(image_size)
        if self.train_split is None:
            return self._synthetic(batch, config.image_size)
        self.train_split = self._in_memory("train", self.train_split, config)
        seed, split = self.config.seed, self.train_split
        resize = self._resizes(split, config.image_size)
        repeated = self.config.augment.repeats > 1
        if split.indexed:  # (augmentation key, index, copy)
            arrange = repeats.placement(global_batch_size, num_shards, replicas_per_shard)
            examples = self._indexed_stream(start_example, arrange).shard(num_shards, shard_index)
        else:  # (augmentation key, id, copy, image, label)
            examples = self._streamed(start_example, num_shards, shard_index)
        if batches.applies(split, config, resize):
            stream = batches.training(examples, batch, self._lookup(split), config, repeated)
        else:
            if split.indexed:
                lookup = self._lookup(split)
                examples = examples.map(
                    lambda key, index, copy: (key, index, copy, *lookup(index)),
                    num_parallel_calls=options.parallel_calls(),
                )

            def transform(key, example_id, copy, image, label):
                # Each example's augmentation depends on (seed, epoch, id, copy) only. The
                # ImageNet recipe runs whole here; the CIFAR one only draws its choices, which
                # `_augment_batch` applies to the whole batch at once.
                augment_seed = tf.stack([key, example_id])
                family = families.of(config)
                features = family.augment(image, augment_seed, config, split.encoded, resize)
                if repeated:  # Its copies draw their stochastic depth apart (`drop_path.py`).
                    features["copy"] = copy
                return batches.example(features, label, example_id)

            stream = _map_examples(examples, transform, split.encoded)
            stream = stream.batch(batch, drop_remainder=True)
        stream = stream.map(
            lambda b: self._augment_batch(b, config), num_parallel_calls=options.parallel_calls()
        )
        settings = self.config.mix
        stream = mixing.mix_stream(stream, settings, seed, start_example // global_batch_size)
        return stream.prefetch(tf.data.AUTOTUNE).with_options(options.dataset_options())

    def _streamed(self, start_example: int, num_shards: int, shard_index: int):
        """(augmentation key, id, copy 0, image, label) of this pipeline's share of a streamed
        split's training stream, entered at `start_example`."""
        seed, split = self.config.seed, self.train_split
        if self.config.augment.repeats > 1:
            raise ConfigError(
                f"data.augment.repeats needs data read by index; {self.config.dataset}'s "
                "records are streamed: drop it, or read the data from its files"
            )
        buffer = self.config.shuffle_buffer
        stream = split.stream.training(seed, start_example, num_shards, shard_index, buffer)

        def keyed(epoch, example_id, *example):  # Copy 0: one of each example.
            return (seeds.augment_key(seed, epoch), example_id, tf.zeros([], tf.int64), *example)

        return stream.map(keyed, num_parallel_calls=options.parallel_calls())

    def _indexed_stream(self, start_example: int, arrange: np.ndarray) -> tf.data.Dataset:
        """(augmentation key, example index, copy) from `start_example` on: each epoch's
        order, or with repeated augmentation the samplers' list (`arrange`: `repeats.placement`)."""
        count, seed = self.config.augment.repeats, self.config.seed
        length = repeats.epoch_length(self.num_train_examples, count, len(arrange))
        first_epoch, offset = divmod(start_example, length)

        def epoch_indices(epoch):
            order = self._epoch_order(epoch)
            start = tf.where(tf.equal(epoch, first_epoch), offset, 0)  # Later epochs: 0.
            if count == 1:
                key = seeds.augment_key(seed, epoch)  # Once per epoch, not per example.
                shape = tf.shape(order[start:])
                return tf.data.Dataset.from_tensor_slices(
                    (tf.fill(shape, key), order[start:], tf.zeros(shape, tf.int64))
                )
            indices, copies = repeats.epoch_list(order, count, length, arrange)
            keys = tf.stack([seeds.augment_key(seed, epoch, c) for c in range(count)])
            return tf.data.Dataset.from_tensor_slices(
                (tf.gather(keys, copies)[start:], indices[start:], copies[start:])
            )

        return tf.data.Dataset.range(first_epoch, 1 << 62).flat_map(epoch_indices)

    def eval_dataset(
        self,
        batch_size: int,
        split: str | None = None,
        num_shards: int = 1,
        shard_index: int = 0,
        batches_multiple_of: int = 1,
        crops: bool = False,
    ) -> tf.data.Dataset:
        """Every example of `split` (default: `eval_split_name`) once, in padded batches.

        Pipeline `shard_index` of `num_shards` reads examples shard_index, shard_index +
        num_shards, ...; each yields the same number of batches, a multiple of
        `batches_multiple_of` (its replicas), so no replica steps alone. With `crops` (the
        ImageNet family), each "image" is [5, size, size, 3] crops.
        """
        total, config = self.num_eval_examples(split), self.preprocessing
        data = self.eval_split(split)
        indices = np.arange(shard_index, total, num_shards, dtype=np.int64)
        sizes = round_robin(total, num_shards) if data is None else data.shard_sizes(num_shards)
        num_batches = sources.eval_batches(sizes, batch_size, batches_multiple_of)
        if data is None:
            if crops:
                raise ConfigError("synthetic data has no images to crop; use --tta=flip")
            ids = batches.padded_ids(indices, batch_size, num_batches)
            return self._synthetic(batch_size, config.eval_size, ids)
        name = split or self.eval_split_name
        data = self._eval_splits[name] = self._in_memory(name, data, config)
        resize = self._resizes(data, config.image_size)
        if not crops and batches.applies(data, config, resize):
            lookup = self._lookup(data)
            stream = batches.evaluation(indices, batch_size, num_batches, lookup, config)
            return stream.prefetch(tf.data.AUTOTUNE).with_options(options.dataset_options())
        # Its share, then masked blanks to a whole number of batches; an undecodable file is
        # dropped with a warning and not counted.
        if not data.indexed:
            stream = data.stream.evaluation(num_shards, shard_index)
            stream = stream.map(lambda x: (x["id"], x["image"], x["label"]))
        else:
            lookup = self._lookup(data)
            stream = tf.data.Dataset.from_tensor_slices(indices).map(
                lambda index: (index, *lookup(index)), num_parallel_calls=options.parallel_calls()
            )

        def transform(example_id, image, label):
            image = families.of(config).evaluate(image, config, data.encoded, resize, crops)
            return batches.example({"image": image}, label, example_id)

        stream = _map_examples(stream, transform, data.encoded)
        blank = tf.data.Dataset.from_tensors(self._padding(crops)).repeat()
        stream = stream.concatenate(blank).take(num_batches * batch_size)
        stream = stream.batch(batch_size, drop_remainder=True)
        return stream.prefetch(tf.data.AUTOTUNE).with_options(options.dataset_options())

    def _resizes(self, split: sources.Split, size: int) -> bool:
        """Whether the split's images may need resizing to `size` (pixels in memory know)."""
        if split.images is not None:
            return split.images.shape[1:3] != (size, size)
        return self.source.image_size != size

    def _in_memory(self, name: str, split: sources.Split, config) -> sources.Split:
        """`split`, its files decoded once into memory where `decode_once` applies: the CIFAR
        recipe at the files' own size. Tried once per split; the log says which way it reads."""
        known = self.source.image_size in (None, config.image_size)  # None: sizes unknown.
        files = split.encoded and name not in self._decoding
        if not known or config.family != "cifar" or not files:
            return split
        self._decoding.add(name)
        found, why = decode_once.decoded(split, config.image_size, self.channels)
        if why:
            logging.info("%s, %s split: decoded as it is read (%s)", self.config.dataset, name, why)
        else:
            logging.info(
                "%s, %s split: %d files decoded once into memory (%.1f MB of pixels), read a "
                "batch at a time",
                self.config.dataset, name, split.num_examples, found.images.nbytes / 2**20,
            )  # fmt: skip
        return found

    def _lookup(self, split: sources.Split):
        """`split.lookup()` with pixels held in memory brought to the run's channels."""
        lookup = split.lookup()
        if split.encoded:  # Decoded to the run's channels.
            return lookup

        def converted(index):
            image, label = lookup(index)
            return channels.convert(image, self.channels), label

        return converted

    def _padding(self, crops: bool) -> dict:
        """The masked example that pads evaluation batches; its image has the real ones' shape."""
        size, dtype = self.preprocessing.eval_size, self.preprocessing.dtype
        shape = [size, size, self.channels]
        label = tf.zeros([self.num_classes]) if self.multi_label else tf.constant(0, tf.int32)
        return {
            "image": tf.zeros([5, *shape] if crops else shape, dtype),
            "label": label,
            "id": tf.constant(-1, tf.int64),
            "mask": tf.constant(0.0),
        }

    def _synthetic(self, batch_size: int, size: int, eval_ids: np.ndarray | None = None):
        """One random batch of `size` px, made once and repeated: the input costs nothing.

        Training: infinite, with AugMix's views (the images again) when its consistency loss
        is on, so the step costs what it will. Evaluation: a batch per row of `eval_ids`
        (`batches.padded_ids`), padding masked.
        """
        generator = tf.random.Generator.from_seed(self.config.seed)
        images = generator.normal([batch_size, size, size, self.channels])
        labels = generator.uniform([batch_size], 0, self.num_classes, dtype=tf.int32)
        batch = {
            "image": tf.cast(images, self.config.dtype),
            "label": labels,
            "id": tf.range(batch_size, dtype=tf.int64),
            "mask": tf.ones([batch_size], tf.float32),
        }
        if eval_ids is not None:
            return tf.data.Dataset.from_tensor_slices(eval_ids).map(
                lambda ids: {**batch, "id": ids, "mask": tf.cast(ids >= 0, tf.float32)}
            )
        views = self.preprocessing.augment.views
        if views > 1:
            batch["augmix_views"] = tf.stack([batch["image"]] * (views - 1), axis=1)
        return tf.data.Dataset.from_tensors(batch).repeat()


def _map_examples(stream: tf.data.Dataset, transform, encoded: bool) -> tf.data.Dataset:
    stream = stream.map(transform, num_parallel_calls=options.parallel_calls())
    if encoded:  # A file that passed its check but fails to decode: skipped with a warning.
        stream = stream.ignore_errors(log_warning=True)
    return stream


def _check_balanced_sampling(dataset: str, train: sources.Split, multi_label: bool) -> None:
    if multi_label:
        raise ConfigError(
            f"data.sampling=balanced needs one class per image; {dataset} is multi-label: drop it"
        )
    if not train.indexed:
        raise ConfigError(
            f"data.sampling=balanced needs data read by index; {dataset} is streamed: use "
            "train.class_weights=balanced instead"
        )


def create_pipeline(config: DataConfig, default_image_size: int | None = None) -> InputPipeline:
    """The `InputPipeline` of `config` (`default_image_size`: the model's input size)."""
    return InputPipeline(config, default_image_size)
