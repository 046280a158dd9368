"""Report rows as aligned text, markdown, CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Container, Sequence
from dataclasses import asdict, fields

from axoexp.report.rows import ReportRow

FORMATS = {"text": "txt", "markdown": "md", "csv": "csv", "json": "json"}


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
    return grid([COLUMNS, *(_cells(row) for row in rows)], NUMERIC_COLUMNS, markdown=style == "markdown")


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


def _json_row(row: ReportRow) -> dict[str, object]:
    data = asdict(row)
    data["settings"] = dict(row.settings)
    return {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in data.items()}
