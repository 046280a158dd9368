"""``python -m axoexp.report``: a sweep's runs as a table and a figure, next to the sweep's outputs.

Reads the children of a sweep's parent run (the newest sweep unless ``--parent`` names
one) plus the earlier runs its jobs reused (marked as such), and prints one row per run:
shape, executor, status, median update ms with p10/p90, capture ms, speedup over the eager
run of the same settings, and the run's swept settings. The table prints as text, markdown,
CSV or JSON (``--format``). The figure shows median latency against the swept dimension
(p10-p90 bars; the other swept settings as panels, executors as colours) and the speedup
over eager per executor. Both are written to the sweep's output directory and logged to the
parent run.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.errors import AxoexpError, NoSweepError, StoreError
from axoexp.registry import GROUPS
from axoexp.statistics import median_ratio_interval
from axoexp.sweep import child_runs
from axoexp.tracking import newest_run, resolve_tracking_uri, store_problem

SQLITE_PREFIX = "sqlite:///"
EXECUTOR_KEY = f"{names.EXECUTOR_PARAM_PREFIX}name"
IGNORED_FOR_PAIRING = (names.EXECUTOR_PARAM_PREFIX, *names.NOT_MEASUREMENT_PARAM_PREFIXES)
SHAPE_KEYS = ("population.neurons", "population.time_steps", "population.contacts")
FORMATS = {"text": "txt", "markdown": "md", "csv": "csv", "json": "json"}
FIGURE = "report.png"
BASELINE = "eager"


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
    speedup_low: float | None = None  # 95% bootstrap interval of speedup_vs_eager, where the series are known
    speedup_high: float | None = None  # (statistics.median_ratio_interval)
    repeats: int = 1  # FINISHED runs of the same config pooled into this row (sweep.repeats)
    run_ids: tuple[str, ...] = ()

    def setting(self, label: str) -> str:
        return dict(self.settings).get(label, "")

    @property
    def settings_text(self) -> str:
        return " ".join(f"{label}={value}" for label, value in self.settings)


def setting_label(key: str) -> str:
    """How a param is named in the report: ``neurons``, ``gradient_transform``, ``optimizer.lr``."""
    group, _, rest = key.partition(".")
    if group == "population":
        return rest
    return group if rest == "name" and group in GROUPS else key


def _measured_params(run: Run) -> dict[str, str]:
    """Everything that says what was measured, the executor aside."""
    return {key: value for key, value in run.data.params.items() if not key.startswith(IGNORED_FOR_PAIRING)}


def _pairing_key(run: Run) -> tuple[tuple[str, str], ...]:
    """Everything but the executor: runs with equal keys differ only in how they execute."""
    return tuple(sorted(_measured_params(run).items()))


def swept_keys(runs: Sequence[Run]) -> list[str]:
    """The measurement params whose values differ between ``runs``: what the sweep varied."""
    values: dict[str, set[str | None]] = {}
    for run in runs:
        for key in set(values) | set(_measured_params(run)):
            values.setdefault(key, set()).add(_measured_params(run).get(key))
    keys = [key for key, seen in values.items() if len(seen) > 1]
    # a parameter only some options of a group have (clip_norm's max_norm) follows from the option
    keys = [key for key in keys if None not in values[key] or f"{key.partition('.')[0]}.name" not in keys]
    return sorted(keys, key=lambda key: (key not in SHAPE_KEYS, SHAPE_KEYS.index(key) if key in SHAPE_KEYS else 0, key))


def sweep_runs(client: MlflowClient, parent: Run) -> list[Run]:
    """The parent's children and the earlier runs its jobs reused."""
    reused = [client.get_run(run_id) for key, run_id in parent.data.tags.items() if key.startswith(names.REUSED_PREFIX)]
    return child_runs(client, parent) + reused


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

    def statistic(self, percentile: float, metric: str) -> float:
        if self.series is not None:
            return float(np.percentile(np.concatenate(self.series), percentile))
        return float(np.median([run.data.metrics.get(metric, math.nan) for run in self.runs]))

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


