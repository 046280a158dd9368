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
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from mlflow.entities import Run  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from axoexp import names  # noqa: E402
from axoexp.errors import AxoexpError, NoSweepError  # noqa: E402
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


def build_rows(runs: list[Run]) -> list[ReportRow]:
    """One row per run, with its speedup over the FINISHED eager run of the same parameters."""
    executor_tag = names.component_tag("executor")
    eager = {_pairing_key(run): run.data.metrics.get(names.UPDATE_MEDIAN, math.nan)
             for run in runs if run.data.tags.get(executor_tag) == "eager" and run.info.status == "FINISHED"}
    rows = []
    for run in runs:
        median = run.data.metrics.get(names.UPDATE_MEDIAN, math.nan)
        rows.append(ReportRow(
            shape=run.data.tags.get(names.SHAPE, "?"), executor=run.data.tags.get(executor_tag, "?"),
            status=run.info.status, median_ms=median, capture_ms=run.data.metrics.get(names.CAPTURE, math.nan),
            speedup_vs_eager=eager.get(_pairing_key(run), math.nan) / median, run_id=run.info.run_id,
            job=run.info.run_name or "",
        ))
    return sorted(rows, key=lambda row: (names.shape_size(row.shape), row.shape, row.executor))


def format_table(rows: list[ReportRow]) -> str:
    lines = [f"{'shape':<16}{'executor':<20}{'status':<10}{'median ms':>11}{'capture ms':>12}{'vs eager':>10}  "
             "run id                            job"]
    for row in rows:
        lines.append(f"{row.shape:<16}{row.executor:<20}{row.status:<10}{row.median_ms:>11.3f}"
                     f"{row.capture_ms:>12.1f}{row.speedup_vs_eager:>9.2f}x  {row.run_id}  {row.job}")
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
    rows = build_rows(sweep_runs(client, parent))
    print(f"{parent.info.run_name} ({parent.info.status}, parent run {parent.info.run_id})")
    print(format_table(rows))
    path = args.out or Path(f"sweep-{parent.info.run_id}.png")
    plot(rows, parent.info.run_name or parent.info.run_id, path)
    client.log_artifact(parent.info.run_id, str(path))
    print(f"plot: {path} (also logged to the parent run)")


if __name__ == "__main__":
    main()
