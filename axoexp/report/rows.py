"""A sweep's runs as report rows: one per config and executor, repeats pooled, speedups over eager."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.registry import GROUPS
from axoexp.statistics import MIN_RUNS, LatencySummary, doubts, median_ratio_interval, timing_doubts, timing_labels
from axoexp.tracking import child_runs

EXECUTOR_KEY = f"{names.EXECUTOR_PARAM_PREFIX}name"
POPULATION_PREFIX = "population."
LENGTHS_KEY = f"{POPULATION_PREFIX}lengths"
BASELINE = "eager"


@dataclass(frozen=True)
class BucketRow:
    """A row's measured updates whose batches fell in one length bucket (runs with ``population.lengths``)."""

    bucket: int  # the length its batches were padded to; where nothing is padded, their exact length
    count: int  # measured updates in it (summed over the row's runs)
    median_ms: float  # the median over the row's runs of each run's bucket_<N>_update_ms_<stat>
    p10_ms: float = math.nan
    p90_ms: float = math.nan


@dataclass(frozen=True)
class ReportRow:
    shape: str
    executor: str
    status: str
    median_ms: float
    capture_ms: float
    speedup_vs_eager: float
    run_id: str
    job: str
    p10_ms: float = math.nan
    p90_ms: float = math.nan
    reused: bool = False  # an earlier sweep's run that this sweep's job reused
    settings: tuple[tuple[str, str], ...] = ()  # the swept settings other than executor: (label, value)
    speedup_low: float | None = None  # 95% bootstrap interval of speedup_vs_eager, where the series of 2+ runs
    # per side are known (an eager row against itself: none)
    speedup_high: float | None = None  # (statistics.median_ratio_interval)
    repeats: int = 1  # FINISHED runs of the same config pooled into this row (sweep.repeats)
    run_ids: tuple[str, ...] = ()
    contention: str = ""  # timing.contention of its runs (timing_labels): none, or what disturbed them (cpu,
    # gpu-shared, ...) and "not recorded" where a run lacks the tag
    noise: str = ""  # timing.noise of its runs: low, or high where any run's was, else not recorded where one lacks it
    lengths: str = ""  # population.lengths where its batches' lengths differ, e.g. uniform:32:256
    padded: bool = False  # its executor padded batches to length buckets (tag lengths.buckets), else exact lengths
    padding_overhead: float = math.nan  # padded steps / real steps (median over its runs)
    length_buckets: tuple[BucketRow, ...] = ()  # per length bucket, shortest first

    @property
    def contended(self) -> bool:
        """Measured under contention, with high noise or without its load recorded (:func:`timing_doubts`):
        not a number to compare speeds by."""
        return bool(timing_doubts(self.contention, self.noise))

    def setting(self, label: str) -> str:
        return dict(self.settings).get(label, "")

    @property
    def settings_text(self) -> str:
        return " ".join(f"{label}={value}" for label, value in self.settings)


def setting_label(key: str) -> str:
    """How a param is named in the report: ``batch_size``, ``gradient_transform``, ``optimizer.lr``."""
    group, _, rest = key.partition(".")
    if group == "population":
        return rest
    return group if rest == "name" and group in GROUPS else key


def _measured_params(run: Run) -> dict[str, str]:
    """Everything that says what was measured, the executor and its settings included: every param
    but those that say where results went or how the run was watched."""
    return {
        key: value for key, value in run.data.params.items() if not key.startswith(names.NOT_MEASUREMENT_PARAM_PREFIXES)
    }


def config_key(run: Run) -> tuple[tuple[str, str], ...]:
    """What a run measured: runs with equal keys are repeats of one config (one row)."""
    return tuple(sorted(_measured_params(run).items()))


def _pairing_key(run: Run) -> tuple[tuple[str, str], ...]:
    """Everything but the executor and its settings: runs with equal keys differ only in how they
    execute, so an eager run of the same key is the run's baseline."""
    return tuple((key, value) for key, value in config_key(run) if not key.startswith(names.EXECUTOR_PARAM_PREFIX))


