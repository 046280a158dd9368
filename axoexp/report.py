"""``python -m axoexp.report``: a sweep's runs as a table and a latency-vs-shape plot.

Reads the children of a sweep's parent run (the newest sweep unless ``--parent`` names
one) plus the earlier runs that resume reused, prints shape, executor, median update ms,
capture ms and speedup over the eager run of the same config, and writes a PNG of median
latency per shape for each executor (and other swept setting), which it also logs to the parent run.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from mlflow.entities import Run  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from axoexp import names  # noqa: E402
from axoexp.errors import AxoexpError, NoSweepError  # noqa: E402
from axoexp.statistics import median_ratio_interval  # noqa: E402
from axoexp.sweep import child_runs  # noqa: E402
from axoexp.tracking import newest_run, resolve_tracking_uri  # noqa: E402

SQLITE_PREFIX = "sqlite:///"
IGNORED_FOR_PAIRING = (names.EXECUTOR_PARAM_PREFIX, *names.NOT_MEASUREMENT_PARAM_PREFIXES)
# Overrides a plot line does not name: the x axis shows the shape, the line label the executor.
NOT_IN_SERIES = ("population.neurons=", "population.time_steps=", "population.contacts=", "executor=")


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
    speedup_low: float = math.nan  # 95% bootstrap interval of speedup_vs_eager (statistics.median_ratio_interval)
    speedup_high: float = math.nan
    repeats: int = 1  # FINISHED runs of the same config pooled into this row (sweep.repeats)
    run_ids: tuple[str, ...] = ()

    @property
    def series(self) -> str:
        """The plot line: the executor plus the job's overrides other than shape and executor."""
        others = [part for part in self.job.split(",") if part and not part.startswith(NOT_IN_SERIES)]
        return " ".join([self.executor, *others])


def _pairing_key(run: Run) -> tuple[tuple[str, str], ...]:
    """Everything but the executor: runs with equal keys differ only in how they execute."""
    return tuple(sorted((key, value) for key, value in run.data.params.items()
                        if not key.startswith(IGNORED_FOR_PAIRING)))


def sweep_runs(client: MlflowClient, parent: Run) -> list[Run]:
    """The parent's children and the earlier runs its jobs reused."""
    reused = [client.get_run(run_id) for key, run_id in parent.data.tags.items()
              if key.startswith(names.REUSED_PREFIX)]
    return child_runs(client, parent) + reused


def measured_series(client: MlflowClient, run: Run) -> list[float]:
    """The run's measured updates' latencies: its ``update_ms`` history without the warm-up steps."""
    warmup = int(run.data.params.get("run.warmup_updates", "0"))
    history = client.get_metric_history(run.info.run_id, names.UPDATE_SERIES)
    return [metric.value for metric in sorted(history, key=lambda metric: metric.step) if metric.step >= warmup]


@dataclass
class _Group:
    """FINISHED runs of one config and executor (the repeats of a job), or one other run."""

    runs: list[Run]
    series: list[list[float]] | None  # per run, when every run has its per-update series

    @property
    def median_ms(self) -> float:
        if self.series is not None:
            return float(np.median(np.concatenate(self.series)))
        return float(np.median([run.data.metrics.get(names.UPDATE_MEDIAN, math.nan) for run in self.runs]))

    def capture_ms(self) -> float:
        return float(np.median([run.data.metrics.get(names.CAPTURE, math.nan) for run in self.runs]))


def _group(runs: list[Run], client: MlflowClient | None) -> list[_Group]:
    executor_tag = names.component_tag("executor")
    pooled: dict[tuple[object, ...], list[Run]] = defaultdict(list)
    single = []
    for run in runs:
        if run.info.status == "FINISHED":
            pooled[(_pairing_key(run), run.data.tags.get(executor_tag))].append(run)
        else:
            single.append([run])
    groups = []
    for members in [*pooled.values(), *single]:
        series = [measured_series(client, run) for run in members] if client is not None else None
        groups.append(_Group(members, series if series and all(series) else None))
    return groups


