"""`--dataset` to a source: `scheme:argument`, parsed once, through one registry.

Each source module registers its loader with `@register_source("folder", usage=...)`, and
optionally a fast check without TensorFlow with `@register_check`. A name without a
registered scheme ("cifar10", "imagenette/320px-v2", "cifar10:3.0.2") is a tfds name.

A source of the user's own is a module that registers itself the same way: named by an
installed distribution's entry point (group `resnet_app.sources`) or, for one shell, by
`RESNET_APP_PLUGINS=module[,module...]`. Plugins are imported the first time a
`--dataset` is read, never because a config or run directory names them. A kind that
gives `example` is run through every command by the test suite with no other edit.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
from collections.abc import Callable

from resnet_app.common.errors import ConfigError, first_line

TFDS_SCHEME = "tfds"
PLUGIN_GROUP = "resnet_app.sources"
PLUGIN_VARIABLE = "RESNET_APP_PLUGINS"
BUILTIN_NAMES = ("synthetic",)  # No loader: the pipeline makes their batches itself.


@dataclasses.dataclass(frozen=True)
class SourceKind:
    """A registered source: its scheme ("folder", or a whole name: "shapes"), `load(argument,
    data_config)`, its usage in messages ("folder:PATH"), whether it takes an argument, and
    optionally `example(directory, images, labels, splits)`, which writes uint8 images with
    int labels, each in its split, in its format and returns the `--dataset` that reads them.
    """

    scheme: str
    load: Callable
    usage: str
    needs_argument: bool
    example: Callable | None = None


_KINDS: dict[str, SourceKind] = {}
_CHECKS: dict[str, Callable] = {}
_plugins_read: set[str] = set()
_entry_points: list[tuple[str, str]] = []  # Scanned once per process.


def register_source(
    scheme: str, usage: str, needs_argument: bool = True, example: Callable | None = None
) -> Callable:
    """Registers the decorated `load(argument, config)` for `scheme` (see `SourceKind`)."""

    def decorate(load: Callable) -> Callable:
        _KINDS[scheme] = SourceKind(scheme, load, usage, needs_argument, example)
        return load

    return decorate


def register_check(scheme: str) -> Callable:
    """Registers the decorated `check(argument, config)` for `scheme`: it finds, without
    TensorFlow and quickly, what the loader would find later (a missing path, a wrong
    layout, a dataset that cannot be downloaded)."""

    def decorate(check: Callable) -> Callable:
        _CHECKS[scheme] = check
        return check

    return decorate


def _plugin_modules() -> list[tuple[str, str]]:
    """(module, where it was named) of every plugin: entry points, then the variable."""
    if not _entry_points:
        where = f"entry point of {PLUGIN_GROUP}"
        points = importlib.metadata.entry_points(group=PLUGIN_GROUP)
        _entry_points.extend((point.value.partition(":")[0], where) for point in points)
        _entry_points.append(("", ""))  # Scanned, even when there are none.
    variable = os.environ.get(PLUGIN_VARIABLE, "")
    named = [(name.strip(), PLUGIN_VARIABLE) for name in variable.split(",") if name.strip()]
    return [entry for entry in _entry_points if entry[0]] + named


def kinds() -> dict[str, SourceKind]:
    """Every registered kind by scheme, the plugins' included (each imported once).

    Raises:
      ConfigError: a plugin that cannot be imported, with where it was named.
    """
    for module, where in _plugin_modules():
        if module in _plugins_read:
            continue
        try:
            importlib.import_module(module)
        except Exception as error:  # Whatever the plugin raised: one line, not a traceback.
            raise ConfigError(
                f"data source plugin {module!r} ({where}) cannot be imported: "
                f"{first_line(error, with_type=True)}; fix it or unset {PLUGIN_VARIABLE}"
            ) from error
        _plugins_read.add(module)
    return _KINDS


def check_source(config) -> None:
    """Refuses, before TensorFlow is imported, a `config.dataset` that cannot load."""
    kind, argument = parse(config.dataset)
    if kind is not None and kind.scheme in _CHECKS:
        _CHECKS[kind.scheme](argument, config)


def scheme_names() -> list[str]:
    """The names of the built-in and registered kinds (not tfds's datasets)."""
    return [*BUILTIN_NAMES, *(scheme for scheme in kinds() if scheme != TFDS_SCHEME)]


def usages() -> str:
    """Every way to name a dataset, for messages."""
    return ", ".join([*BUILTIN_NAMES, *(kind.usage for kind in kinds().values())])


def parse(dataset: str) -> tuple[SourceKind | None, str]:
    """(the source kind, its argument) of a `--dataset` value; (None, name) for synthetic.

    Raises:
      ConfigError: when a `scheme:` that needs an argument has none.
    """
    if dataset in BUILTIN_NAMES:
        return None, dataset
    scheme, colon, argument = dataset.partition(":")
    kind = kinds().get(scheme)
    if kind is None or (colon and not kind.needs_argument):
        return _KINDS[TFDS_SCHEME], dataset
    if not kind.needs_argument:
        return kind, ""
    if not argument:
        raise ConfigError(f"--dataset={dataset} needs an argument: {kind.usage}")
    return kind, argument


def moved(dataset: str, data_dir: str | None) -> str:
    """`dataset` read from `data_dir` now, for a kind that takes a path: `data_dir` holds the
    data under its old name (csv:/new/tags.csv for csv:/old/tags.csv) or is it. Refuses
    (ConfigError) such data that is not where it was, when no `data_dir` says where."""
    kind, argument = parse(dataset)
    if kind is None or not kind.needs_argument or kind.scheme == TFDS_SCHEME:
        return dataset
    if data_dir is None:
        if not os.path.exists(argument):
            raise ConfigError(
                f"the run's data {argument} is not there any more: if it moved, pass "
                f"--data_dir=WHERE_IT_IS_NOW"
            )
        return dataset
    under_old_name = os.path.join(data_dir, os.path.basename(argument.rstrip("/")))
    path = under_old_name if os.path.exists(under_old_name) else data_dir
    return f"{kind.scheme}:{os.path.abspath(path)}"


def load_source(config):
    """The `Source` of `config.dataset` (None for synthetic data)."""
    kind, argument = parse(config.dataset)
    return None if kind is None else kind.load(argument, config)


def file_label(dataset: str) -> str:
    """A dataset name fit for a directory name: "folder:/data/x" -> "data_x"."""
    kind, argument = parse(dataset)
    text = argument if kind is not None and kind.needs_argument else dataset
    return text.strip("/").replace("/", "_").replace(":", "_") or "data"
