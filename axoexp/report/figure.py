"""The report's figure: median latency against the swept dimension, and the speedup over eager."""

from __future__ import annotations

import math
import textwrap
import time
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator
from mlflow.entities import Run

from axoexp import names
from axoexp.report.rows import BASELINE, ReportRow

FIGURE = "report.png"


def _numeric(values: set[str]) -> bool:
    try:
        [float(value) for value in values]
    except ValueError:
        return False
    return True


def x_dimension(rows: list[ReportRow]) -> str | None:
    """The swept numeric setting with the most values (the population's settings first): the latency plot's x axis."""
    candidates = [label for label, _ in rows[0].settings] if rows else []
    numeric = [label for label in candidates if _numeric({row.setting(label) for row in rows})]
    return max(numeric, key=lambda label: len({row.setting(label) for row in rows}), default=None)


def title(parent: Run, runs: list[Run]) -> str:
    """The sweep's name; the device, torch and date of its runs."""
    tags = [run.data.tags for run in runs]
    devices = sorted(
        {
            tag.get(names.GPU_NAME) or f"CPU {tag.get(names.CPU_MODEL, '')}".strip()
            for tag in tags
            if names.DEVICE in tag
        }
    )
    torches = sorted({tag[names.version_tag("torch")] for tag in tags if names.version_tag("torch") in tag})
    date = time.strftime("%Y-%m-%d %H:%M", time.localtime(parent.info.start_time / 1000))
    return (
        f"{parent.info.run_name or parent.info.run_id}\n"
        f"{', '.join(devices) or 'device unknown'} · torch {', '.join(torches) or '?'} · {date}"
    )


