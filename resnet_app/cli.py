"""Command-line plumbing shared by every entry point.

A user's mistake (a bad flag, model name, config key or path) is answered with
one line on stderr and exit status 2, never a traceback. Anything else is a bug
of ours and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from absl import app, flags

from resnet_app.errors import ConfigError

USAGE_ERROR = 2


def fail(message: str) -> NoReturn:
    """Prints `message` as a one-line error and exits with status 2.

    Args:
      message: what is wrong and how to fix it, on one line.
    """
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    sys.exit(USAGE_ERROR)


def _parse_flags(argv: Sequence[str]) -> list[str]:
    try:
        return flags.FLAGS(list(argv))
    except flags.Error as error:
        fail(f"{error} (run with --help to list the flags)")


def run(main: Callable[[list[str]], None]) -> int:
    """Runs `main(argv)` under absl, turning user mistakes into one-line errors.

    Args:
      main: the command; it raises `ConfigError` for a user mistake.

    Returns:
      0 once `main` returns (absl exits on its own otherwise).
    """

    def guarded_main(argv: list[str]) -> None:
        try:
            main(argv)
        except ConfigError as error:
            fail(str(error))

    app.run(guarded_main, flags_parser=_parse_flags)
    return 0


def reject_positional(argv: Sequence[str]) -> None:
    """Refuses positional arguments, which usually mean a mistyped flag.

    Args:
      argv: what absl left after parsing the flags; argv[0] is the program.

    Raises:
      ConfigError: naming the unexpected arguments.
    """
    if len(argv) > 1:
        raise ConfigError(
            f"unexpected argument(s) {' '.join(argv[1:])}; flags look like --name=value"
        )
