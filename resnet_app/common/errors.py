"""Errors that are the user's to fix, as opposed to bugs.

Command-line entry points turn a `ConfigError` into a one-line message and exit
status 2 (see `common/cli.py`); anything else keeps its traceback, because it is ours.
`first_line` shortens a library's error to quote it inside such a message.
"""

# Long enough for a path and a reason; TensorFlow's first lines can run on.
FIRST_LINE_LIMIT = 200
# The exit status of a worker that lost a peer and saved the last step: a
# restart of the job resumes from it (`resnet_app.launch` restarts on it).
RESTART_STATUS = 3


class ConfigError(ValueError):
    """A bad model name, config key, flag value, path or file, with the fix."""


class WorkerLostError(ConfigError):
    """Another worker of the job was lost or stalled; the survivors saved what they could.

    One line too, but exit status `RESTART_STATUS`: nothing is wrong with the
    command, and running it again (on every worker) resumes the run.
    """

    exit_status = RESTART_STATUS


class PreemptedError(ConfigError):
    """The scheduler's preemption notice (SIGUSR1) came; the run saved its step.

    One line and exit status `RESTART_STATUS`, as for a lost worker: the job's
    requeue runs the same command, which resumes from the checkpoint.
    """

    exit_status = RESTART_STATUS


def first_line(error: BaseException, limit: int = FIRST_LINE_LIMIT, with_type: bool = False) -> str:
    """The first non-blank line of `error`'s message (its type's name if it has none).

    Args:
      error: any exception, e.g. a TensorFlow error with a multi-line message.
      limit: at most this many characters of the message are kept.
      with_type: prefix the type's name ("KeyError: 'x'").

    Returns:
      One line, to quote inside a one-line error.
    """
    name = type(error).__name__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return name
    return f"{name}: {lines[0][:limit]}" if with_type else lines[0][:limit]
