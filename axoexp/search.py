"""An Optuna search over any config keys (``hydra/sweeper=optuna``), on Optuna 4 or later.

The sweeper plugin (``hydra_plugins/axoexp_optuna_sweeper``) is a facade; the work is here.
Each trial is one job of the sweep: the sampler's values become overrides of the job, with
``sweep.trial=<number>``, and the launcher runs the batch (``n_jobs`` trials at once, so
``hydra/launcher=parallel`` runs them in parallel under device leases). Each job is a child
run of the sweep's parent (:class:`axoexp.sweep.MlflowSweepCallback`); the search reads the
objectives from that run's logged metrics, tags the run with its trial number, state and
sampled values, and tells Optuna. A run that did not finish (FAILED, KILLED, refused), lacks
an objective, or was timed under contention (``timing.contention`` not none, unless
``contended=keep``) is told to Optuna as FAIL, never as a value.

The study lives in an Optuna RDB store, by default ``optuna.db`` beside the MLflow sqlite
store, under a name derived from what the search measures (the fixed overrides, the search
space, the objectives), so rerunning the same command resumes it: ``n_trials`` is the
study's total, and a rerun runs only the trials still missing.

Before the sweep's parent run exists, :func:`check_sweeper` refuses a search that cannot work: bad
settings, a search space it cannot search or that holds configs planning refuses, and an objective
no run can log.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.utils import JobReturn, JobStatus
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from axoexp import names, signals
from axoexp.config import OBJECTIVES, did_you_mean, one_line
from axoexp.errors import ConfigError, SearchError, SweepRefusedError
from axoexp.plan import plan_experiment
from axoexp.registry import BUILTIN
from axoexp.stdout import plural, print_out
from axoexp.sweep_plan import PLANNING_ERRORS, job_composer, jobs_run_here
from axoexp.tracking import UNREACHABLE, configure_tracking, flatten, open_client, sqlite_path, store_unreachable

SAMPLERS = ("tpe", "nsga2", "random")
DIRECTIONS = ("minimize", "maximize")
CONTENDED = ("fail", "keep")
STUDY_FILE = "optuna.db"
PARENT_KEY = "sweep.parent_run_id"
DONE = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
FAIL_KIND = "axoexp_fail"
"""A FAIL trial's user attribute: why it told no value, one of :data:`FAIL_KINDS`."""
FAIL_KINDS = {"contended": "timing contended", "failed": "failed", "stopped": "stopped"}
"""Each FAIL kind and how the search's summary counts it."""
OBJECTIVES_ATTR = "axoexp_objectives"
"""The study's user attribute: its objective metrics in order, so a rerun under its name cannot mix in others."""
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchSpace:
    """The overrides every trial gets, and the distribution of each searched key."""

    fixed: list[str]
    distributions: dict[str, BaseDistribution]


def _distribution(override: Override) -> BaseDistribution:
    """choice(...) -> categorical; range(a, b, s) -> int (or stepped float); interval(a, b) -> float,
    ``tag(log, ...)`` on a log scale, ``tag(int, interval(...))`` integer."""
    sweep = override.value()
    key = override.get_key_element()
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution(list(sweep.list))  # type: ignore[arg-type]  # parsed scalars
    if isinstance(sweep, RangeSweep):
        assert sweep.start is not None and sweep.stop is not None and sweep.step is not None
        if sweep.step == 0:
            raise ConfigError(f"{key}=range({sweep.start}, {sweep.stop}, 0): the step must not be 0")
        values = [
            sweep.start + index * sweep.step for index in range(math.ceil((sweep.stop - sweep.start) / sweep.step))
        ]  # a negative step counts down, as Hydra's range does
        if not values:
            raise ConfigError(
                f"{key}=range({sweep.start}, {sweep.stop}, {sweep.step}): an empty range; "
                "give start < stop (start > stop with a negative step)"
            )
        low, high, step = min(values), max(values), abs(sweep.step)
        if all(isinstance(value, int) for value in (sweep.start, sweep.stop, sweep.step)):
            return IntDistribution(int(low), int(high), step=int(step))
        return FloatDistribution(low, high, step=step)
    if isinstance(sweep, IntervalSweep):
        assert sweep.start is not None and sweep.end is not None
        log_scale = "log" in sweep.tags
        if not sweep.start < sweep.end or (log_scale and sweep.start <= 0):
            raise ConfigError(
                f"{key}=interval({sweep.start}, {sweep.end}): need start < end (and start > 0 on a log scale)"
            )
        if "int" in sweep.tags:  # the integers inside the interval
            low, high = math.ceil(sweep.start), math.floor(sweep.end)
            if low > high:
                raise ConfigError(f"{key}=interval({sweep.start}, {sweep.end}): no integer lies inside it")
            return IntDistribution(low, high, log=log_scale)
        return FloatDistribution(sweep.start, sweep.end, log=log_scale)
    raise ConfigError(
        f"{key}: an unsupported sweep; valid: choice(...), range(...), interval(...), tag(log, interval(...))"
    )


