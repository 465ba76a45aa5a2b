"""Errors that are the user's to fix (one line, exit status 2: `common/cli.py`), not bugs."""

# Exit status of a worker that saved after losing a peer, or after a preemption
# notice: running the same command again resumes (`resnet_app.launch` restarts on it).
RESTART_STATUS = 3


class ConfigError(ValueError):
    """A bad model name, config key, flag value, path or file, with the fix."""


class WorkerLostError(ConfigError):
    """Another worker was lost or stalled; the survivors saved what they could."""

    exit_status = RESTART_STATUS


class PreemptedError(ConfigError):
    """The scheduler's preemption notice (SIGUSR1) came; the run saved its step."""

    exit_status = RESTART_STATUS


def first_line(error: BaseException, limit: int = 200, with_type: bool = False) -> str:
    """The first non-blank line of `error`'s message, at most `limit` characters, to quote
    inside a one-line error (its type's name if it has none; prefixed by it `with_type`)."""
    name = type(error).__name__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return name
    return f"{name}: {lines[0][:limit]}" if with_type else lines[0][:limit]
