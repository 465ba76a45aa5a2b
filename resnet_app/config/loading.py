"""YAML as a config reads and writes it, recipe files, and `--set KEY=VALUE`.

Numbers are read as people write them: `1e-4` is a float (YAML 1.1 wants
`1.0e-4`), and a string that would read as a number is quoted when written.
Every mistake is a one-line `ConfigError` naming the file or the assignment.
"""

from __future__ import annotations

import os
import re
from typing import IO, Any

import yaml

from resnet_app.common.errors import ConfigError
from resnet_app.config.sections import SECTIONS


class _Loader(yaml.SafeLoader):
    """YAML as people write numbers: `1e-4` is a float (YAML 1.1 wants `1.0e-4`)."""


class _Dumper(yaml.SafeDumper):
    """Quotes a string such as "1e5", which `_Loader` would read as a number."""


for _yaml_class in (_Loader, _Dumper):
    _yaml_class.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
        list("-+0123456789."),
    )


def load_yaml(text: str | IO[str]) -> Any:
    """Parses YAML text or a file object, reading `1e-4` as a number."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader.


def dump_yaml(tree: Any) -> str:
    """YAML text that `load_yaml` reads back equal; keys keep their order."""
    return yaml.dump(tree, Dumper=_Dumper, sort_keys=False)


def read_yaml(path: str) -> dict[str, Any]:
    """Reads a config file; a missing or malformed file is a one-line `ConfigError`."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path} not found; check the path")
    try:
        with open(path) as f:
            content = load_yaml(f)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}; fix the syntax") from None
    if content is None:
        return {}
    if not isinstance(content, dict):
        sections = ", ".join(SECTIONS)
        raise ConfigError(f"config file {path} must be a mapping of sections ({sections})")
    return content


def parse_set(assignment: str) -> tuple[list[str], Any]:
    """Splits `section.key=value` into its key path and its YAML-parsed value."""
    key, equals, text = assignment.partition("=")
    if not equals or not key:
        raise ConfigError(
            f"--set {assignment}: use --set section.key=value, e.g. train.batch_size=256"
        )
    try:
        value = load_yaml(text) if text else ""
    except yaml.YAMLError:
        value = text
    return key.strip().split("."), value
