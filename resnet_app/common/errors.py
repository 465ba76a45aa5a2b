"""Errors that are the user's to fix, as opposed to bugs.

Command-line entry points turn a `ConfigError` into a one-line message and exit
status 2 (see `cli.py`); anything else keeps its traceback, because it is ours.
"""


class ConfigError(ValueError):
    """A bad model name, config key, flag value, path or file, with the fix."""
