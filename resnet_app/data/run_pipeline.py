"""The input of a run: its pipeline, and what its run directory records about it.

`create_run_pipeline(config)` is the one factory training, evaluate and export
call: the run's model preset gives its input size to data without a size of its
own, and a run directory whose `data_info.json` records another size keeps it
(see `image_size.choose_image_size`). `write_data_info` records the class names
and the resolved preprocessing in `data_info.json`, so that export and predict
need neither the dataset nor a re-measurement, and a resumed run normalizes
with the statistics it started with; `read_data_info` reads them back.
The file's name and its atomic write belong to `common/run_dir.py`.
"""

from __future__ import annotations

import dataclasses

from absl import logging

from resnet_app.common import migration, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.data.channels import RGB
from resnet_app.data.input_pipeline import InputPipeline, Recorded
from resnet_app.data.preprocessing import Preprocessing
from resnet_app.data.settings import AugmentSettings, DataConfig

__all__ = [
    "create_run_pipeline",
    "parse_data_info",
    "read_data_info",
    "write_data_info",
]


def write_data_info(pipeline: InputPipeline, model_dir: str) -> None:
    """Records the class names and the resolved preprocessing in `model_dir`.

    A model is only usable with the exact preprocessing it was trained with,
    including the per-channel statistics measured on the training split. With
    this file, export and predict need neither the dataset nor a re-measurement.
    Written atomically.

    Args:
      pipeline: the run's pipeline.
      model_dir: the run directory.
    """
    info = {
        "dataset": pipeline.config.dataset,
        "class_names": list(pipeline.class_names),
        "multi_label": pipeline.multi_label,
        "preprocessing": dataclasses.asdict(pipeline.preprocessing),
    }
    run_dir.write_data_info(model_dir, info)


def parse_data_info(info: dict) -> tuple[list[str], Preprocessing]:
    """(class names, preprocessing) from `{"class_names", "preprocessing"}` as
    `write_data_info` writes them (and the export's model_info.json holds them).

    Files written before the augmentation nested (its keys beside the others)
    read the same (`common/migration.py`).
    """

    def typed(values: dict) -> dict:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}

    fields = typed(migration.preprocessing(info["preprocessing"]))
    augment = AugmentSettings(**typed(fields.pop("augment", {})))
    return [str(name) for name in info["class_names"]], Preprocessing(**fields, augment=augment)


def read_data_info(model_dir: str) -> tuple[list[str], Preprocessing] | None:
    """The class names and preprocessing `write_data_info` recorded, or None if absent.

    Args:
      model_dir: the run directory.

    Returns:
      (class names, preprocessing), or None when the run has no data_info.json.

    Raises:
      ConfigError: when the file exists but is not one `write_data_info` wrote.
    """
    return run_dir.read_data_info(model_dir, parse_data_info)


def _recorded(model_dir: str, dataset: str, preset_size: int) -> Recorded:
    """What `model_dir`'s run was trained on, as far as the directory tells.

    Its data_info.json records the image size and the mean and std it
    normalized with, one per input channel (files from before the statistics
    were recorded: RGB, as every run then was). A run directory with
    checkpoints but without that file predates it (every run since writes it
    before its first checkpoint): such runs were trained in RGB at the model
    preset's size when data.image_size was unset, so that is their size. A
    damaged file, or one of another dataset (changed on resume), records
    nothing: the rules apply, and training writes the file anew.

    Args:
      model_dir: the run directory.
      dataset: the run's `data.dataset`.
      preset_size: the model preset's input size.
    """

    def read(info: dict) -> tuple[str, Recorded]:
        kept = info["preprocessing"]
        stats = None  # Files from before the statistics were recorded: measure them.
        if "mean" in kept and "std" in kept:
            stats = (tuple(map(float, kept["mean"])), tuple(map(float, kept["std"])))
        channels = None if stats else RGB  # With statistics, their length.
        return info["dataset"], Recorded(int(kept["image_size"]), stats, channels)

    try:
        recorded = run_dir.read_data_info(model_dir, read)
    except ConfigError as error:
        logging.warning("Ignoring the recorded image size and statistics: %s", error)
        return Recorded()
    if recorded is None:
        if run_dir.has_checkpoints(model_dir):
            return Recorded(preset_size, channels=RGB)
        return Recorded()
    return recorded[1] if recorded[0] == dataset else Recorded()


def create_run_pipeline(
    config, data_config: DataConfig | None = None, model_dir: str | None = None
) -> InputPipeline:
    """The input of a run, for training, evaluate and export alike.

    The image size follows `image_size.choose_image_size`: the run's model preset gives
    it to data without a size of its own.

    Args:
      config: the run's resolved `Config`.
      data_config: data settings in place of `config.data` (evaluate moves
        `data_dir` or picks another split).
      model_dir: the run directory of an existing run, whose data_info.json
        may record its image size; None for a new run (or --restart).

    Returns:
      The `InputPipeline`.
    """
    from resnet_app.nets.presets import get_config  # Pure data: no TensorFlow.

    data = data_config or config.data
    preset = get_config(config.model_name, **config.model_overrides)
    recorded = Recorded()
    if model_dir:  # data.image_size, when set, wins over a recorded size.
        recorded = _recorded(model_dir, data.dataset, preset.default_image_size)
    return InputPipeline(data, preset.default_image_size, config.model_name, recorded)