def build_rows(runs: list[Run], client: MlflowClient | None = None, parent_id: str | None = None) -> list[ReportRow]:
    """One row per config and executor, with its speedup over the FINISHED eager runs of the same
    parameters. FINISHED repeats of a config (``sweep.repeats``) are pooled into one row; other
    runs stand alone. With ``client``, each speedup carries a 95% bootstrap interval from the
    per-update series (:func:`axoexp.statistics.median_ratio_interval`, seeded). With
    ``parent_id``, a run that is not that parent's child is marked ``reused``."""
    executor_tag = names.component_tag("executor")
    groups = _group(runs, client)
    eager = {
        _pairing_key(group.runs[0]): group
        for group in groups
        if group.runs[0].data.tags.get(executor_tag) == BASELINE and group.runs[0].info.status == "FINISHED"
    }
    swept = [key for key in swept_keys(runs) if key != EXECUTOR_KEY]
    rows = []
    for group in groups:
        first = group.runs[0]
        median = group.statistic(50, names.UPDATE_MEDIAN)
        baseline = eager.get(_pairing_key(first))
        speedup = (baseline.statistic(50, names.UPDATE_MEDIAN) if baseline else math.nan) / median
        low = high = None
        if baseline is group:
            speedup, low, high = 1.0, 1.0, 1.0
        elif baseline is not None and baseline.series is not None and group.series is not None:
            interval = median_ratio_interval(baseline.series, group.series)
            speedup, low, high = interval.estimate, interval.low, interval.high
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
                p10_ms=group.statistic(10, names.update_metric("p10")),
                p90_ms=group.statistic(90, names.update_metric("p90")),
                reused=parent_id is not None and first.data.tags.get(names.PARENT_RUN_ID) != parent_id,
                settings=tuple((setting_label(key), first.data.params.get(key, "")) for key in swept),
                speedup_low=low,
                speedup_high=high,
                repeats=len(group.runs),
                run_ids=tuple(run.info.run_id for run in group.runs),
            )
        )
    return sorted(rows, key=lambda row: (names.shape_size(row.shape), row.shape, row.settings, row.executor))


# --- the table


def _number(value: float | None, digits: int) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _speedup(row: ReportRow) -> str:
    return "" if math.isnan(row.speedup_vs_eager) else f"{row.speedup_vs_eager:.2f}x"


def _interval(row: ReportRow) -> str:
    return (
        ""
        if row.speedup_low is None or row.speedup_high is None
        else f"[{row.speedup_low:.3g}, {row.speedup_high:.3g}]"
    )


COLUMNS = (
    "shape",
    "executor",
    "status",
    "median ms",
    "p10 ms",
    "p90 ms",
    "capture ms",
    "vs eager",
    "95% interval",
    "runs",
    "reused",
    "settings",
    "run id",
)
NUMERIC_COLUMNS = range(3, 10)


def _cells(row: ReportRow) -> tuple[str, ...]:
    return (
        row.shape,
        row.executor,
        row.status,
        _number(row.median_ms, 3),
        _number(row.p10_ms, 3),
        _number(row.p90_ms, 3),
        _number(row.capture_ms, 1),
        _speedup(row),
        _interval(row),
        str(row.repeats),
        "reused" if row.reused else "",
        row.settings_text,
        row.run_id,
    )


def format_table(rows: list[ReportRow], style: str = "text") -> str:
    """The rows as ``text`` (aligned columns), ``markdown``, ``csv`` or ``json``."""
    if style == "json":
        return json.dumps([_json_row(row) for row in rows], indent=2)
    if style == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([field.name for field in fields(ReportRow)])
        writer.writerows([_json_row(row).values() for row in rows])
        return out.getvalue().rstrip("\n")
    cells = [COLUMNS, *(_cells(row) for row in rows)]
    if style == "markdown":
        rule = ["---:" if index in NUMERIC_COLUMNS else "---" for index in range(len(COLUMNS))]
        return "\n".join("| " + " | ".join(line) + " |" for line in [cells[0], rule, *cells[1:]])
    widths = [max(len(line[index]) for line in cells) for index in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if index in NUMERIC_COLUMNS else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in cells
    )