def plot(rows: list[ReportRow], heading: str, path: Path) -> Figure:
    """Latency against the swept dimension (one panel per combination of the other swept
    settings, one colour per executor, p10-p90 bars) and, where eager runs exist, the speedup
    over eager per executor. Rows measured under contention, with high noise or without their load
    recorded (:attr:`ReportRow.contended`) are hollow (and their speedup bars hatched). Returns the
    saved figure, for reading back."""
    finished = [row for row in rows if row.status == "FINISHED" and not math.isnan(row.median_ms)]
    x_label = x_dimension(finished)
    panel_labels = [label for label, _ in (finished[0].settings if finished else ()) if label != x_label]
    panels = sorted({tuple(row.setting(label) for label in panel_labels) for row in finished}) or [()]
    executors = sorted({row.executor for row in rows}, key=lambda name: (name != BASELINE, name))
    colours = {name: plt.get_cmap("tab10")(index % 10) for index, name in enumerate(executors)}
    speedups = [row for row in finished if row.executor != BASELINE and not math.isnan(row.speedup_vs_eager)]

    columns = len(panels) if len(panels) <= 3 else math.ceil(math.sqrt(len(panels)))  # 4 panels: 2 x 2
    panel_rows = math.ceil(len(panels) / columns)
    figure = plt.figure(figsize=(4.2 * columns + 2.0, 3.4 * panel_rows + (3.2 if speedups else 0) + 1.2))
    grid = figure.add_gridspec(panel_rows + (1 if speedups else 0), columns)
    latency_axes: list[Axes] = []
    for index, panel in enumerate(panels):
        axes = figure.add_subplot(grid[index // columns, index % columns])
        latency_axes.append(axes)
        members = [row for row in finished if tuple(row.setting(label) for label in panel_labels) == panel]
        _latency_panel(axes, members, x_label, executors, colours)
        axes.set_title(
            ", ".join(f"{label}={value}" for label, value in zip(panel_labels, panel, strict=True)), fontsize=9
        )
        if index % columns == 0:
            axes.set_ylabel("median update latency (ms)\nbars: p10-p90")
    if finished:
        values = [value for row in finished for value in (row.median_ms, row.p10_ms, row.p90_ms)]
        for axes in latency_axes:  # one scale for every panel, so they compare at a glance
            readable_axis(axes.yaxis, values, "{:g}")
    else:
        latency_axes[0].set_axis_off()
        latency_axes[0].text(
            0.5,
            0.5,
            _nothing_finished(rows),
            ha="center",
            va="center",
            wrap=True,
            fontsize=11,
            transform=latency_axes[0].transAxes,
        )
    if speedups:
        _speedup_panel(figure.add_subplot(grid[panel_rows, :]), speedups, x_label, panel_labels, colours)
    handles = [plt.Line2D([], [], color=colours[name], marker="o", label=name) for name in executors]
    if any(row.reused for row in finished):
        handles.append(
            plt.Line2D(
                [], [], color="grey", marker="s", markerfacecolor="white", linestyle="", label="reused (earlier sweep)"
            )
        )
    if any(row.contended for row in finished):
        handles.append(
            plt.Line2D(
                [],
                [],
                color="grey",
                marker="o",
                markerfacecolor="none",
                linestyle="",
                label=CONTENDED_LABEL,
            )
        )
    legend_width = 2.4 / figure.get_figwidth()
    figure.legend(
        handles=handles,
        loc="center left",
        bbox_to_anchor=(1 - legend_width, 0.5),
        fontsize=8,
        title="executor",
        title_fontsize=8,
        frameon=False,
    )
    characters = int(figure.get_figwidth() * 13)  # about as many 10-point characters fit an inch
    figure.suptitle(
        "\n".join(textwrap.fill(line, characters) for line in heading.splitlines()), fontsize=10, x=0.02, ha="left"
    )
    figure.tight_layout(rect=(0, 0, 1 - legend_width, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return figure


CONTENDED_LABEL = "hollow: contended, noisy\nor load not recorded,\nnot compared"
ANNOTATED_POINTS = 8
"""A panel with at most this many points prints each median beside it."""
MIN_TICKS = 3


def _nothing_finished(rows: list[ReportRow]) -> str:
    if not rows:
        return "no runs: nothing to plot"
    statuses = ", ".join(f"{count} {status}" for status, count in sorted(Counter(row.status for row in rows).items()))
    return f"no run finished ({statuses}): nothing to plot;\nthe table lists each run and the parent's tags say why"


def readable_axis(axis: Axis, values: list[float], label: str) -> None:
    """At least :data:`MIN_TICKS` labelled ticks across ``values``' range: a linear scale with
    plain ticks where the largest is under 10x the smallest, else a log scale whose minor
    ticks (2, 3 and 5 times a power of ten; 2 and 5 past two decades) are labelled too.
    ``label`` formats a tick, e.g. ``"{:g}x"``."""
    finite = [value for value in values if value is not None and math.isfinite(value) and value > 0]
    if not finite:
        return
    low, high = min(finite), max(finite)
    set_scale = axis.axes.set_yscale if axis is axis.axes.yaxis else axis.axes.set_xscale
    set_limits = axis.axes.set_ylim if axis is axis.axes.yaxis else axis.axes.set_xlim
    formatter = FuncFormatter(lambda value, _: label.format(float(f"{value:.3g}")))
    if high < 10 * low:
        set_scale("linear")
        span = high - low or abs(high) * 0.2 or 1.0
        set_limits(max(low - 0.15 * span, 0), high + 0.15 * span)
        axis.set_major_locator(MaxNLocator(nbins=6, min_n_ticks=MIN_TICKS))
        axis.set_major_formatter(formatter)
        axis.set_minor_locator(NullLocator())
        return
    set_scale("log")
    set_limits(low / 1.3, high * 1.3)
    subs = (2.0, 5.0) if high > 100 * low else (2.0, 3.0, 5.0)
    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(formatter)
    axis.set_minor_locator(LogLocator(base=10, subs=subs))
    axis.set_minor_formatter(formatter)


def tick_labels(axis: Axis) -> list[str]:
    """The labels of the ticks drawn within the axis's view (major and minor): what a reader sees."""
    low, high = sorted(axis.get_view_interval())
    ticks = [*axis.get_major_ticks(), *axis.get_minor_ticks()]
    return [
        tick.label1.get_text()
        for tick in ticks
        if tick.label1.get_visible() and tick.label1.get_text() and low <= tick.get_loc() <= high
    ]


def _latency_panel(axes: Axes, rows: list[ReportRow], x_label: str | None, executors: list[str], colours: dict) -> None:
    """Points joined only along the numeric x axis (quiet ones only); without one, a dot per executor."""
    present = [name for name in executors if any(row.executor == name for row in rows)]
    annotate = len(rows) <= ANNOTATED_POINTS
    for offset, executor in enumerate(present):
        for contended in (False, True):
            mine = [row for row in rows if row.executor == executor and row.contended == contended]
            if not mine:
                continue
            if x_label is not None:
                mine.sort(key=lambda row: float(row.setting(x_label)))
                xs = [float(row.setting(x_label)) for row in mine]
            else:
                xs = [offset + (0.15 if contended else 0)] * len(mine)
            ys = [row.median_ms for row in mine]
            low = [max(row.median_ms - row.p10_ms, 0) if not math.isnan(row.p10_ms) else 0 for row in mine]
            high = [max(row.p90_ms - row.median_ms, 0) if not math.isnan(row.p90_ms) else 0 for row in mine]
            axes.errorbar(
                xs,
                ys,
                yerr=[low, high],
                color=colours[executor],
                marker="o",
                markerfacecolor="none" if contended else colours[executor],
                capsize=3,
                linestyle="-" if x_label is not None and not contended else "none",
                label=executor,
            )
            reused = [(x, row.median_ms) for x, row in zip(xs, mine, strict=True) if row.reused]
            if reused:
                axes.plot(
                    *zip(*reused, strict=True),
                    linestyle="",
                    marker="s",
                    markersize=9,
                    markerfacecolor="none",
                    markeredgecolor=colours[executor],
                    zorder=3,
                )
            if annotate:
                for x, y in zip(xs, ys, strict=True):
                    axes.annotate(
                        f"{y:.3g}", (x, y), xytext=(5, 0), textcoords="offset points", fontsize=7, va="center"
                    )
    if x_label is None:
        axes.set_xticks(range(len(present)), present)
        axes.set_xlim(-0.7, len(present) - 0.3)
    else:
        values = sorted({float(row.setting(x_label)) for row in rows})
        readable_axis(axes.xaxis, values, "{:g}")
        if len(values) >= MIN_TICKS:  # enough swept values: label exactly those
            axes.set_xticks(values, [f"{value:g}" for value in values])
            axes.xaxis.set_minor_locator(NullLocator())
        axes.set_xlabel(x_label)
    axes.grid(True, which="both", alpha=0.3)


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
            if row.contended:  # only with --include-contended
                bar.set_hatch("xx")
                bar.set_alpha(0.5)
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
    values = [
        value
        for row in rows
        for value in (row.speedup_vs_eager, row.speedup_low, row.speedup_high)
        if value is not None
    ]
    readable_axis(axes.yaxis, [*values, 1.0], "{:g}x")  # log where it spans 10x: 0.5x and 2x equally far from 1x
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