def swept_keys(runs: Sequence[Run]) -> list[str]:
    """The measurement params the runs that log them logged with different values: what the sweep
    varied, the executor's settings included. A param only some runs have (clip_norm's max_norm, an
    executor's own setting) follows from their option unless it varies among them."""
    values: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        for key, value in _measured_params(run).items():
            values[key].add(value)
    return sorted((key for key, seen in values.items() if len(seen) > 1), key=key_order)


def key_order(key: str) -> tuple[bool, str]:
    """How params are listed: the population's own first, then by name."""
    return (not key.startswith(POPULATION_PREFIX), key)


def sweep_runs(client: MlflowClient, parent: Run) -> list[Run]:
    """The parent's children and the earlier runs its jobs reused, each run once (several jobs of an
    Optuna search can reuse one run)."""
    reused = {run_id for key, run_id in parent.data.tags.items() if key.startswith(names.REUSED_PREFIX)}
    children = child_runs(client, parent)
    known = {run.info.run_id for run in children}
    return children + [client.get_run(run_id) for run_id in sorted(reused - known)]


def measured_series(client: MlflowClient, run: Run) -> list[float]:
    """The run's measured updates' latencies: its per-update series without the warm-up steps."""
    warmup = int(run.data.params.get("run.warmup_updates", "0"))
    history = client.get_metric_history(run.info.run_id, names.UPDATE_SERIES)
    return [metric.value for metric in sorted(history, key=lambda metric: metric.step) if metric.step >= warmup]


@dataclass
class _Group:
    """FINISHED runs of one config and executor (the repeats of a job), or one other run."""

    runs: list[Run]
    series: list[list[float]] | None  # per run, when every run has its per-update series

    def statistic(self, stat: str) -> float:
        """``median``, ``p10`` or ``p90`` of the pooled per-update series, else the median of the
        runs' logged ``update_ms_<stat>``."""
        if self.series is not None:
            return getattr(LatencySummary.of(list(np.concatenate(self.series))), stat)
        return float(np.median([run.data.metrics.get(names.update_metric(stat), math.nan) for run in self.runs]))

    def capture_ms(self) -> float:
        return float(np.median([run.data.metrics.get(names.CAPTURE, math.nan) for run in self.runs]))

    def length_buckets(self) -> tuple[BucketRow, ...]:
        """Each length bucket's logged statistics: counts summed over the runs, the others their median."""
        stats: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for run in self.runs:
            for key, value in run.data.metrics.items():
                if (parsed := names.bucket_update_stat(key)) is not None:
                    stats[parsed[0]][parsed[1]].append(value)

        def median(values: list[float]) -> float:
            return float(np.median(values)) if values else math.nan

        return tuple(
            BucketRow(
                bucket,
                int(sum(logged["count"])),
                median(logged["median"]),
                median(logged["p10"]),
                median(logged["p90"]),
            )
            for bucket, logged in sorted(stats.items())
            if logged["median"]
        )


def _group(runs: list[Run], client: MlflowClient | None, include_contended: bool) -> list[_Group]:
    """FINISHED runs of one config and executor pooled, those measured quietly apart from the
    contended ones unless ``include_contended``; every other run alone."""
    executor_tag = names.component_tag("executor")
    pooled: dict[tuple[object, ...], list[Run]] = defaultdict(list)
    single = []
    for run in runs:
        if run.info.status == "FINISHED":
            contended = not include_contended and _doubted([run])
            pooled[(config_key(run), run.data.tags.get(executor_tag), contended)].append(run)
        else:
            single.append([run])
    groups = []
    for members in [*pooled.values(), *single]:
        series = [measured_series(client, run) for run in members] if client is not None else None
        groups.append(_Group(members, series if series and all(series) else None))
    return groups


def _doubted(runs: Sequence[Run]) -> bool:
    return bool(doubts([run.data.tags for run in runs]))