def search_space(arguments: Sequence[str], params: dict[str, str]) -> SearchSpace:
    """Sweeps among the command's overrides and in ``hydra.sweeper.params`` are searched; the
    other overrides are fixed for every trial."""
    parser = OverridesParser.create()
    fixed, distributions = [], {}
    for override in parser.parse_overrides([*arguments, *(f"{key}={value}" for key, value in params.items())]):
        key = override.get_key_element()
        if not override.is_sweep_override():
            fixed.append(override.input_line or key)  # as given: +key=..., ~key, quoting
            continue
        if key.lstrip("+~") == "sweep.repeat":
            raise ConfigError("sweep.repeats: repeats are not supported with hydra/sweeper=optuna; leave it at 1")
        distributions[key] = _distribution(override)
    if not distributions:
        raise ConfigError(
            "hydra.sweeper.params: nothing to search; sweep a key, e.g. 'optimizer.lr=tag(log,interval(1e-4,1e-1))' "
            "or gradient_transform=none,clip_norm"
        )
    return SearchSpace(fixed, distributions)


def check_settings(objectives: dict[str, str], sampler: str, contended: str, n_trials: int, n_jobs: int) -> None:
    """Every problem of the sweeper's own settings in one error (key, value, valid choices)."""
    problems = [
        f"{OBJECTIVES}.{metric}={direction}{did_you_mean(direction, DIRECTIONS)}: "
        f"valid directions: {', '.join(DIRECTIONS)}"
        for metric, direction in objectives.items()
        if direction not in DIRECTIONS
    ]
    if not objectives:
        problems.append(f"{OBJECTIVES}: empty; give e.g. {{loss_final: minimize, update_ms_median: minimize}}")
    if sampler not in SAMPLERS:
        problems.append(f"hydra.sweeper.sampler={sampler}: valid samplers: {', '.join(SAMPLERS)}")
    if contended not in CONTENDED:
        problems.append(f"hydra.sweeper.contended={contended}: valid: {', '.join(CONTENDED)}")
    problems += [
        f"hydra.sweeper.{key}={value}: must be at least 1"
        for key, value in (("n_trials", n_trials), ("n_jobs", n_jobs))
        if value < 1
    ]
    if problems:
        raise ConfigError("; ".join(problems))


def check_objectives(objectives: Sequence[str], plugin_executors: Sequence[str]) -> None:
    """Refuse objective metrics no run of the search can log, with a did-you-mean. An executor from a
    plugin may log metrics of any name (``Executor.prepared_metrics``), so where the search may pick
    one (``plugin_executors``), a metric axoexp does not know is let through: it is not certainly wrong."""
    if plugin_executors:
        return
    known = names.fixed_metrics()
    problems = [
        f"{OBJECTIVES}.{metric}: no run logs such a metric{did_you_mean(metric, known)}; "
        f"valid: {', '.join(known)}, and any {', '.join(f'{family}...' for family in names.METRIC_FAMILIES)} "
        f"or ...{names.DURATION_SUFFIX} one a run logs"
        for metric in objectives
        if not names.may_be_logged(metric)
    ]
    if problems:
        raise ConfigError("; ".join(problems))


def _axis(distribution: BaseDistribution) -> list[Any]:
    """A searched key's values that planning sees: its choices, or its range's low and high ends."""
    if isinstance(distribution, CategoricalDistribution):
        return list(distribution.choices)
    assert isinstance(distribution, FloatDistribution | IntDistribution)
    return [distribution.low, distribution.high]


def _points(space: SearchSpace) -> list[dict[str, Any]]:
    """Points of the search space that planning sees: each searched key at its first value (a range's
    low end, the first choice), then each key in turn at each of its other values (the high end, the
    other choices), the others at their first."""
    values = {key: _axis(distribution) for key, distribution in space.distributions.items()}
    base = {key: choices[0] for key, choices in values.items()}
    return [base, *({**base, key: value} for key, choices in values.items() for value in choices[1:])]


