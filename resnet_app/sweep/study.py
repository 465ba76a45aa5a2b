"""A sweep's Optuna study: where it is stored, how trials are drawn and pruned.

The study lives in a database: by default SQLite in the sweep's directory (`study.db`), so
a killed sweep resumes where it stopped; any database URL Optuna takes lets sweeps on
several machines share one study. The study remembers what it searches (the space, the
base command line, the metric): a sweep naming it with another space is refused.
"""

from __future__ import annotations

import json
import os
import socket
import zlib
from collections.abc import Callable
from typing import Any

from resnet_app.common.errors import ConfigError, first_line

STUDY_FILE = "study.db"
SAMPLERS = ("tpe", "random", "grid")
FINGERPRINT = "resnet_app_sweep"  # What the study searches (a user attribute).
# Each trial's record in the study (user attributes).
RUN_DIR, HOST, ARGV, DEVICE, ERROR = "run_dir", "host", "argv", "device", "error"
STARTED, ENDED = "started", "ended"  # Unix times: its first start, its last end.


def _hyperband(prune_after: int, eval_every: int | None) -> Any:
    del prune_after  # Hyperband's brackets decide when a trial may be stopped.
    if not eval_every:
        raise ConfigError(
            "--pruner=hyperband counts its resource in training steps: give --eval_every=N "
            "(its smallest budget, one evaluation), or use --pruner=median"
        )
    return import_optuna().pruners.HyperbandPruner(min_resource=eval_every, max_resource="auto")


# Optuna's pruners, each made from (--prune_after, the run's train.eval_every).
PRUNERS: dict[str, Callable[[int, int | None], Any]] = {
    "median": lambda prune_after, _: import_optuna().pruners.MedianPruner(
        n_startup_trials=prune_after, n_warmup_steps=0
    ),
    "hyperband": _hyperband,
    "none": lambda *_: import_optuna().pruners.NopPruner(),
}


def import_optuna() -> Any:
    """Optuna, or one line saying how to install it."""
    try:
        import optuna
    except ImportError:
        raise ConfigError(
            "resnet-app sweep needs Optuna: pip install -r requirements-sweep.txt "
            "(or pip install 'resnet_app[sweep]')"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # The sweep says what happens.
    return optuna


def storage_url(study_dir: str, storage: str | None) -> str:
    """The database the study lives in (default: SQLite in the sweep's directory)."""
    if storage:
        return storage
    return "sqlite:///" + os.path.join(os.path.abspath(study_dir), STUDY_FILE)


def sampler_seed(name: str, seed: int, drawn: int, study_dir: str) -> int:
    """The seed a sweep gives its sampler: a grid's is `seed` (its trials take the points in
    the order the seed shuffles them); the others continue a study, and must not draw the
    same values again, so theirs also depends on the trials `drawn`, the machine and directory.
    """
    if name == "grid":
        return seed
    where = f"{socket.gethostname()}:{os.path.abspath(study_dir)}"
    return (seed + drawn + zlib.crc32(where.encode())) % (2**32)


def tell(study: Any, trial: Any, *args: Any, **kwargs: Any) -> None:
    """`study.tell`, without the grid sampler's `study.stop()` after its last point, which
    Optuna refuses outside `optimize` (the trial is told by then; the sweep stops itself)."""
    try:
        study.tell(trial, *args, **kwargs)
    except RuntimeError as error:
        if "Study.stop" not in str(error):
            raise


def make_sampler(name: str, seed: int, grid: dict[str, list[Any]] | None) -> Any:
    """Optuna's sampler `name`; `grid` is the grid sampler's {key: values}."""
    samplers = import_optuna().samplers
    if name == "grid":
        return samplers.GridSampler(grid, seed=seed)
    return {"random": samplers.RandomSampler, "tpe": samplers.TPESampler}[name](seed=seed)


def open_study(url: str, name: str, direction: str, pruner: Any) -> Any:
    """Creates the study (the sweep sets its sampler), or opens it; refuses a database that
    cannot be opened or holds the study in the other direction."""
    optuna = import_optuna()
    try:
        return optuna.create_study(
            storage=url, study_name=name, direction=direction, pruner=pruner, load_if_exists=True
        )
    except ValueError as error:  # e.g. a study of the same name in another direction.
        raise ConfigError(f"study {name!r} in {url}: {first_line(error)}") from None
    except Exception as error:  # SQLAlchemy's errors: a bad URL, a database not reached.
        raise ConfigError(
            f"cannot open the study database {url}: {first_line(error)}; give a database URL "
            "Optuna takes (--storage), or leave it out for SQLite in --study_dir"
        ) from None


def check_fingerprint(study: Any, name: str, fingerprint: dict[str, Any]) -> None:
    """Records what the study searches, or refuses a sweep that searches something else in
    it (another space, command line, metric or sampler)."""
    recorded = study.user_attrs.get(FINGERPRINT)
    expected = json.loads(json.dumps(fingerprint))
    if recorded is None:
        study.set_user_attr(FINGERPRINT, expected)
    elif recorded != expected:
        differs = sorted(k for k in {*recorded, *expected} if recorded.get(k) != expected.get(k))
        raise ConfigError(
            f"study {name!r} searched another sweep ({', '.join(differs)} differ); give a new "
            "--study_dir (or --study_name), or the same flags as before"
        )


def own_unfinished(study: Any, study_dir: str) -> list[Any]:
    """Trials this machine started in `study_dir` whose sweep stopped before they ended."""
    optuna = import_optuna()
    here = socket.gethostname()
    root = os.path.abspath(study_dir)
    found = []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        attrs = trial.user_attrs
        run = attrs.get(RUN_DIR, "")
        if attrs.get(HOST) == here and os.path.dirname(run) == root:
            found.append(trial)
    return found
