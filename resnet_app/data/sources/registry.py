"""`--dataset` to a source: `scheme:argument`, parsed once, through one registry.

Each source module registers its loader:

    @register_source("folder", usage="folder:PATH", needs_argument=True)
    def load(argument: str, config: DataConfig) -> Source: ...

A name without a registered scheme ("cifar10", "imagenette/320px-v2",
"cifar10:3.0.2") is a tfds name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from resnet_app.common.errors import ConfigError

TFDS_SCHEME = "tfds"
# Names that need no loader: the pipeline makes their batches itself.
BUILTIN_NAMES = ("synthetic",)


@dataclasses.dataclass(frozen=True)
class SourceKind:
    """A registered source.

    Attributes:
      scheme: the name before the colon ("folder"), or the whole name ("shapes").
      load: `load(argument, data_config)` -> `Source`.
      usage: how it is written, for messages ("folder:PATH").
      needs_argument: whether it takes `scheme:argument` (else it stands alone).
    """

    scheme: str
    load: Callable
    usage: str
    needs_argument: bool


_KINDS: dict[str, SourceKind] = {}


def register_source(scheme: str, usage: str, needs_argument: bool = True) -> Callable:
    """Registers the decorated `load(argument, config)` for `scheme`."""

    def decorate(load: Callable) -> Callable:
        _KINDS[scheme] = SourceKind(scheme, load, usage, needs_argument)
        return load

    return decorate


_CHECKS: dict[str, Callable] = {}


def register_check(scheme: str) -> Callable:
    """Registers the decorated `check(argument, config)` for `scheme`.

    A check finds, without TensorFlow and in well under a second, the
    mistakes the loader would find later: a missing path, a folder of the
    wrong layout, a dataset that cannot be downloaded.
    """

    def decorate(check: Callable) -> Callable:
        _CHECKS[scheme] = check
        return check

    return decorate


def check_source(config) -> None:
    """Refuses, before TensorFlow is imported, a `config.dataset` that cannot load.

    Args:
      config: the `DataConfig`.

    Raises:
      ConfigError: one line naming the problem and the fix.
    """
    kind, argument = parse(config.dataset)
    if kind is not None and kind.scheme in _CHECKS:
        _CHECKS[kind.scheme](argument, config)


def scheme_names() -> list[str]:
    """The names of the built-in and registered kinds (not tfds's datasets)."""
    return [*BUILTIN_NAMES, *(scheme for scheme in _KINDS if scheme != TFDS_SCHEME)]


def usages() -> str:
    """Every way to name a dataset, for messages."""
    return ", ".join([*BUILTIN_NAMES, *(kind.usage for kind in _KINDS.values())])


def parse(dataset: str) -> tuple[SourceKind | None, str]:
    """(the source kind, its argument) of a `--dataset` value; (None, name) for synthetic.

    Raises:
      ConfigError: when a `scheme:` that needs an argument has none.
    """
    if dataset in BUILTIN_NAMES:
        return None, dataset
    scheme, colon, argument = dataset.partition(":")
    kind = _KINDS.get(scheme)
    if kind is not None and kind.needs_argument and colon:
        if not argument:
            raise ConfigError(f"--dataset={dataset} needs an argument: {kind.usage}")
        return kind, argument
    if kind is not None and not kind.needs_argument and not colon:
        return kind, ""
    if kind is not None and kind.needs_argument:
        raise ConfigError(f"--dataset={dataset} needs an argument: {kind.usage}")
    return _KINDS[TFDS_SCHEME], dataset


def load_source(config):
    """The `Source` of `config.dataset` (None for synthetic data)."""
    kind, argument = parse(config.dataset)
    return None if kind is None else kind.load(argument, config)


def file_label(dataset: str) -> str:
    """A dataset name fit for a directory name: "folder:/data/x" -> "data_x"."""
    kind, argument = parse(dataset)
    text = argument if kind is not None and kind.needs_argument else dataset
    return text.strip("/").replace("/", "_").replace(":", "_") or "data"
