"""The sweep: draws trials from the study, runs each as a training run, reports, prunes.

Every trial is `resnet-app train` with the sweep's training flags, a `--set KEY=VALUE` per
searched key and `--model_dir=STUDY_DIR/trial-NNNN`. Its evaluations, on the held-out
split carved from the training data (`data.validation_split`; never the test split), are
reported to the study as they are written, and the pruner may stop it after any of them.
Its value is its last evaluation's metric at its end, by the run's `train.best_metric`.
A stopped sweep leaves its trials running in the study; the same command on the same
machine resumes each from its last checkpoint (bitwise), then draws until the study
holds `--trials`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging

from resnet_app import config
from resnet_app.common import cli
from resnet_app.common.errors import ConfigError, first_line
from resnet_app.common.fields import check_declared, one_of, setting, whole_at_least
from resnet_app.sweep import report
from resnet_app.sweep import space as space_lib
from resnet_app.sweep import study as study_lib
from resnet_app.sweep.trial_run import TrialProcess

HOLDOUT = "holdout"  # data.sources.HOLDOUT_SPLIT, without loading the sources.
TRIAL_DIR = "trial-{:04d}"
# What decides how trials are scored: set once for the sweep, never searched.
SCORING_KEYS = frozenset(
    {"data.validation_split", "data.eval_split", "train.best_metric", "train.best_mode"}
)


@dataclasses.dataclass(frozen=True)
class SweepRequest:
    """What `resnet-app sweep` was asked for: each field is the command's flag of that name
    (`devices`: one trial per device at once, by CUDA_VISIBLE_DEVICES; `poll_seconds`: how
    often running trials' records are read)."""

    study_dir: str
    trials: int = setting(20, whole_at_least(1))
    sampler: str = setting("tpe", one_of(study_lib.SAMPLERS))
    pruner: str = setting("median", one_of(study_lib.PRUNERS))
    prune_after: int = setting(3, whole_at_least(0))
    parallel: int = setting(1, whole_at_least(1))
    devices: tuple[str, ...] = ()
    seed: int = setting(0, whole_at_least(0))
    storage: str | None = None
    study_name: str = "sweep"
    poll_seconds: float = 1.0

    def __post_init__(self):
        check_declared(self, "--{}")
        if self.devices and self.parallel not in (1, len(self.devices)):
            raise ConfigError(
                f"--parallel={self.parallel} with {len(self.devices)} --devices: one trial runs "
                "on each device at once; drop --parallel"
            )

    @property
    def slots(self) -> list[str | None]:
        """The device of each trial that may run at once (None: no device set)."""
        return list(self.devices) if self.devices else [None] * self.parallel


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every trial shares: its command line, the searched keys, how a config is resolved
    from `--set` assignments, and the metric."""

    base_argv: tuple[str, ...]
    space: tuple[space_lib.Param, ...]
    resolve: Callable[[Sequence[str]], config.Config]
    metric: str
    higher: bool
    eval_every: int | None

    @property
    def keys(self) -> list[str]:
        return [param.key for param in self.space]


def make_plan(
    base_argv: Sequence[str],
    space: Sequence[space_lib.Param],
    resolve: Callable[[Sequence[str]], config.Config],
    flag_keys: dict[str, str],
) -> Plan:
    """The `Plan`, after checking the base config, each searched key's ends and the split;
    `flag_keys` are {config key: flag} of the shortcut flags given (`--batch_size`...)."""
    base = resolve([])
    for param in space:
        if param.key in SCORING_KEYS:
            raise ConfigError(
                f"--param {param.key}: the sweep scores every trial alike (on the holdout split, "
                "by one metric); set it with --set, not as a searched key"
            )
        if param.key in flag_keys:
            raise ConfigError(
                f"--{flag_keys[param.key]} sets {param.key}, which the sweep searches; drop one"
            )
        for value in param.ends():
            try:
                resolve([space_lib.assignment(param.key, value)])
            except ConfigError as error:
                raise ConfigError(f"--param {param.key}={param.describe()}: {error}") from None
    check_scored_on_holdout(base)
    higher = base.train.best_direction == "max"
    train = base.train
    return Plan(tuple(base_argv), tuple(space), resolve, train.best_by, higher, train.eval_every)


def check_scored_on_holdout(resolved: config.Config) -> None:
    """Refuses a trial's config that would not be scored on held-out training examples."""
    data = resolved.data
    if data.validation_split <= 0 or (data.eval_split or HOLDOUT) != HOLDOUT:
        raise ConfigError(
            "a sweep scores trials on a validation split carved from the training data, never "
            f"the test split (here: {data.eval_split or 'the dataset own evaluation split'}): "
            "add --set data.validation_split=N (e.g. a tenth of the training examples)"
            + (" and drop data.eval_split" if data.eval_split not in (None, HOLDOUT) else "")
        )


class Sweep:
    """The sweep's loop over a study: draws, starts, watches and ends its trials."""

    def __init__(self, request: SweepRequest, plan: Plan):
        self.request, self.plan = request, plan
        self.optuna = study_lib.import_optuna()
        self.grid = space_lib.grid_space(plan.space) if request.sampler == "grid" else None
        self.limit = request.trials
        if self.grid is not None:
            self.limit = min(self.limit, math.prod(len(v) for v in self.grid.values()))
        os.makedirs(request.study_dir, exist_ok=True)
        fingerprint = {
            "space": {param.key: param.describe() for param in plan.space},
            "argv": list(plan.base_argv),
            "metric": plan.metric,
            "direction": "max" if plan.higher else "min",
            "sampler": request.sampler,
        }
        self.study = study_lib.open_study(
            study_lib.storage_url(request.study_dir, request.storage),
            request.study_name,
            "maximize" if plan.higher else "minimize",
            study_lib.PRUNERS[request.pruner](request.prune_after, plan.eval_every),
        )
        study_lib.check_fingerprint(self.study, request.study_name, fingerprint)
        drawn = len(self.study.trials)
        seed = study_lib.sampler_seed(request.sampler, request.seed, drawn, request.study_dir)
        self.study.sampler = study_lib.make_sampler(request.sampler, seed, self.grid)
        self.running: list[TrialProcess] = []
        self.reported: dict[int, set[int]] = {}
        self.stopping: list[int] = []
        self.refused: str | None = None  # A trial's usage error: every trial would meet it.

    def run(self) -> list[report.Row]:
        """Runs trials until the study holds `trials` (or a signal); returns the ranking."""
        waiting = self._unfinished()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while True:
                self._fill(waiting)
                if not self.running:
                    break
                time.sleep(self.request.poll_seconds)
                for process in list(self.running):
                    self._watch(process)
        finally:
            for process in self.running:
                process.kill()
            for number, handler in previous.items():
                signal.signal(number, handler)
        plan, study_dir = self.plan, self.request.study_dir
        ranked = report.write_all(
            self.study, study_dir, plan.keys, plan.metric, plan.higher, HOLDOUT
        )
        print(report.table(ranked, plan.keys, plan.metric), flush=True)
        if self.refused is not None:
            raise ConfigError(f"{self.refused}; the sweep stopped drawing trials")
        if not self.stopping and ranked and all(row.state == "FAIL" for row in ranked):
            raise ConfigError(
                f"no trial of the sweep finished: each failed (their error lines are in "
                f"{os.path.join(study_dir, report.SUMMARY_FILE)})"
            )
        return ranked

    def _on_signal(self, number: int, frame: Any) -> None:
        del frame
        self.stopping.append(number)
        for process in self.running:
            if len(self.stopping) == 1:
                process.stop()  # Each saves its step; the next sweep resumes it.
            else:
                process.stop(signal.SIGKILL)  # A second signal: at once, from the last checkpoint.

    def _unfinished(self) -> list[TrialProcess]:
        """This machine's trials left running by a sweep that stopped: resumed first."""
        found = []
        for frozen in study_lib.own_unfinished(self.study, self.request.study_dir):
            trial = self.optuna.trial.Trial(self.study, frozen._trial_id)
            attrs = frozen.user_attrs
            run, metric = attrs[study_lib.RUN_DIR], self.plan.metric
            found.append(TrialProcess(trial, attrs[study_lib.ARGV], run, None, metric, HOLDOUT))
            self.reported[frozen.number] = set(frozen.intermediate_values)
            logging.info("sweep: resuming trial %d in %s", frozen.number, attrs[study_lib.RUN_DIR])
        return found

    def _fill(self, waiting: list[TrialProcess]) -> None:
        """Starts trials on the free slots: those to resume first, then new ones."""
        free = list(self.request.slots)
        for process in self.running:
            free.remove(process.device)
        while free and not self.stopping and self.refused is None:
            if waiting:
                process = waiting.pop(0)
                process.device = free[0]
            elif len(self.study.trials) < self.limit:
                process = self._new_trial(free[0])
                if process is None:
                    continue  # Its config was refused: recorded as failed.
            else:
                return
            free.pop(0)
            process.start()
            if self.stopping:  # A signal came while it started: it missed the SIGTERM.
                process.stop()
            process.trial.set_user_attr(study_lib.DEVICE, process.device)
            if study_lib.STARTED not in process.trial.user_attrs:
                process.trial.set_user_attr(study_lib.STARTED, process.started)
            self.running.append(process)
            logging.info(
                "sweep: trial %d started in %s%s",
                process.number,
                process.run,
                "" if process.device is None else f" on device {process.device}",
            )

    def _new_trial(self, device: str | None) -> TrialProcess | None:
        trial = self.study.ask()
        grid = self.grid is not None
        values = {p.key: space_lib.suggest(trial, p, grid) for p in self.plan.space}
        run = os.path.join(os.path.abspath(self.request.study_dir), TRIAL_DIR.format(trial.number))
        sets = [space_lib.assignment(key, value) for key, value in values.items()]
        argv = [*self.plan.base_argv, *[f"--set={s}" for s in sets], f"--model_dir={run}"]
        trial.set_user_attr(study_lib.RUN_DIR, run)
        trial.set_user_attr(study_lib.HOST, socket.gethostname())
        trial.set_user_attr(study_lib.ARGV, argv)
        self.reported[trial.number] = set()
        try:  # A combination the config refuses fails here, in one line.
            check_scored_on_holdout(self.plan.resolve(sets))
        except ConfigError as error:
            self._fail(trial, f"refused: {first_line(error)}")
            return None
        return TrialProcess(trial, argv, run, device, self.plan.metric, HOLDOUT)

    def _watch(self, process: TrialProcess) -> None:
        """Reports its new evaluations, prunes it if the pruner says so, ends it if it ended."""
        trial, reported = process.trial, self.reported[process.number]
        for step, value in process.new_evaluations():
            if step in reported or not math.isfinite(value) or process.pruned_at is not None:
                continue
            trial.report(value, step)
            reported.add(step)
            if not self.stopping and trial.should_prune():
                process.pruned_at = step
                logging.info(
                    "sweep: trial %d pruned after step %d (%s %.4f)",
                    process.number,
                    step,
                    self.plan.metric,
                    value,
                )
                process.stop()
        status = process.poll()
        if status is None:
            return
        self.running.remove(process)
        trial.set_user_attr(study_lib.ENDED, process.ended)
        self._end(process, status)

    def _end(self, process: TrialProcess, status: int) -> None:
        trial, states = process.trial, self.optuna.trial.TrialState
        value = process.final_value() if status == 0 else None
        if value is not None:  # It ran to its end (perhaps before a prune reached it).
            study_lib.tell(self.study, trial, value)
            logging.info(
                "sweep: trial %d finished: %s %.4f", process.number, self.plan.metric, value
            )
        elif process.pruned_at is not None:
            study_lib.tell(self.study, trial, state=states.PRUNED)
        elif self.stopping:
            logging.info(
                "sweep: trial %d stopped with the sweep; the same command resumes it",
                process.number,
            )
        else:
            error = process.error_line() if status else "stopped before its end"
            self._fail(trial, error)
            # Refused before training started (the data, init_from, the run directory): every
            # trial would be. A diverged or out-of-memory trial is this trial's own.
            if status == cli.USAGE_ERROR and not process.started_training() and not self.refused:
                self.refused = f"trial {process.number} ({process.run}) was refused: {error}"

    def _fail(self, trial: Any, error: str) -> None:
        trial.set_user_attr(study_lib.ERROR, error)
        study_lib.tell(self.study, trial, state=self.optuna.trial.TrialState.FAIL)
        logging.warning("sweep: trial %d failed: %s", trial.number, error)
