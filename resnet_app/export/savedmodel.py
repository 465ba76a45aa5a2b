"""A trained model as serving functions: images in, class probabilities out.

`ServingModel` wraps a run's restored network with its evaluation
preprocessing and class names; `save` writes it as a SavedModel whose
signatures are its functions:

- `serving_default(images)`: uint8 [batch, height, width, 1, 3 or 4] of any
  size, brought to the run's channels and given the run's evaluation
  preprocessing. Returns `logits` float32 [batch, classes] (with `--tta=flip`
  the log of the averaged probabilities); `probabilities`, softmax(logits / T)
  with the run's fitted temperature T; `top_k_ids` int32, `top_k_probabilities`
  and `top_k_names` [batch, k]. Multi-label: each class's sigmoid, every class
  ranked, and `threshold` float32 [batch], the run's `train.threshold`.
- `serving_bytes(images)`: string [batch] of encoded JPEG, PNG, BMP or GIF
  files; the same outputs.
- `features(images)`: as `serving_default`'s input; `features` float32
  [batch, width], the pooled activations the logits read.

The network computes in float32 on images rounded to the run's data dtype,
exactly as `python -m resnet_app.evaluate` does.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable

import tensorflow as tf
from absl import logging

from resnet_app import config
from resnet_app.common import checkpoint, checks, files, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.data import channels as image_channels
from resnet_app.data import families, run_pipeline
from resnet_app.data.preprocessing import Preprocessing
from resnet_app.evaluation import calibration
from resnet_app.export import portable
from resnet_app.nets import factory

TOP_K = 5
SIGNATURES = ("serving_default", "serving_bytes", "features")


class ServingModel(tf.Module):
    """A classifier of raw images, from a trained network and its run's data settings."""

    def __init__(
        self,
        model,
        preprocessing: Preprocessing,
        class_names: list[str],
        top_k: int = TOP_K,
        temperature: float = 1.0,
        tta: str = "none",
        multi_label: bool = False,
        threshold: float = 0.5,
    ):
        super().__init__(name="resnet_app")
        self.model = model
        self.temperature = float(temperature)
        self.tta = tta
        self.multi_label, self.threshold = multi_label, float(threshold)
        self.class_names = list(class_names)
        self.top_k = max(1, min(top_k, len(self.class_names)))
        if multi_label:  # Every class, ranked: predict shows those above the threshold.
            self.top_k = len(self.class_names)
        self.preprocessing = preprocessing  # The run's evaluation's: every signature applies it.
        self._names = tf.constant(self.class_names, tf.string)

    def _preprocess(self, images: tf.Tensor, encoded: bool) -> tf.Tensor:
        size, channels = self.preprocessing.eval_size, self.preprocessing.channels
        recipe = families.of(self.preprocessing)
        if not encoded:  # Files are decoded to the run's channels.
            images = image_channels.convert(images, channels)
        return tf.map_fn(
            lambda image: recipe.evaluate(image, self.preprocessing, encoded),
            images,
            fn_output_signature=tf.TensorSpec([size, size, channels], self.preprocessing.dtype),
        )

    def _classify(self, pixels: tf.Tensor) -> dict[str, tf.Tensor]:
        logits, probabilities = portable.classify_pixels(
            self.model, pixels, self.tta, self.temperature, self.multi_label
        )
        # Ranked by logits: probabilities that underflow to 0 would tie.
        top_ids = tf.math.top_k(logits, self.top_k).indices
        outputs = {
            "logits": logits,
            "probabilities": probabilities,
            "top_k_ids": top_ids,
            "top_k_probabilities": tf.gather(probabilities, top_ids, batch_dims=1),
            "top_k_names": tf.gather(self._names, top_ids),
        }
        if self.multi_label:
            outputs["threshold"] = tf.fill(tf.shape(logits)[:1], self.threshold)
        return outputs

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, None], tf.uint8, name="images")])
    def serve_images(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        """`serving_default`: decoded uint8 images of any size."""
        return self._classify(self._preprocess(images, encoded=False))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="images")])
    def serve_bytes(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        """`serving_bytes`: encoded image files."""
        return self._classify(self._preprocess(images, encoded=True))

    @tf.function(input_signature=[tf.TensorSpec([None, None, None, None], tf.uint8, name="images")])
    def features(self, images: tf.Tensor) -> dict[str, tf.Tensor]:
        """`features`: the pooled features of decoded uint8 images."""
        pixels = self._preprocess(images, encoded=False)
        return {"features": tf.cast(self.model.features(pixels, training=False), tf.float32)}

    def signatures(self) -> dict[str, tf.types.experimental.ConcreteFunction]:
        """The SavedModel signatures, by name."""
        functions = (self.serve_images, self.serve_bytes, self.features)
        return {name: f.get_concrete_function() for name, f in zip(SIGNATURES, functions)}


def _data_info(model_dir: str, run_config: config.Config) -> tuple[list[str], Preprocessing]:
    """The run's class names and preprocessing: as recorded, else from its dataset."""
    recorded = run_pipeline.read_data_info(model_dir)
    if recorded is not None:
        return recorded
    logging.warning(
        "%s has no %s; reading the dataset %s for the classes and preprocessing",
        model_dir,
        run_dir.DATA_INFO_FILE,
        run_config.data.dataset,
    )
    pipeline = run_pipeline.create_run_pipeline(run_config, model_dir=model_dir)
    return pipeline.class_names, pipeline.preprocessing


def load(
    model_dir: str,
    which: str = "latest",
    top_k: int = TOP_K,
    tta: str = "none",
    weights: str = "auto",
) -> tuple[ServingModel, dict]:
    """(a run's checkpoint as a `ServingModel`, where it came from: model_dir, checkpoint, ...).

    `which` is latest, ckpt-N or N; `tta` "none" or "flip"; `weights` "auto",
    "ema" or "raw" (`checkpoint.restore_model`).

    Raises:
      ConfigError: for a directory that is not a run, an unknown or unreadable
        checkpoint, or a checkpoint of another model.
    """
    run_config = config.read_run_config(model_dir)
    if which == "all":
        raise ConfigError("--checkpoint=all: this takes one checkpoint; use latest, ckpt-N or N")
    checks.at_least("--top_k", top_k)
    [(step, prefix)] = checkpoint.select(model_dir, which)
    class_names, preprocessing = _data_info(model_dir, run_config)
    multi_label = run_dir.recorded_multi_label(model_dir)
    if multi_label and tta != "none":
        raise ConfigError(
            f"--tta={tta} averages softmax probabilities; this run's data is multi-label: drop it"
        )
    model = factory.create_run_model(
        run_config, len(class_names), preprocessing.image_size, channels=preprocessing.channels
    )
    step, prefix, chosen = checkpoint.restore_selected(
        model, model_dir, which, step, prefix, weights
    )
    logging.info(
        "Restored %s (step %d, %s weights) from %s", run_config.model_name, step, chosen, prefix
    )
    fitted = calibration.read_temperature_record(model_dir)
    calibration.warn_if_fitted_elsewhere(fitted, prefix, chosen)
    temperature = 1.0 if fitted is None else fitted["temperature"]
    threshold = run_config.train.threshold
    source = {
        "model_dir": os.path.abspath(model_dir),
        "checkpoint": os.path.basename(prefix),
        "step": step,
        "weights": chosen,
        "model": run_config.model_name,
        "dataset": run_config.data.dataset,
        "temperature": temperature,
        "tta": tta,
        "multi_label": multi_label,
        "threshold": threshold if multi_label else None,
    }
    served = ServingModel(
        model, preprocessing, class_names, top_k, temperature, tta, multi_label, threshold
    )
    return served, source


def is_export(directory: str) -> bool:
    """Whether `directory` holds an export written by `save`."""
    return tf.saved_model.contains_saved_model(directory) and os.path.isfile(
        os.path.join(directory, "assets.extra", "export_info.json")
    )


def check_destination(export_dir: str, overwrite: bool, model_dir: str | None = None) -> str:
    """The absolute export directory; refused (ConfigError) if writing it could lose anything.

    Only an empty directory, or with `overwrite` a previous export, is replaced:
    never a file, the run directory or a parent of it, or another directory.
    """
    # A link is followed: the export replaces what the link points to.
    export_dir = os.path.realpath(export_dir)
    recover(export_dir)
    if model_dir is not None:
        run = os.path.realpath(model_dir)
        if run == export_dir or run.startswith(export_dir.rstrip(os.sep) + os.sep):
            raise ConfigError(
                f"--export_dir={export_dir} holds the run {model_dir}; name a directory "
                f"outside it, e.g. {os.path.join(export_dir, 'export')}"
            )
        # TensorFlow reads a directory named like a checkpoint as one: an
        # export at RUN/ckpt-N would hide checkpoint N.
        if os.path.dirname(export_dir) == run and run_dir.is_checkpoint_name(
            os.path.basename(export_dir)
        ):
            raise ConfigError(
                f"--export_dir={export_dir} is named like a checkpoint of the run; name "
                f"it otherwise, e.g. {os.path.join(run, 'export')}"
            )
    if os.path.exists(export_dir):
        if not os.path.isdir(export_dir):
            raise ConfigError(f"--export_dir={export_dir} is a file; name a directory")
        if os.listdir(export_dir):
            if not is_export(export_dir):
                raise ConfigError(
                    f"--export_dir={export_dir} is a non-empty directory that is not an "
                    f"export; name a new or empty directory"
                )
            if not overwrite:
                raise ConfigError(
                    f"--export_dir={export_dir} holds an export; add --overwrite to replace "
                    f"it, or name a new directory"
                )
    return export_dir


def _leftovers(export_dir: str, kind: str) -> list[str]:
    """`export_dir.<kind>-<pid>` directories of exports that are no longer running."""
    found = files.left_by_dead_writers(export_dir, f".{kind}-{{pid}}")
    return [path for path in found if os.path.isdir(path)]


def recover(export_dir: str) -> None:
    """Repairs what an interrupted export to `export_dir` left (see `save`): an old export a
    kill left aside is put back; unfinished copies and replaced exports are removed."""
    replaced = _leftovers(export_dir, "replaced")
    if replaced and not os.path.lexists(export_dir) and is_export(replaced[-1]):
        logging.warning("Putting back the export %s, set aside by a killed export", replaced[-1])
        os.replace(replaced.pop(), export_dir)
        files.sync_directory(os.path.dirname(export_dir))
    for path in replaced + _leftovers(export_dir, "partial"):
        logging.info("Removing %s, left by an interrupted export", path)
        shutil.rmtree(path, ignore_errors=True)


def readable(export_dir: str) -> str:
    """Where the export `export_dir` is to be read: itself, or the one a killed export set aside
    (read where it is; the next export puts it back, `recover`)."""
    if os.path.lexists(export_dir):
        return export_dir
    replaced = [path for path in _leftovers(export_dir, "replaced") if is_export(path)]
    if not replaced:
        return export_dir
    logging.warning(
        "%s is missing: an export to it was killed; reading the export it set aside, %s "
        "(the next export to %s puts it back)",
        export_dir,
        replaced[-1],
        export_dir,
    )
    return replaced[-1]


def save(
    served: ServingModel,
    source: dict,
    export_dir: str,
    overwrite: bool = False,
    more: Callable[[str], None] | None = None,
) -> str:
    """Writes `served` as a SavedModel with `SIGNATURES`, all or nothing; its absolute path.

    It is written to `<export_dir>.partial-<pid>/`, the old export renamed to
    `<export_dir>.replaced-<pid>/`, the new one in, and the old one removed, so
    `export_dir` never holds half a model. `source` goes to
    assets.extra/export_info.json; `more(staged)` writes other formats first.
    """
    export_dir = check_destination(export_dir, overwrite, source.get("model_dir"))
    staged = f"{export_dir}.partial-{os.getpid()}"
    try:  # A place that cannot be written is refused in one line, before the model is saved.
        os.makedirs(staged)
    except OSError as error:
        raise ConfigError(
            f"--export_dir={export_dir}: cannot write there ({error.strerror}: "
            f"{error.filename}); pick another directory"
        ) from None

    def fill(directory: str) -> None:
        tf.saved_model.save(served, directory, signatures=served.signatures())
        # assets.extra/: the class names one per line, and where the model came from.
        extra = os.path.join(directory, "assets.extra")
        os.makedirs(extra, exist_ok=True)
        with open(os.path.join(extra, "labels.txt"), "w") as f:
            f.write("".join(f"{name}\n" for name in served.class_names))
        info = {**source, "signatures": list(SIGNATURES), "top_k": served.top_k}
        with open(os.path.join(extra, "export_info.json"), "w") as f:
            json.dump(info, f, indent=1)
        if more is not None:
            more(directory)

    # A non-empty directory cannot be renamed over: the old export steps aside
    # first, and comes back if the rename fails (or at the next export, after a
    # kill: `recover`).
    files.replace_directory(export_dir, staged, f"{export_dir}.replaced-{os.getpid()}", fill)
    logging.info("Exported %s (signatures %s) to %s", source, ", ".join(SIGNATURES), export_dir)
    return export_dir
