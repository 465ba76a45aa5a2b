"""Starting a run from pretrained weights (`train.init_from`).

`sources.py` says what the setting names, its network and preprocessing; one
reader per kind of source (`keras_files`, `torch_files`, `run_files`) gives
the weights under our names; `weights.py` checks, assigns and reports. The
engine calls `prepare` before it builds the data, `load` when a run starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import logging

from resnet_app.config import Config
from resnet_app.pretrained import sources
from resnet_app.pretrained.sources import Source

if TYPE_CHECKING:  # weights.py needs Keras: `sources.parse` is checked without it.
    from resnet_app.pretrained.weights import Report, SourceWeights

__all__ = ["Source", "load", "prepare", "read_weights"]


def prepare(config: Config, saved: Config | None = None) -> tuple[Config, Source | None]:
    """(the config with its source's network and preprocessing, the source to load or None).

    `saved` is a resumed run's config: its source is not read again (it may be
    gone). ConfigError for a bad source, or a model field that contradicts it.
    """
    spec = config.train.init_from
    if not spec:
        return config, None
    if saved is not None:
        return sources.adopt(config, sources.recorded(saved, spec)), None
    source = sources.parse(spec)
    if source.kind == sources.RUN:
        source = sources.with_run_details(source)
    return sources.adopt(config, source), source


def read_weights(source: Source, model, model_name: str) -> SourceWeights:
    """The source's weights under `model`'s layer names (Keras's fetched if not cached)."""
    from resnet_app.pretrained import keras_files, run_files, torch_files

    if source.kind == sources.KERAS:
        with_top = int(model.logits.units) == 1000
        path = source.path or keras_files.find_or_fetch(source.name, with_top)
        return keras_files.read(path, model, model_name)
    if source.kind == sources.TORCHVISION:
        return torch_files.read(source.path, model, model_name)
    return run_files.read(source.path)


def load(model, source: Source, model_name: str, init_head: str = "auto") -> Report:
    """Loads the source's weights into a built model and logs the report table."""
    from resnet_app.pretrained.weights import assign

    weights = read_weights(source, model, model_name)
    report = assign(model, weights, sources.describe(source), model_name, init_head)
    logging.info(
        "Initialized from %s:\n  %s", sources.describe(source), "\n  ".join(report.lines())
    )
    return report
