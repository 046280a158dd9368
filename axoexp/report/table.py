"""Report rows as aligned text, markdown, CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Container, Sequence
from dataclasses import asdict, fields

from axoexp.lengths import parse_lengths
from axoexp.report.rows import BASELINE, BucketRow, ReportRow

FORMATS = {"text": "txt", "markdown": "md", "csv": "csv", "json": "json"}
BUCKETS_CSV = "report_buckets.csv"  # with --format csv: the per-bucket rows


def _number(value: float | None, digits: int) -> str:
    return "" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _ratio(value: float) -> str:
    """A speedup or an end of its interval, all to three significant figures (``0.201``, ``22.6``,
    ``1230``): rounding them alike keeps an estimate inside its printed interval (``0.2014`` as
    ``0.20`` beside a low of ``0.201`` did not)."""
    return f"{float(f'{value:.3g}'):g}"


def _speedup(row: ReportRow) -> str:
    """``2.5x``; ``—`` for an eager row, its own baseline; blank where there is no baseline."""
    if math.isnan(row.speedup_vs_eager):
        return ""
    return "—" if row.executor == BASELINE else f"{_ratio(row.speedup_vs_eager)}x"


def _interval(row: ReportRow) -> str:
    return (
        ""
        if row.speedup_low is None or row.speedup_high is None
        else f"[{_ratio(row.speedup_low)}, {_ratio(row.speedup_high)}]"
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
    "contention",
    "noise",
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
        row.contention,
        row.noise,
        "reused" if row.reused else "",
        row.settings_text,
        row.run_id,
    )


BUCKET_COLUMNS = (
    "shape",
    "executor",
    "settings",
    "bucket",
    "lengths",
    "updates",
    "median ms",
    "p10 ms",
    "p90 ms",
    "padding",
    "run id",
)
NUMERIC_BUCKET_COLUMNS = range(3, 10)
BUCKET_CSV_COLUMNS = (
    "shape",
    "executor",
    "settings",
    "bucket",
    "shortest",
    "longest",
    "count",
    "median_ms",
    "p10_ms",
    "p90_ms",
    "padding_overhead",
    "run_id",
)
BUCKETS_HEADING = (
    "per length bucket (bucket: the length batches were padded to, or their exact length where nothing is padded; "
    "padding: the run's padded steps / real steps)"
)
NOT_IN_CSV = ("length_buckets",)  # a CSV row has no room for a list: the per-bucket rows are a CSV of their own


def csv_text(header: Sequence[str], lines: Sequence[Sequence[object]]) -> str:
    """CSV with a mapping as ``key=value`` pairs and a sequence as its items, space-separated."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows([header, *([_csv_value(value) for value in line] for line in lines)])
    return out.getvalue().rstrip("\n")


def _csv_value(value: object) -> object:
    if isinstance(value, dict):
        return " ".join(f"{key}={item}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return " ".join(map(str, value))
    return value


def format_table(rows: list[ReportRow], style: str = "text") -> str:
    """The rows as ``text`` (aligned columns), ``markdown``, ``csv`` or ``json``. Text and markdown
    follow with the per-bucket table where runs had batches of different lengths; JSON nests each
    row's buckets; CSV leaves them to :func:`format_buckets`."""
    if style == "json":
        return json.dumps([_json_row(row) for row in rows], indent=2)
    if style == "csv":
        header = [field.name for field in fields(ReportRow) if field.name not in NOT_IN_CSV]
        return csv_text(header, [[_json_row(row)[name] for name in header] for row in rows])
    table = grid([COLUMNS, *(_cells(row) for row in rows)], NUMERIC_COLUMNS, markdown=style == "markdown")
    buckets = format_buckets(rows, style)
    if not buckets:
        return table
    heading = BUCKETS_HEADING if style == "text" else f"**{BUCKETS_HEADING[0].upper()}{BUCKETS_HEADING[1:]}**"
    return f"{table}\n\n{heading}\n\n{buckets}" if style == "markdown" else f"{table}\n\n{heading}\n{buckets}"


def bucket_span(row: ReportRow, index: int) -> tuple[int, int]:
    """The shortest and longest length that the row's ``index``-th bucket holds: above the bucket before
    it (the first: from the row's shortest length, where ``lengths`` says it) up to the bucket itself;
    the bucket alone where nothing is padded."""
    bucket = row.length_buckets[index].bucket
    if not row.padded:
        return bucket, bucket
    if index > 0:
        return row.length_buckets[index - 1].bucket + 1, bucket
    try:
        spec = parse_lengths(row.lengths.strip("[]") or None)  # a list is logged as "[9, 13, 16]"
    except ValueError:
        spec = None
    return (spec.low if spec is not None and spec.low <= bucket else bucket), bucket


def _bucket_cells(row: ReportRow, index: int, bucket: BucketRow) -> tuple[str, ...]:
    low, high = bucket_span(row, index)
    return (
        row.shape,
        row.executor,
        row.settings_text,
        str(bucket.bucket),
        str(high) if low == high else f"{low}-{high}",
        str(bucket.count),
        _number(bucket.median_ms, 3),
        _number(bucket.p10_ms, 3),
        _number(bucket.p90_ms, 3),
        "" if math.isnan(row.padding_overhead) else f"{row.padding_overhead:.3f}x",
        row.run_id,
    )


def format_buckets(rows: list[ReportRow], style: str = "text") -> str:
    """One line per row and length bucket (``text``, ``markdown`` or ``csv``); empty where no row has buckets."""
    buckets = [(row, index, bucket) for row in rows for index, bucket in enumerate(row.length_buckets)]
    if not buckets:
        return ""
    if style == "csv":  # numbers as logged, the lengths a bucket holds in two columns
        lines = [
            [row.shape, row.executor, row.settings_text, bucket.bucket, *bucket_span(row, index), bucket.count]
            + [_json_value(value) for value in (bucket.median_ms, bucket.p10_ms, bucket.p90_ms, row.padding_overhead)]
            + [row.run_id]
            for row, index, bucket in buckets
        ]
        return csv_text(BUCKET_CSV_COLUMNS, lines)
    cells = [_bucket_cells(row, index, bucket) for row, index, bucket in buckets]
    return grid([BUCKET_COLUMNS, *cells], NUMERIC_BUCKET_COLUMNS, markdown=style == "markdown")


def grid(cells: Sequence[Sequence[str]], numeric: Container[int], *, markdown: bool = False) -> str:
    """A header line and rows of cells as aligned text (``numeric`` columns right-aligned) or a markdown table."""
    if markdown:
        rule = ["---:" if index in numeric else "---" for index in range(len(cells[0]))]
        return "\n".join("| " + " | ".join(line) + " |" for line in [cells[0], rule, *cells[1:]])
    widths = [max(len(line[index]) for line in cells) for index in range(len(cells[0]))]
    return "\n".join(
        "  ".join(
            cell.rjust(width) if index in numeric else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in cells
    )


def _json_value(value: object) -> object:
    """NaN as null (JSON has no NaN), inside lists and objects too."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_json_value(item) for item in value)
    return value


def _json_row(row: ReportRow) -> dict[str, object]:
    data = asdict(row)
    data["settings"] = dict(row.settings)
    return {key: _json_value(value) for key, value in data.items()}
