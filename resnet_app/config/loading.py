"""YAML as a config reads and writes it (`1e-4` is a float), recipe files, and `--set`."""

from __future__ import annotations

import os
import re
from typing import IO, Any

import yaml

from resnet_app.common.errors import ConfigError
from resnet_app.config.sections import SECTIONS


class DuplicateKey(yaml.YAMLError):
    """A mapping that names one key twice; YAML would keep only the last silently."""


class _Loader(yaml.SafeLoader):
    """`1e-4` as a float; a key given twice in one mapping is an error, not silently replaced."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise DuplicateKey(f"{key!r} appears twice (lines {seen[key]} and {line})")
                    seen[key] = line
                except TypeError:  # An unhashable key: YAML's own error follows.
                    break
        return super().construct_mapping(node, deep=deep)


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
    except DuplicateKey as error:
        raise ConfigError(f"config file {path}: {error}; keep one and merge them") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}; fix the syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"config file {path} is not valid YAML (not UTF-8 text); name the right file"
        ) from None
    except OSError as error:
        raise ConfigError(
            f"cannot read config file {path} ({error.strerror}); check its permissions"
        ) from None
    sections = ", ".join(SECTIONS)
    if content is None:
        raise ConfigError(
            f"config file {path} is empty; give it sections ({sections}) or leave it out"
        )
    if not isinstance(content, dict):
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
