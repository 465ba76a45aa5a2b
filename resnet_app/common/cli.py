"""Command-line plumbing: a user's mistake is one line on stderr and status 2, not a traceback."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import app, flags, logging

from resnet_app.common import run_dir, startup_noise
from resnet_app.common.errors import ConfigError, WorkerLostError
from resnet_app.common.fields import FieldType, field_types

USAGE_ERROR = 2


def fail(message: str, status: int = USAGE_ERROR, at_once: bool = False) -> NoReturn:
    """Prints `message` as a one-line error and exits with `status`; `at_once` skips the
    teardown (a lost worker's survivor: its collectives are aborted, its files written)."""
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    if at_once:
        with contextlib.suppress(OSError):  # A closed pipe must not stop the exit.
            logging.flush()
            sys.stdout.flush()
        os._exit(status)
    sys.exit(status)


_HELP_FLAGS = ("-?", "-h", "--help", "--helpshort", "--helpfull", "--helpxml")


def _parse_flags(argv: Sequence[str]) -> list[str]:
    try:
        rest = flags.FLAGS(list(argv))
    except flags.Error as error:
        fail(f"{error} (run with --help to list the flags)")
    except SystemExit as done:
        # absl exits with status 1 after printing the help; asking for it is no failure.
        if done.code == 1 and any(arg.split("=")[0] in _HELP_FLAGS for arg in argv[1:]):
            sys.exit(0)
        raise
    # Before any command imports TensorFlow; --verbosity=1 shows its start-up lines.
    startup_noise.install(show_all=flags.FLAGS.verbosity >= 1)
    return rest


def run(main: Callable[[list[str]], None]) -> NoReturn:
    """Runs `main(argv)` under absl; a `ConfigError` exits with one line, status 2."""
    try:
        app.run(main, flags_parser=_parse_flags)
    except ConfigError as error:
        status = getattr(error, "exit_status", USAGE_ERROR)
        fail(str(error), status, at_once=isinstance(error, WorkerLostError))
    except BrokenPipeError:
        # The reader went away (`--help | head`): no traceback, and none at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def reject_positional(argv: Sequence[str]) -> None:
    """Refuses positional arguments (what absl left after argv[0]): usually a mistyped flag."""
    if len(argv) > 1:
        raise ConfigError(
            f"unexpected argument(s) {' '.join(argv[1:])}; flags look like --name=value"
        )


def flag_values(*names: str) -> dict[str, Any]:
    """{name: the value of --name}: a command's flags as keyword arguments."""
    return {name: flags.FLAGS[name].value for name in names}


def print_record(record: dict) -> None:
    """One line of JSON on stdout, at once: a command's record of one checkpoint."""
    from resnet_app.common.metrics import json_text  # TensorFlow is loaded by now.

    sys.stdout.write(json_text(record) + "\n")
    sys.stdout.flush()


def use_matplotlib(command: str) -> None:
    """Selects matplotlib's Agg backend (files, no display); a ConfigError without it."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(
            f"resnet-app {command} draws with matplotlib: pip install -r requirements-plot.txt"
        ) from None
    matplotlib.use("Agg")


def define_weights_flag() -> flags.FlagHolder:
    """--weights: which weights of a training checkpoint a command restores."""
    return flags.DEFINE_enum(
        "weights",
        "auto",
        list(run_dir.WEIGHTS),
        "Which weights of the checkpoint: ema (the average kept by train.ema_decay or "
        "train.swa_start), raw (the trained weights), or auto (the average when the run kept one).",
    )


def define_checkpoint_flags() -> None:
    """The flags of a command that evaluates a run's checkpoints (evaluate, report)."""
    flags.DEFINE_string(
        "model_dir", None, "The run directory written by `python -m resnet_app.train`."
    )
    flags.DEFINE_string(
        "checkpoint",
        "latest",
        "Which checkpoint(s): latest (the newest readable one), all, best (the best evaluation, "
        "kept in MODEL_DIR/best/ by train.keep_best), averaged (resnet-app average's), ckpt-N "
        "or N.",
    )
    flags.DEFINE_string(
        "split", None, "The split to evaluate (default: the run's evaluation split)."
    )
    flags.DEFINE_integer(
        "batch_size",
        None,
        "Global evaluation batch (default: the run's train.eval_batch_size, else "
        "train.batch_size).",
    )
    flags.DEFINE_integer(
        "num_towers", None, "Towers to evaluate on (default: every GPU, or the one CPU)."
    )
    flags.DEFINE_string(
        "data_dir",
        None,
        "Where the run's data is now, if it moved: the directory of a tfds, shapes or CIFAR "
        "dataset (default: the run's data.data_dir), or for a path dataset (idx:DIR, "
        "folder:PATH, csv:FILE, ...) the new path, or the directory holding it under its old name.",
    )
    flags.DEFINE_string(
        "report_dir",
        None,
        "Where the reports go: one directory <checkpoint>-<split> per checkpoint, holding "
        "eval_results.json, confusion_matrix.png and reliability.png (default: "
        "MODEL_DIR/reports).",
    )
    define_weights_flag()


def attribute_help(cls: type) -> dict[str, str]:
    """The "Attributes:" section of a class docstring, as {name: one-line help}."""
    lines = (cls.__doc__ or "").split("Attributes:", 1)[-1].splitlines()
    # Names sit at the section's least indentation, wherever the class is defined.
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    help_text: dict[str, list[str]] = {}
    current = None
    for line in lines:
        stripped = line.strip()
        name, colon, rest = stripped.partition(":")
        if colon and name.isidentifier() and len(line) - len(line.lstrip()) == indent:
            current = name
            help_text[current] = [rest.strip()]
        elif current and stripped:
            help_text[current].append(stripped)
    return {name: " ".join(parts) for name, parts in help_text.items()}


def define_config_flags(cls: type, module_name: str | None = None) -> None:
    """One flag per field of dataclass `cls` (nested too), its "Attributes:" line as help;
    `module_name`: where --help lists them."""
    help_text = attribute_help(cls)
    types = field_types(cls)
    for field in dataclasses.fields(cls):
        if types[field.name].nested:  # A group of settings: its fields are flags too.
            define_config_flags(types[field.name].base, module_name)
            continue
        if field.name in flags.FLAGS:
            continue
        text = help_text.get(field.name, field.name)
        define_flag(field.name, types[field.name], field.default, text, module_name)


def define_flag(
    name: str, kind: FieldType, default: Any, help_text: str, module_name: str | None = None
) -> None:
    """Defines `--name` of a config field's type (a tuple: a comma-separated list; None: unset)."""
    key_flags = {"module_name": module_name} if module_name else {}
    if kind.base is tuple:
        value = None if default is None else [str(v) for v in default]
        flags.DEFINE_list(name, value, help_text, **key_flags)
        return
    define = {bool: flags.DEFINE_boolean, int: flags.DEFINE_integer, float: flags.DEFINE_float}
    define.get(kind.base, flags.DEFINE_string)(name, default, help_text, **key_flags)


def config_from_flags(cls: type) -> Any:
    """Dataclass `cls` from the flags `define_config_flags` defined (ConfigError for bad values)."""
    values = {}
    types = field_types(cls)
    for field in dataclasses.fields(cls):
        if types[field.name].nested:
            values[field.name] = config_from_flags(types[field.name].base)
            continue
        value = flags.FLAGS[field.name].value
        if isinstance(value, list):
            try:
                value = tuple(float(item) for item in value)
            except ValueError:
                raise ConfigError(
                    f"--{field.name}={','.join(value)}: expected comma-separated numbers"
                ) from None
        values[field.name] = value
    return cls(**values)
