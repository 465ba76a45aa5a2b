"""`config.yaml` in a run directory: every field spelled out, a derived default as null."""

from __future__ import annotations

import os

import yaml

from resnet_app.common import files, run_dir
from resnet_app.common.errors import ConfigError
from resnet_app.config.layers import from_dict
from resnet_app.config.loading import dump_yaml, load_yaml, read_yaml
from resnet_app.config.sections import SECTIONS, Config

CONFIG_FILE = run_dir.CONFIG_FILE
# The way out of an empty config.yaml: never "every setting at its default".
EMPTY_RUN_CONFIG = "restore it from a copy, or train into a new --model_dir"


def to_yaml(config: Config) -> str:
    """The resolved config as YAML text; `from_yaml` reads it back equal."""
    return dump_yaml(config.to_dict())


def from_yaml(text: str, where: str) -> Config:
    """Reads `to_yaml`'s text back; `where` names its origin in errors."""
    try:
        tree = load_yaml(text)
    except yaml.YAMLError:
        raise ConfigError(f"{where} is not valid YAML; it was not written by resnet_app") from None
    if tree is None:
        raise ConfigError(f"{where} is empty; it was not written whole ({EMPTY_RUN_CONFIG})")
    if not isinstance(tree, dict):
        raise ConfigError(f"{where} must be a mapping of sections ({', '.join(SECTIONS)})")
    return from_dict(tree)


def write_yaml(config: Config, path: str) -> None:
    """Writes the resolved config (atomically: a reader never sees half a file)."""
    files.write_text_atomically(path, to_yaml(config))


def read_run_config(model_dir: str | None) -> Config:
    """The config a run was trained with, from `model_dir/config.yaml` (ConfigError if none)."""
    path = run_dir.config_path(model_dir or "")
    if not model_dir or not os.path.isfile(path):
        found = f"{model_dir} has no {CONFIG_FILE}" if model_dir else "it is not set"
        raise ConfigError(
            f"--model_dir must be a run directory written by `python -m resnet_app.train` ({found})"
        )
    try:
        with open(path, "rb") as f:
            empty = not f.read().strip()
    except OSError as error:
        raise ConfigError(f"cannot read {path} ({error.strerror}); check its permissions") from None
    if empty:
        raise ConfigError(f"{path} is empty; it was not written whole ({EMPTY_RUN_CONFIG})")
    try:
        return from_dict(read_yaml(path))
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None