def _json_row(row: ReportRow) -> dict[str, object]:
    data = asdict(row)
    data["settings"] = dict(row.settings)
    return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in data.items()}


# --- the figure


def _numeric(values: set[str]) -> bool:
    try:
        [float(value) for value in values]
    except ValueError:
        return False
    return True


def x_dimension(rows: list[ReportRow]) -> str | None:
    """The swept numeric setting with the most values (shape dimensions first): the latency plot's x axis."""
    candidates = [label for label, _ in rows[0].settings] if rows else []
    numeric = [label for label in candidates if _numeric({row.setting(label) for row in rows})]
    return max(numeric, key=lambda label: len({row.setting(label) for row in rows}), default=None)


def title(parent: Run, runs: list[Run]) -> str:
    """The sweep's name; the device, torch and date of its runs."""
    tags = [run.data.tags for run in runs]
    devices = sorted({tag.get("gpu.name") or f"CPU {tag.get('cpu', '')}".strip() for tag in tags if "device" in tag})
    torches = sorted({tag["version.torch"] for tag in tags if "version.torch" in tag})
    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(parent.info.start_time / 1000))
    return (
        f"{parent.info.run_name or parent.info.run_id}\n"
        f"{', '.join(devices) or 'device unknown'} · torch {', '.join(torches) or '?'} · {date}"
    )


