"""The teacher of knowledge distillation (`train.teacher`): a trained network, frozen.

A teacher is another run of this app (its newest readable checkpoint, the
moving average when kept, or one `RUN/ckpt-N`), `keras:resnet50`, a Keras `.h5`
or torchvision/timm `.safetensors` file (`train.teacher_model` names its
network), or an export (given uint8 pixels). It sees the student's pixels,
normalized its own way, and its classes must be the data's. The first run
writes a copy into `model_dir/teacher/`, durably, which a resumed run reads:
it resumes bitwise with the teacher it started with, whatever the source became.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import time
from typing import Any

import numpy as np
import tensorflow as tf
from absl import logging

from resnet_app import config as config_lib
from resnet_app.common import files
from resnet_app.common.errors import ConfigError
from resnet_app.data import channels as image_channels
from resnet_app.data import run_pipeline
from resnet_app.data.preprocessing import Preprocessing
from resnet_app.nets import factory, parts
from resnet_app.pretrained import read_weights, run_files, sources
from resnet_app.pretrained.weights import HEAD_LAYER, SourceWeights, adapt_input_channels, assign

DIRECTORY = "teacher"
INFO = "teacher.json"
WEIGHTS = "weights.npz"
EXPORT = "export"
NETWORK, SERVED = "network", "export"
KEY = "train.teacher"


@dataclasses.dataclass(frozen=True)
class TeacherInfo:
    """What a teacher is, as `model_dir/teacher/teacher.json` records it: `train.teacher`
    as given, NETWORK (weights in a network of ours) or SERVED (an export), a
    description for logs, its classes (and their names, if it names them); for a
    NETWORK its preset, the fields it overrides, its input channels and the
    per-channel mean and std (0-255) it expects."""

    spec: str
    kind: str
    description: str
    num_classes: int
    class_names: list[str] | None = None
    model_name: str | None = None
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    channels: int = image_channels.RGB
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()


class Teacher:
    """The teacher's logits of a batch's normalized images (float32, no gradient).

    Args:
      info: what the teacher is.
      network: NETWORK: the Keras model, built in the run's strategy scope;
        SERVED: the loaded export.
      student: the run's preprocessing (how the images were normalized).
    """

    def __init__(self, info: TeacherInfo, network: Any, student: Preprocessing):
        self.info, self.network, self.student = info, network, student

    def __call__(self, images: tf.Tensor) -> tf.Tensor:
        mean = tf.constant(self.student.mean, tf.float32)
        std = tf.constant(self.student.std, tf.float32)
        pixels = tf.cast(images, tf.float32) * std + mean
        if self.info.kind == SERVED:
            served = tf.saturate_cast(tf.round(pixels), tf.uint8)
            logits = self.network.signatures["serving_default"](images=served)["logits"]
        else:
            pixels = _to_channels(pixels, self.info.channels)
            own_mean = tf.constant(self.info.mean, tf.float32)
            own_std = tf.constant(self.info.std, tf.float32)
            normalized = tf.cast((pixels - own_mean) / own_std, self.network.compute_dtype)
            logits = self.network(normalized, training=False)
        return tf.stop_gradient(tf.cast(logits, tf.float32))


def _to_channels(pixels: tf.Tensor, channels: int) -> tf.Tensor:
    """Float pixels [..., 1 or 3] as [..., channels] (`data/channels.py`'s rule, unrounded)."""
    if pixels.shape[-1] == channels:
        return pixels
    if channels == image_channels.RGB:
        return tf.repeat(pixels, image_channels.RGB, axis=-1)
    weights = tf.constant(image_channels.LUMA_WEIGHTS, tf.float32) / 2**16
    return tf.reduce_sum(pixels * weights, axis=-1, keepdims=True)


def create(
    config: config_lib.Config,
    model_dir: str,
    strategy: tf.distribute.Strategy,
    chief: bool,
    class_names: list[str],
    student: Preprocessing,
    resuming: bool,
) -> Teacher | None:
    """The run's teacher, or None without `train.teacher`: a resumed run's copy, or
    the source, checked against the data, whose copy the chief writes.

    Raises:
      ConfigError: for a source that is not a teacher, one of other classes,
        or a weights file without `train.teacher_model`.
    """
    spec = config.train.teacher
    if not spec:
        return None
    copy, train = os.path.join(model_dir, DIRECTORY), config.train
    from_copy = resuming and os.path.isfile(os.path.join(copy, INFO))
    # A network's weights {layer: {variable: array}}, or a loaded export.
    if from_copy:
        info, read = _read_copy(copy)
    else:
        info, read = _read_source(config, student, len(class_names))
    _check_classes(info, class_names)
    if not from_copy and chief:
        write = functools.partial(_write_copy, info, read)
        files.replace_directory(copy, copy + ".partial", copy + ".old", write)
    network = read
    if info.kind == NETWORK:  # The weights into a frozen network.
        preset = (info.model_name, info.model_overrides, info.num_classes, student.image_size)
        with strategy.scope():
            network = factory.create_network(*preset, train.precision, info.channels)
        network.trainable = False
        assign(network, SourceWeights(layers=read, skipped={}), info.spec, info.model_name)
    logging.info(
        "Distilling from %s (%d classes; alpha %g, temperature %g)%s",
        info.description, info.num_classes, train.distill_alpha, train.distill_temperature,
        ", read from the run's copy" if from_copy else "",
    )  # fmt: skip
    return Teacher(info, network, student)


def _check_classes(info: TeacherInfo, class_names: list[str]) -> None:
    """Refuses a teacher whose classes are not the data's."""
    if info.num_classes != len(class_names):
        raise ConfigError(
            f"{KEY}={info.spec} has {info.num_classes} classes and the data "
            f"{len(class_names)}; give a teacher trained on this dataset's classes"
        )
    theirs = info.class_names
    if theirs and class_names and list(theirs) != list(class_names):
        index = next(i for i, (a, b) in enumerate(zip(theirs, class_names)) if a != b)
        raise ConfigError(
            f"{KEY}={info.spec} names class {index} {theirs[index]!r} where the data has "
            f"{class_names[index]!r}; give a teacher trained on this dataset's classes"
        )


def _read_source(config: config_lib.Config, student: Preprocessing, classes: int):
    """(info, the weights of a network {layer: {variable: array}}, or the loaded export)."""
    spec = config.train.teacher
    path = os.path.expanduser(spec)
    exported = os.path.join(path, "assets.extra", "export_info.json")  # `resnet-app export`'s.
    if not (os.path.isfile(exported) and tf.saved_model.contains_saved_model(path)):
        return _network_weights(config, classes)
    loaded = tf.saved_model.load(path)
    # Its classes: its logits' width on one blank image, and its labels.txt.
    blank = tf.zeros([1, student.image_size, student.image_size, student.channels], tf.uint8)
    classes = int(loaded.signatures["serving_default"](images=blank)["logits"].shape[-1])
    labels = os.path.join(path, "assets.extra", "labels.txt")
    names = None
    if os.path.isfile(labels):
        with open(labels) as f:
            names = [line.rstrip("\n") for line in f] or None
    return TeacherInfo(spec, SERVED, f"the export {path}", classes, names), loaded


def _write_copy(info: TeacherInfo, weights: Any, directory: str) -> None:
    """The run's copy of its teacher in `directory`: the export or the weights, and its info."""
    if info.kind == SERVED:
        shutil.copytree(os.path.expanduser(info.spec), os.path.join(directory, EXPORT))
    else:
        flat = {
            f"{layer}/{name}": value
            for layer, values in weights.items()
            for name, value in values.items()
        }
        with open(os.path.join(directory, WEIGHTS), "wb") as f:
            np.savez(f, **flat)
    with open(os.path.join(directory, INFO), "w") as f:
        json.dump(dataclasses.asdict(info), f, indent=1)


def _network_weights(config: config_lib.Config, classes: int):
    """(info, {layer: {variable: array}}) of a run or weights-file teacher."""
    spec = config.train.teacher
    source = sources.parse(spec, KEY)
    if source.kind == sources.RUN:
        prefix, directory = sources.checkpoint_of(source)
        model, saved, channels = run_files.build(prefix, KEY)
        recorded = run_pipeline.read_data_info(directory)
        if recorded is None:
            raise ConfigError(
                f"{KEY}={spec}: the run records no preprocessing (no data_info.json); give a "
                "run directory that has trained with this app, or an export of it"
            )
        names, preprocessing = recorded
        name, classes = saved.model_name, int(model.logits.units)
        mean, std = tuple(preprocessing.mean), tuple(preprocessing.std)
        fields, about = dict(saved.model_overrides), f"{name} of the run {prefix}"
        info = TeacherInfo(spec, NETWORK, about, classes, names, name, fields, channels, mean, std)
        return info, parts.get_weights(model)
    sources.check_teacher(spec, config.train.teacher_model)
    name = config.train.teacher_model or source.name
    overrides = dict(source.model_fields)
    model = factory.create_network(name, overrides, classes, 64)
    weights = adapt_input_channels(read_weights(source, model, name), model, spec)
    head = weights.layers.get(HEAD_LAYER, {}).get("kernel")
    found = classes if head is None else int(head.shape[-1])
    about = f"{name} from {sources.describe(source)}"
    mean, std = tuple(source.mean), tuple(source.std)
    info = TeacherInfo(spec, NETWORK, about, found, None, name, overrides, mean=mean, std=std)
    return info, weights.layers


def _read_copy(directory: str):
    """(info, weights or the loaded export) from the run's copy."""
    try:
        with open(os.path.join(directory, INFO)) as f:
            fields = json.load(f)
        info = TeacherInfo(
            **{k: tuple(v) if k in ("mean", "std") else v for k, v in fields.items()}
        )
        if info.kind == SERVED:
            return info, tf.saved_model.load(os.path.join(directory, EXPORT))
        weights: dict[str, dict[str, np.ndarray]] = {}
        with np.load(os.path.join(directory, WEIGHTS), allow_pickle=False) as saved:
            for key in saved.files:
                layer, name = key.rsplit("/", 1)
                weights.setdefault(layer, {})[name] = saved[key]
    except (*files.DAMAGED_NPZ, TypeError, json.JSONDecodeError) as error:
        raise ConfigError(
            f"the run's copy of its teacher in {directory} is damaged "
            f"({type(error).__name__}: {error}); restart the run (--restart)"
        ) from None
    return info, weights


def log_cost(teacher: Teacher, batch_shape: list[int], dtype: tf.DType) -> float:
    """Times one warm teacher forward pass on a tower's batch (what it adds to every
    step), logs it and returns the seconds."""
    forward = tf.function(teacher.__call__)
    images = tf.zeros(batch_shape, dtype)
    forward(images).numpy()
    began = time.perf_counter()
    forward(images).numpy()
    seconds = time.perf_counter() - began
    logging.info(
        "The teacher's forward pass takes %.1f ms per tower batch of %d images (inference "
        "mode), in every training step",
        seconds * 1000, batch_shape[0],
    )  # fmt: skip
    return seconds
