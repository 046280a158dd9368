"""The report's figure for runs with batches of different lengths: per-bucket latency against length."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator

from axoexp.report.figure import MIN_TICKS, readable_axis
from axoexp.report.rows import ReportRow
from axoexp.report.table import bucket_span

LENGTHS_FIGURE = "report_lengths.png"
MIN_LABEL_GAP = 1 / 40
"""Bucket boundaries closer than this fraction of the axis are marked, not each labelled (labels would overlap)."""


def series_label(row: ReportRow) -> str:
    """The executor and its settings, and how its batches ran: padded (with the overhead) or at exact lengths."""
    how = "exact lengths"
    if row.padded:
        how = "padded" if math.isnan(row.padding_overhead) else f"padding {row.padding_overhead:.2f}x"
    return " ".join(filter(None, [row.executor, row.settings_text, f"({how})"]))


def plot_lengths(rows: list[ReportRow], heading: str, path: Path) -> Figure:
    """Median update latency of each length bucket (p10-p90 bars) against length, one series per
    row that logged buckets (an executor and its settings). A padded series draws each bucket at the
    length its batches were padded to, with a bar across the lengths it holds; the bucket boundaries
    are dotted and labelled on the length axis. A series that ran every batch at its exact length
    (eager) joins one point per length. Rows measured under contention, with high noise or without
    their load recorded are hollow. Returns the saved figure, for reading back."""
    series = [row for row in rows if row.status == "FINISHED" and row.length_buckets]
    figure, axes = plt.subplots(figsize=(10.0, 5.6))
    colours = plt.get_cmap("tab10")
    boundaries = sorted({bucket.bucket for row in series if row.padded for bucket in row.length_buckets})
    lengths: list[float] = []
    latencies: list[float] = []
    for index, row in enumerate(series):
        colour = colours(index % 10)
        xs = [bucket.bucket for bucket in row.length_buckets]
        ys = [bucket.median_ms for bucket in row.length_buckets]
        below = [0 if math.isnan(b.p10_ms) else max(b.median_ms - b.p10_ms, 0) for b in row.length_buckets]
        above = [0 if math.isnan(b.p90_ms) else max(b.p90_ms - b.median_ms, 0) for b in row.length_buckets]
        axes.errorbar(
            xs,
            ys,
            yerr=[below, above],
            color=colour,
            marker="o" if row.padded else ".",
            markerfacecolor="none" if row.contended else colour,
            capsize=3 if row.padded else 2,
            elinewidth=1.0 if row.padded else 0.7,
            linestyle="none" if row.padded else "-",
            linewidth=1.0,
            label=series_label(row),
        )
        for position, bucket in enumerate(row.length_buckets if row.padded else ()):
            low, high = bucket_span(row, position)
            axes.hlines(bucket.median_ms, low, high, colors=[colour], linewidth=2.5, alpha=0.5)
            lengths.append(low)
        lengths += xs
        latencies += [value for b in row.length_buckets for value in (b.median_ms, b.p10_ms, b.p90_ms)]
    for boundary in boundaries:
        axes.axvline(boundary, color="grey", linestyle=":", linewidth=1.0, zorder=0)
    if series:
        _length_axis(axes, lengths, boundaries)
        readable_axis(axes.yaxis, latencies, "{:g}")
        axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8, frameon=False)
    else:
        axes.set_axis_off()
        axes.text(0.5, 0.5, "no finished run logged per-bucket latencies", ha="center", va="center", fontsize=11)
    padded = "; dotted: the bucket boundaries of the padded series" if boundaries else ""
    axes.set_xlabel(f"batch length (time steps){padded}")
    axes.set_ylabel("median update latency (ms)\nbars: p10-p90")
    axes.set_title(
        "latency against length: each padded bucket at its padded length, its bar over the lengths it holds"
        if boundaries
        else "latency against length: each batch at its exact length",
        fontsize=9,
    )
    axes.grid(True, axis="y", alpha=0.3)
    characters = int(figure.get_figwidth() * 13)
    figure.suptitle(
        "\n".join(textwrap.fill(line, characters) for line in heading.splitlines()), fontsize=10, x=0.02, ha="left"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return figure


def _length_axis(axes: Axes, lengths: list[float], boundaries: list[int]) -> None:
    """A linear length axis; its ticks are the bucket boundaries where there are enough and they are
    far enough apart to be read, else at least :data:`MIN_TICKS` plain ones."""
    low, high = min(lengths), max(lengths)
    span = high - low or max(high * 0.2, 1.0)
    axes.set_xlim(low - 0.05 * span, high + 0.05 * span)
    gaps = [b - a for a, b in zip(boundaries, boundaries[1:], strict=False)]
    if len(boundaries) >= MIN_TICKS and min(gaps) >= MIN_LABEL_GAP * 1.1 * span:
        axes.set_xticks(boundaries, [str(boundary) for boundary in boundaries])
    else:
        axes.xaxis.set_major_locator(MaxNLocator(nbins=8, integer=True, min_n_ticks=MIN_TICKS))
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_minor_locator(NullLocator())