def _point_overrides(space: SearchSpace, point: dict[str, Any]) -> list[str]:
    """A trial's overrides at ``point``: the fixed ones and the searched keys' values."""
    return [*space.fixed, *(f"{key}={value}" for key, value in point.items())]


def plan_points(config: DictConfig, space: SearchSpace) -> list[str]:
    """Compose and plan the trial at each of :func:`_points`, as the basic sweeper's jobs are planned
    (:func:`axoexp.sweep_plan.plan_jobs`), and return the executors from plugins that planning chose;
    raise :class:`ConfigError` naming each refused point (once per reason): the sampler may draw any
    of them, and a trial there would fail."""
    compose, here = job_composer(config), jobs_run_here(config)
    refused: dict[str, str] = {}
    plugins: set[str] = set()
    for point in _points(space):
        try:
            plan = plan_experiment(compose(_point_overrides(space, point)), here=here)
        except PLANNING_ERRORS as error:
            reason = one_line(error)
            refused.setdefault(reason, f"{' '.join(f'{key}={value}' for key, value in point.items())}: {reason}")
            continue
        executor = plan.components["executor"]
        if executor.source != BUILTIN:
            plugins.add(executor.name)
    if refused:
        raise ConfigError(
            "the search space holds configs planning refuses, where its trials would fail: "
            f"{'; '.join(refused.values())}; narrow the ranges or drop those choices"
        )
    return sorted(plugins)


def settings_of(settings: DictConfig) -> tuple[dict[str, str], dict[str, str]]:
    """The sweeper's objectives (metric -> direction) and its params, flattened: ``{optimizer.lr: ...}``
    also where given nested, ``{optimizer: {lr: ...}}``."""
    objectives = OmegaConf.to_container(settings.objectives, resolve=True)
    params = flatten(OmegaConf.to_container(settings.params, resolve=True) or {})  # type: ignore[arg-type]
    return dict(objectives), params  # type: ignore[arg-type]


def check_sweeper(config: DictConfig) -> None:
    """Refuse, before the sweep's parent run exists, a search that cannot work, as
    :class:`SweepRefusedError`: its settings (:func:`check_settings`), its search space
    (:func:`search_space`), configs planning refuses in it (:func:`plan_points`) and objectives no
    run of it can log (:func:`check_objectives`)."""
    settings = config.hydra.sweeper
    objectives, params = settings_of(settings)
    try:
        check_settings(objectives, settings.sampler, settings.contended, settings.n_trials, settings.n_jobs)
        space = search_space(list(config.hydra.overrides.task), params)
        check_objectives(list(objectives), plan_points(config, space))
    except ConfigError as error:
        raise SweepRefusedError(str(error)) from None


def study_storage(configured: str | None, tracking_uri: str) -> str:
    """The configured RDB URL, else ``optuna.db`` beside the MLflow sqlite store (else in the cwd)."""
    if configured:
        return configured
    store = sqlite_path(tracking_uri)
    directory = store.parent if store is not None else Path(".")
    return f"sqlite:///{(directory / STUDY_FILE).resolve()}"


def study_name(configured: str | None, space: SearchSpace, objectives: dict[str, str]) -> str:
    """The configured name, else ``axoexp-<hash>`` of what the search measures, bookkeeping overrides
    (``tracking.*``, ``sweep.*``, ``run.progress``) left out: the same command finds the same study."""
    if configured:
        return configured
    fixed = sorted(o for o in space.fixed if not names.is_bookkeeping(o))
    searched = {key: repr(distribution) for key, distribution in sorted(space.distributions.items())}
    definition = json.dumps([fixed, searched, list(objectives.items())])
    return f"axoexp-{hashlib.sha256(definition.encode()).hexdigest()[:12]}"


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """A seeded sampler: TPE (multi-objective too), NSGA-II or random."""
    kinds: dict[str, Callable[..., optuna.samplers.BaseSampler]] = {
        "tpe": optuna.samplers.TPESampler,
        "nsga2": optuna.samplers.NSGAIISampler,
        "random": optuna.samplers.RandomSampler,
    }
    return kinds[name](seed=seed)


@dataclass(frozen=True)
class Outcome:
    """What a trial tells Optuna: its objective values, or ``None`` (FAIL) and why."""

    values: list[float] | None
    reason: str = ""
    disturbed: bool = False  # FAIL because the timing was contended, not because the run failed


