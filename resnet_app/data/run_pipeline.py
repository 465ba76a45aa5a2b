"""The input of a run: its pipeline, and what its run directory records about it.

`create_run_pipeline(config)` is the one factory training, evaluate and export call.
`write_data_info` records the class names and the resolved preprocessing in
data_info.json, so that export and predict need neither the dataset nor a re-measurement
and a resumed run normalizes with the statistics it started with; `read_data_info` reads
them back. The file's name and atomic write belong to `common/run_dir.py`.
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


def write_data_info(pipeline: InputPipeline, model_dir: str) -> None:
    """Records the class names and the resolved preprocessing (a model is only usable with
    the exact preprocessing it trained with) in `model_dir`'s data_info.json, atomically."""
    info = {
        "dataset": pipeline.config.dataset,
        "class_names": list(pipeline.class_names),
        "multi_label": pipeline.multi_label,
        "preprocessing": dataclasses.asdict(pipeline.preprocessing),
    }
    run_dir.write_data_info(model_dir, info)


def parse_data_info(info: dict) -> tuple[list[str], Preprocessing]:
    """(class names, preprocessing) from `{"class_names", "preprocessing"}` as data_info.json
    and the export's model_info.json hold them (older layouts through `common/migration.py`)."""

    def typed(values: dict) -> dict:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}

    fields = typed(migration.preprocessing(info["preprocessing"]))
    augment = AugmentSettings(**typed(fields.pop("augment", {})))
    return [str(name) for name in info["class_names"]], Preprocessing(**fields, augment=augment)


def read_data_info(model_dir: str) -> tuple[list[str], Preprocessing] | None:
    """(class names, preprocessing) as `write_data_info` recorded them, or None without
    data_info.json; refuses a file `write_data_info` did not write."""
    return run_dir.read_data_info(model_dir, parse_data_info)


def _recorded(model_dir: str, dataset: str, preset_size: int) -> Recorded:
    """What `model_dir`'s run was trained on, as far as the directory tells.

    Its data_info.json records the image size and the mean and std, one per input channel
    (files from before the statistics were recorded: RGB). Checkpoints without that file
    predate it: such runs trained in RGB at the model preset's size. A damaged file, or one
    of another `dataset` (changed on resume), records nothing, and training writes it anew.
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
    """The input of a run, for training, evaluate and export alike: `config`'s model preset
    gives its input size to data without one, `data_config` replaces `config.data`
    (evaluate's), and `model_dir`'s data_info.json (an existing run's) may record the size."""
    from resnet_app.nets.presets import get_config  # Pure data: no TensorFlow.

    data = data_config or config.data
    preset = get_config(config.model_name, **config.model_overrides)
    recorded = Recorded()
    if model_dir:  # data.image_size, when set, wins over a recorded size.
        recorded = _recorded(model_dir, data.dataset, preset.default_image_size)
    return InputPipeline(data, preset.default_image_size, config.model_name, recorded)