def build_rows(
    runs: list[Run],
    client: MlflowClient | None = None,
    parent_id: str | None = None,
    include_contended: bool = False,
) -> list[ReportRow]:
    """One row per config and executor (runs that differ in an executor setting are rows apart),
    with its speedup over the FINISHED eager runs of the same parameters, the executor's aside.
    FINISHED repeats of a config (``sweep.repeats``) are pooled into one row; other runs stand
    alone. Runs measured under contention or with high noise, or without those labels (an older
    store's: :func:`timing_doubts`), form rows of their own, marked, without a speedup, and are no
    eager baseline, unless ``include_contended`` pools them with the rest. A run that did not
    finish has neither labels nor a speedup, whatever it measured: it is no timing to quote, as in
    :mod:`axoexp.compare`. With ``client``, each
    speedup of a row and a baseline of :data:`~axoexp.statistics.MIN_RUNS` runs or more
    (``sweep.repeats``) carries a 95% bootstrap interval from the per-update series
    (:func:`axoexp.statistics.median_ratio_interval`, seeded); a single run's interval would hold only
    its own spread, so it has none. With ``parent_id``, a run that is not that parent's child is
    marked ``reused``."""
    executor_tag = names.component_tag("executor")
    groups = _group(runs, client, include_contended)
    finished = {id(group): group.runs[0].info.status == "FINISHED" for group in groups}  # pooled or alone
    quiet = {id(group): finished[id(group)] and (include_contended or not _doubted(group.runs)) for group in groups}
    eager = {
        _pairing_key(group.runs[0]): group
        for group in groups
        if group.runs[0].data.tags.get(executor_tag) == BASELINE and quiet[id(group)]
    }
    swept = [key for key in swept_keys(runs) if key != EXECUTOR_KEY]
    rows = []
    for group in groups:
        first = group.runs[0]
        median = group.statistic("median")
        baseline = eager.get(_pairing_key(first)) if quiet[id(group)] else None
        speedup = (baseline.statistic("median") if baseline else math.nan) / median
        low = high = None
        if baseline is group:  # eager against itself: 1 by definition, no interval
            speedup = 1.0
        elif (
            baseline is not None
            and baseline.series is not None
            and group.series is not None
            and min(len(baseline.runs), len(group.runs)) >= MIN_RUNS
        ):
            interval = median_ratio_interval(baseline.series, group.series)
            speedup, low, high = interval.estimate, interval.low, interval.high
        labels = [run.data.tags for run in group.runs] if finished[id(group)] else None
        contention, noise = timing_labels(labels) if labels else ("", "")
        buckets_tag = first.data.tags.get(names.LENGTH_BUCKETS)
        rows.append(
            ReportRow(
                shape=first.data.tags.get(names.SHAPE, "?"),
                executor=first.data.tags.get(executor_tag, "?"),
                status=first.info.status,
                median_ms=median,
                capture_ms=group.capture_ms(),
                speedup_vs_eager=speedup,
                run_id=first.info.run_id,
                job=first.info.run_name or "",
                p10_ms=group.statistic("p10"),
                p90_ms=group.statistic("p90"),
                reused=parent_id is not None and first.data.tags.get(names.PARENT_RUN_ID) != parent_id,
                settings=tuple((setting_label(key), first.data.params.get(key, "")) for key in swept),
                speedup_low=low,
                speedup_high=high,
                repeats=len(group.runs),
                run_ids=tuple(run.info.run_id for run in group.runs),
                contention=contention,
                noise=noise,
                lengths=first.data.params.get(LENGTHS_KEY, "") if buckets_tag else "",
                padded=buckets_tag not in (None, names.LENGTH_BUCKETS_EXACT),
                padding_overhead=float(
                    np.median([run.data.metrics.get(names.PADDING_OVERHEAD, math.nan) for run in group.runs])
                ),
                length_buckets=group.length_buckets(),
            )
        )
    return sorted(
        rows, key=lambda row: (names.shape_size(row.shape), row.shape, row.settings, row.executor, row.contended)
    )