def trial_outcome(run: Run | None, objectives: dict[str, str], contended: str) -> Outcome:
    """The objective values of the trial's run, or FAIL: no run, a run that did not finish, no
    finite objective metric, or (with ``contended=fail``) a timing under contention."""
    if run is None:
        return Outcome(None, "the job made no run (refused, or the tracking store was unreachable)")
    if run.info.status != "FINISHED":
        return Outcome(None, f"its run ended {run.info.status}: {run.data.tags.get(names.FAILURE, '')}".rstrip(": "))
    contention = run.data.tags.get(names.TIMING_CONTENTION, "none")
    if contention != "none" and contended == "fail":
        reason = f"timing.contention={contention}: the timing was disturbed (hydra.sweeper.contended=keep accepts it)"
        return Outcome(None, reason, disturbed=True)
    values = [run.data.metrics.get(metric, math.nan) for metric in objectives]
    missing = [metric for metric, value in zip(objectives, values, strict=True) if not math.isfinite(value)]
    if missing:
        valid = ", ".join(sorted(run.data.metrics))
        return Outcome(None, f"no finite {', '.join(missing)} in its run; valid metrics: {valid}")
    return Outcome(values)


class Search:
    """One invocation of the search: load or create the study, run the missing trials, report."""

    def __init__(self, settings: DictConfig, config: DictConfig, launch: Callable[..., Sequence[JobReturn]]) -> None:
        self.objectives, self.params = settings_of(settings)
        check_settings(self.objectives, settings.sampler, settings.contended, settings.n_trials, settings.n_jobs)
        self.settings = settings
        self.config = config
        self.launch = launch
        self.tracking_uri = configure_tracking(config.tracking)

    def run(self, arguments: Sequence[str]) -> list[JobReturn]:
        space = search_space(arguments, self.params)
        parent_id = next((o.partition("=")[2] for o in space.fixed if o.startswith(f"{PARENT_KEY}=")), None)
        storage = study_storage(self.settings.storage, self.tracking_uri)
        name = study_name(self.settings.study_name, space, self.objectives)
        directions = [optuna.study.StudyDirection[direction.upper()] for direction in self.objectives.values()]
        study = optuna.create_study(storage=storage, study_name=name, directions=directions, load_if_exists=True)
        if list(study.directions) != directions:
            raise ConfigError(f"hydra.sweeper.study_name={name}: the stored study has other objective directions")
        metrics = list(self.objectives)
        stored = study.user_attrs.get(OBJECTIVES_ATTR)
        if stored is None:  # a new study (or one from before the attribute)
            study.set_user_attr(OBJECTIVES_ATTR, metrics)
        elif stored != metrics:
            raise ConfigError(
                f"hydra.sweeper.study_name={name}: the stored study's objectives are {', '.join(stored)}, "
                f"not {', '.join(metrics)}; name another study or give the same objectives"
            )
        for stale in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            study.tell(stale.number, state=TrialState.FAIL)  # left by an interrupted search
        done = len(study.get_trials(deepcopy=False, states=DONE))
        # seeded by how far the study is, so a resumed study does not redraw its first trials
        study.sampler = make_sampler(self.settings.sampler, int(self.settings.seed) + done)
        client = self._client(
            parent_id,
            {
                names.STUDY: name,
                names.STUDY_STORAGE: storage,
                names.STUDY_OBJECTIVES: ",".join(
                    f"{metric}:{direction}" for metric, direction in self.objectives.items()
                ),
            },
        )
        log.info("Optuna study %s in %s: %d of %d trials done", name, storage, done, self.settings.n_trials)
        results: list[JobReturn] = []
        failed = []
        while done < self.settings.n_trials and not signals.received():
            trials = [
                study.ask(space.distributions) for _ in range(min(self.settings.n_jobs, self.settings.n_trials - done))
            ]
            batch = [
                [*_point_overrides(space, trial.params), f"{names.SWEEP_TRIAL_PARAM}={trial.number}"]
                for trial in trials
            ]
            try:
                returns = self.launch(batch, initial_job_idx=trials[0].number)
            except BaseException as error:  # a stop signal (Interrupted) or a launcher's failure: no value counts
                for trial in trials:
                    trial.set_user_attr(FAIL_KIND, "stopped")
                    study.tell(trial, state=TrialState.FAIL)
                    stopped = Outcome(None, f"the search was stopped: {signals.received() or repr(error)}")
                    self._tag_trial(client, self._trial_run(client, parent_id, trial.number), parent_id, trial, stopped)
                raise
            results.extend(returns)
            for trial, job in zip(trials, returns, strict=True):
                run = self._trial_run(client, parent_id, trial.number)
                outcome = trial_outcome(run, self.objectives, self.settings.contended)
                if job.status == JobStatus.FAILED and outcome.values is not None:
                    outcome = Outcome(None, f"the job failed: {getattr(job, '_return_value', '')}")
                state = TrialState.COMPLETE if outcome.values is not None else TrialState.FAIL
                if outcome.values is None:
                    trial.set_user_attr(FAIL_KIND, "contended" if outcome.disturbed else "failed")
                study.tell(trial, outcome.values, state=state)
                self._tag_trial(client, run, parent_id, trial, outcome)
                if outcome.values is None:
                    log.warning("trial %d told to Optuna as FAIL: %s", trial.number, outcome.reason)
                    if not outcome.disturbed:
                        failed.append(trial.number)
            done += len(trials)
        self._summary(study)
        if failed:
            raise SearchError(
                f"{plural(len(failed), 'trial')} failed (trials {', '.join(map(str, failed))}), told to Optuna as "
                f"FAIL; the study {name} counts them among its hydra.sweeper.n_trials"
            )
        return results

    def _client(self, parent_id: str | None, parent_tags: dict[str, str]) -> MlflowClient | None:
        try:
            client = open_client(self.tracking_uri)
            if parent_id:
                for key, value in parent_tags.items():
                    client.set_tag(parent_id, key, value)
        except UNREACHABLE as error:
            log.error("%s; every trial will be told FAIL", store_unreachable(self.tracking_uri, error))
            return None
        return client

    def _trial_run(self, client: MlflowClient | None, parent_id: str | None, number: int) -> Run | None:
        """The trial's child run, or the earlier run its job reused (tag ``axoexp.reused.jobN`` on the parent)."""
        if client is None or parent_id is None:
            return None
        try:
            parent = client.get_run(parent_id)
            runs = client.search_runs(
                [parent.info.experiment_id],
                filter_string=(
                    f"params.`{names.SWEEP_TRIAL_PARAM}` = '{number}' and tags.`{names.PARENT_RUN_ID}` = '{parent_id}'"
                ),
            )
            if runs:
                return runs[0]
            reused = parent.data.tags.get(f"{names.REUSED_PREFIX}job{number}")
            return client.get_run(reused) if reused else None
        except UNREACHABLE as error:
            log.error("could not read trial %d's run: %s", number, error)
            return None

    def _tag_trial(
        self,
        client: MlflowClient | None,
        run: Run | None,
        parent_id: str | None,
        trial: optuna.trial.Trial,
        outcome: Outcome,
    ) -> None:
        """Trial number, what Optuna was told and the sampled values, on the trial's own child run."""
        if client is None or run is None or run.data.tags.get(names.PARENT_RUN_ID) != parent_id:
            return
        tags = {
            names.TRIAL: str(trial.number),
            names.TRIAL_STATE: "COMPLETE" if outcome.values is not None else "FAIL",
            **{names.trial_param_tag(key): str(value) for key, value in trial.params.items()},
        }
        if outcome.reason:
            tags[names.TRIAL_FAILURE] = outcome.reason
        try:
            for key, value in tags.items():
                client.set_tag(run.info.run_id, key, value)
        except UNREACHABLE as error:
            log.error("could not tag trial %d's run: %s", trial.number, error)

    def _summary(self, study: optuna.Study) -> None:
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        fails = Counter(
            trial.user_attrs.get(FAIL_KIND, "failed")
            for trial in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        )
        counts = [
            f"{len(complete)} complete",
            *(f"{fails[kind]} {shown}" for kind, shown in FAIL_KINDS.items() if fails[kind]),
        ]
        print_out(f"study {study.study_name}: {len(study.trials)} trials, {', '.join(counts)}")
        if not complete:
            return
        for trial in sorted(study.best_trials, key=lambda trial: trial.number):
            values = ", ".join(
                f"{metric}={value:.4g}" for metric, value in zip(self.objectives, trial.values, strict=True)
            )
            print_out(f"  best: trial {trial.number}: {values}  {_params_text(trial.params)}")


def _params_text(params: dict[str, Any]) -> str:
    return " ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in params.items()
    )