def build_rows(runs: list[Run], client: MlflowClient | None = None) -> list[ReportRow]:
    """One row per config and executor, with its speedup over the FINISHED eager runs of the same
    parameters. FINISHED repeats of a config (``sweep.repeats``) are pooled into one row; other
    runs stand alone. With ``client``, each speedup carries a 95% bootstrap interval from the
    per-update series (:func:`axoexp.statistics.median_ratio_interval`, seeded)."""
    executor_tag = names.component_tag("executor")
    groups = _group(runs, client)
    eager = {_pairing_key(group.runs[0]): group for group in groups
             if group.runs[0].data.tags.get(executor_tag) == "eager" and group.runs[0].info.status == "FINISHED"}
    rows = []
    for group in groups:
        first = group.runs[0]
        median = group.median_ms
        baseline = eager.get(_pairing_key(first))
        speedup, low, high = (baseline.median_ms if baseline else math.nan) / median, math.nan, math.nan
        if baseline is group:
            speedup, low, high = 1.0, 1.0, 1.0
        elif baseline is not None and baseline.series is not None and group.series is not None:
            interval = median_ratio_interval(baseline.series, group.series)
            speedup, low, high = interval.estimate, interval.low, interval.high
        rows.append(ReportRow(
            shape=first.data.tags.get(names.SHAPE, "?"), executor=first.data.tags.get(executor_tag, "?"),
            status=first.info.status, median_ms=median, capture_ms=group.capture_ms(),
            speedup_vs_eager=speedup, run_id=first.info.run_id, job=first.info.run_name or "",
            speedup_low=low, speedup_high=high, repeats=len(group.runs),
            run_ids=tuple(run.info.run_id for run in group.runs),
        ))
    return sorted(rows, key=lambda row: (names.shape_size(row.shape), row.shape, row.executor))


def format_table(rows: list[ReportRow]) -> str:
    """The rows as text; ``[low, high]`` is the speedup's 95% bootstrap interval, ``runs`` the
    repeats pooled (the run id shown is the first of them)."""
    lines = [f"{'shape':<16}{'executor':<20}{'status':<10}{'median ms':>11}{'capture ms':>12}{'vs eager':>10}"
             f"{'95% interval':>18}{'runs':>6}  run id                            job"]
    for row in rows:
        interval = "" if math.isnan(row.speedup_low) else f"[{row.speedup_low:.3g}, {row.speedup_high:.3g}]"
        lines.append(f"{row.shape:<16}{row.executor:<20}{row.status:<10}{row.median_ms:>11.3f}"
                     f"{row.capture_ms:>12.1f}{row.speedup_vs_eager:>9.2f}x{interval:>18}{row.repeats:>6}  "
                     f"{row.run_id}  {row.job}")
    return "\n".join(lines)


def plot(rows: list[ReportRow], title: str, path: Path) -> None:
    shapes = sorted({row.shape for row in rows}, key=names.shape_size)
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for series in sorted({row.series for row in rows}):
        points = [(shapes.index(row.shape), row.median_ms) for row in rows
                  if row.series == series and row.status == "FINISHED" and not math.isnan(row.median_ms)]
        if points:
            axes.plot(*zip(*sorted(points), strict=True), marker="o", label=series)
    axes.set_xticks(range(len(shapes)), shapes, rotation=20)
    axes.set_yscale("log")
    for axis_formatter in (axes.yaxis.set_major_formatter, axes.yaxis.set_minor_formatter):
        axis_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.set_xlabel("shape (neurons x time steps x contacts)")
    axes.set_ylabel("median update latency (ms)")
    axes.set_title(title, fontsize=9)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def latest_parent(client: MlflowClient, experiment: str) -> Run:
    run = newest_run(client, experiment, f"tags.`{names.SWEEP_ROLE}` = 'parent'")
    if run is None:
        raise NoSweepError(f"no sweep in experiment {experiment!r}; run one with python -m axoexp -m ...")
    return run


def main(argv: list[str] | None = None) -> None:
    """Print the report of a sweep; a user error exits 2 with one line."""
    try:
        report(argv)
    except AxoexpError as error:
        print(f"axoexp.report: {error}", file=sys.stderr)
        sys.exit(2)


def report(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m axoexp.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    parser.add_argument("--experiment", default="axoexp")
    parser.add_argument("--parent", default=None, help="the sweep's parent run id (default: the newest sweep)")
    parser.add_argument("--out", type=Path, default=None, help="PNG path (default: sweep-<parent id>.png)")
    args = parser.parse_args(argv)
    uri = resolve_tracking_uri(args.tracking_uri)
    if uri.startswith(SQLITE_PREFIX) and not Path(uri.removeprefix(SQLITE_PREFIX)).is_file():
        raise NoSweepError(f"no MLflow store at {uri}; run a sweep first: python -m axoexp -m ...")
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(args.parent) if args.parent else latest_parent(client, args.experiment)
    rows = build_rows(sweep_runs(client, parent), client)
    print(f"{parent.info.run_name} ({parent.info.status}, parent run {parent.info.run_id})")
    print(format_table(rows))
    path = args.out or Path(f"sweep-{parent.info.run_id}.png")
    plot(rows, parent.info.run_name or parent.info.run_id, path)
    client.log_artifact(parent.info.run_id, str(path))
    print(f"plot: {path} (also logged to the parent run)")


if __name__ == "__main__":
    main()