def plot(rows: list[ReportRow], heading: str, path: Path) -> None:
    """Latency against the swept dimension (one panel per combination of the other swept
    settings, one colour per executor, p10-p90 bars) and, where eager runs exist, the speedup
    over eager per executor."""
    finished = [row for row in rows if row.status == "FINISHED" and not math.isnan(row.median_ms)]
    x_label = x_dimension(finished)
    panel_labels = [label for label, _ in (finished[0].settings if finished else ()) if label != x_label]
    panels = sorted({tuple(row.setting(label) for label in panel_labels) for row in finished}) or [()]
    executors = sorted({row.executor for row in rows}, key=lambda name: (name != BASELINE, name))
    colours = {name: plt.get_cmap("tab10")(index % 10) for index, name in enumerate(executors)}
    speedups = [row for row in finished if row.executor != BASELINE and not math.isnan(row.speedup_vs_eager)]

    columns = len(panels) if len(panels) <= 3 else math.ceil(math.sqrt(len(panels)))  # 4 panels: 2 x 2
    panel_rows = math.ceil(len(panels) / columns)
    figure = plt.figure(figsize=(4.2 * columns + 2.0, 3.4 * panel_rows + (3.2 if speedups else 0) + 0.9))
    grid = figure.add_gridspec(panel_rows + (1 if speedups else 0), columns)
    latency_axes: list[Axes] = []
    for index, panel in enumerate(panels):
        axes = figure.add_subplot(
            grid[index // columns, index % columns], sharey=latency_axes[0] if latency_axes else None
        )
        latency_axes.append(axes)
        members = [row for row in finished if tuple(row.setting(label) for label in panel_labels) == panel]
        _latency_panel(axes, members, x_label, executors, colours)
        axes.set_title(
            ", ".join(f"{label}={value}" for label, value in zip(panel_labels, panel, strict=True)), fontsize=9
        )
        if index % columns == 0:
            axes.set_ylabel("median update latency (ms)\nbars: p10-p90")
    if speedups:
        _speedup_panel(figure.add_subplot(grid[panel_rows, :]), speedups, x_label, panel_labels, colours)
    handles = [plt.Line2D([], [], color=colours[name], marker="o", label=name) for name in executors]
    if any(row.reused for row in finished):
        handles.append(
            plt.Line2D(
                [], [], color="grey", marker="o", markerfacecolor="white", linestyle="", label="reused (earlier sweep)"
            )
        )
    legend_width = 2.0 / figure.get_figwidth()
    figure.legend(
        handles=handles,
        loc="center left",
        bbox_to_anchor=(1 - legend_width, 0.5),
        fontsize=8,
        title="executor",
        title_fontsize=8,
        frameon=False,
    )
    figure.suptitle(heading, fontsize=10, x=0.02, ha="left")
    figure.tight_layout(rect=(0, 0, 1 - legend_width, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _latency_panel(axes: Axes, rows: list[ReportRow], x_label: str | None, executors: list[str], colours: dict) -> None:
    """Points joined only along the numeric x axis; without one, a dot per executor."""
    present = [name for name in executors if any(row.executor == name for row in rows)]
    for offset, executor in enumerate(present):
        mine = [row for row in rows if row.executor == executor]
        if x_label is not None:
            mine.sort(key=lambda row: float(row.setting(x_label)))
            xs = [float(row.setting(x_label)) for row in mine]
        else:
            xs = [offset] * len(mine)
        ys = [row.median_ms for row in mine]
        low = [max(row.median_ms - row.p10_ms, 0) if not math.isnan(row.p10_ms) else 0 for row in mine]
        high = [max(row.p90_ms - row.median_ms, 0) if not math.isnan(row.p90_ms) else 0 for row in mine]
        axes.errorbar(
            xs,
            ys,
            yerr=[low, high],
            color=colours[executor],
            marker="o",
            capsize=3,
            linestyle="-" if x_label is not None else "none",
            label=executor,
        )
        reused = [(x, row.median_ms) for x, row in zip(xs, mine, strict=True) if row.reused]
        if reused:
            axes.plot(
                *zip(*reused, strict=True),
                linestyle="",
                marker="o",
                markerfacecolor="white",
                markeredgecolor=colours[executor],
                zorder=3,
            )
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    if x_label is None:
        axes.set_xticks(range(len(present)), present)
        axes.set_xlim(-0.7, len(present) - 0.3)
    else:
        values = sorted({float(row.setting(x_label)) for row in rows})
        if values and values[-1] / max(values[0], 1e-12) >= 8:
            axes.set_xscale("log")
        axes.set_xticks(values, [f"{value:g}" for value in values])
        axes.xaxis.set_minor_locator(plt.NullLocator())  # ticks at the swept values only
        axes.set_xlabel(x_label)
    axes.grid(True, which="both", alpha=0.3)


def _minor_label(value: float, _: object) -> str:
    """Label 2 and 5 times a power of ten: enough to read a log axis, not a crowd."""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if round(mantissa) in (2, 5) and abs(mantissa - round(mantissa)) < 1e-6 else ""


def _speedup_panel(
    axes: Axes, rows: list[ReportRow], x_label: str | None, panel_labels: list[str], colours: dict
) -> None:
    """Bars of speedup over eager per configuration, one colour per executor, intervals where known."""
    order = [*panel_labels, *([x_label] if x_label else [])]  # left to right as the panels above read

    def configuration(row: ReportRow) -> tuple:
        return tuple(float(row.setting(label)) if label == x_label else row.setting(label) for label in order)

    configurations = sorted({configuration(row) for row in rows})
    executors = sorted({row.executor for row in rows})
    width = 0.8 / len(executors)
    for index, executor in enumerate(executors):
        mine = [row for row in rows if row.executor == executor]
        xs = [configurations.index(configuration(row)) + (index - (len(executors) - 1) / 2) * width for row in mine]
        ys = [row.speedup_vs_eager for row in mine]
        # bars start at eager (1x): up is faster, down is slower
        bars = axes.bar(xs, [y - 1 for y in ys], bottom=1, width=width * 0.9, color=colours[executor], label=executor)
        for bar, row in zip(bars, mine, strict=True):
            if row.reused:
                bar.set_hatch("//")
            above = row.speedup_vs_eager >= 1
            end = (row.speedup_high if above else row.speedup_low) or row.speedup_vs_eager  # past the interval
            axes.annotate(
                f"{row.speedup_vs_eager:.3g}x",
                (bar.get_x() + bar.get_width() / 2, end),
                ha="center",
                va="bottom" if above else "top",
                fontsize=7,
                xytext=(0, 2 if above else -2),
                textcoords="offset points",
            )
        for x, y, row in zip(xs, ys, mine, strict=True):
            if row.speedup_low is not None and row.speedup_high is not None:
                axes.errorbar(
                    [x],
                    [y],
                    yerr=[[y - row.speedup_low], [row.speedup_high - y]],
                    fmt="none",
                    ecolor="black",
                    capsize=3,
                    linewidth=1,
                )
    axes.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    axes.set_yscale("log")  # a ratio: 0.5x and 2x equally far from eager
    values = [
        value
        for row in rows
        for value in (row.speedup_vs_eager, row.speedup_low, row.speedup_high)
        if value is not None
    ]
    low, high = min(*values, 1.0), max(*values, 1.0)
    axes.set_ylim(low / 1.6, high * 1.6)
    axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}x"))
    axes.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{_minor_label(value, _)}x".lstrip("x")))
    labels = [
        "\n".join(
            f"{label}={value:g}" if isinstance(value, float) else f"{label}={value}"
            for label, value in zip(order, config, strict=True)
        )
        for config in configurations
    ]
    axes.set_xticks(range(len(configurations)), labels, fontsize=8)
    axes.set_ylabel("speedup over eager\n(above 1x: faster)")
    axes.set_title("speedup over the eager run of the same settings (dashed: eager)", fontsize=9)
    axes.grid(True, axis="y", alpha=0.3)


# --- the command


def latest_parent(client: MlflowClient, experiment: str) -> Run:
    run = newest_run(client, experiment, f"tags.`{names.SWEEP_ROLE}` = 'parent'")
    if run is None:
        raise NoSweepError(f"no sweep in experiment {experiment!r}; run one with python -m axoexp -m ...")
    return run


def output_dir(parent: Run) -> Path:
    """The sweep's own output directory where it still exists, else the current directory."""
    sweep_dir = Path(parent.data.tags.get(names.SWEEP_DIR, "."))
    return sweep_dir if sweep_dir.is_dir() else Path(".")


def main(argv: list[str] | None = None) -> None:
    """Print the report of a sweep; a user error exits 2 with one line."""
    try:
        report(argv)
    except AxoexpError as error:
        print(f"axoexp.report: {error}", file=sys.stderr)
        sys.exit(2)


def report(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m axoexp.report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    parser.add_argument("--experiment", default="axoexp")
    parser.add_argument("--parent", default=None, help="the sweep's parent run id (default: the newest sweep)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="how the table prints; markdown, csv and json are also written as report.md|csv|json",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help=f"the figure's path (default: {FIGURE} in the sweep's output directory)"
    )
    args = parser.parse_args(argv)
    uri = resolve_tracking_uri(args.tracking_uri)
    if uri.startswith(SQLITE_PREFIX) and not Path(uri.removeprefix(SQLITE_PREFIX)).is_file():
        raise NoSweepError(f"no MLflow store at {uri}; run a sweep first: python -m axoexp -m ...")
    problem = store_problem(uri)
    if problem:
        raise StoreError(problem)
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(args.parent) if args.parent else latest_parent(client, args.experiment)
    runs = sweep_runs(client, parent)
    rows = build_rows(runs, client, parent.info.run_id)
    table = format_table(rows, args.format)
    if args.format == "text":
        print(f"{parent.info.run_name} ({parent.info.status}, parent run {parent.info.run_id})")
    print(table)
    figure = args.out or output_dir(parent) / FIGURE
    plot(rows, title(parent, runs), figure)
    written = [figure]
    if args.format != "text":
        written.append(figure.with_name(f"report.{FORMATS[args.format]}"))
        written[-1].write_text(table + "\n")
    for path in written:
        client.log_artifact(parent.info.run_id, str(path))
    print(f"report: {', '.join(map(str, written))} (also logged to the parent run)", file=sys.stderr)


if __name__ == "__main__":
    main()
