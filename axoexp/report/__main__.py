"""The command: ``python -m axoexp.report [--parent RUN_ID] [--format ...] [--out PNG]``."""

from __future__ import annotations

if __name__ == "__main__":  # python -m: run_command imports this module anew, Ctrl-C in its imports one line
    from axoexp.signals import run_command

    run_command("axoexp.report", "axoexp.report.__main__")

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from matplotlib.backend_bases import FigureCanvasBase
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from axoexp import names, report
from axoexp.errors import NoSweepError, ReportError, ReportWriteError
from axoexp.readers import StoreReader, add_store_option, reading
from axoexp.redact import redacted
from axoexp.report.figure import FIGURE, plot, title
from axoexp.report.length_figure import LENGTHS_FIGURE, plot_lengths
from axoexp.report.pareto import (
    PARETO_FIGURE,
    format_front,
    pareto_front,
    plot_front,
    reused_trials,
    study_objectives,
    study_runs,
)
from axoexp.report.rows import ReportRow, build_rows, sweep_runs
from axoexp.report.table import BUCKETS_CSV, FORMATS, format_buckets, format_table
from axoexp.stdout import print_out
from axoexp.tracking import newest_run, run_or_none
from axoexp.versions import VersionAction

LISTED_EXPERIMENTS = 10
"""Up to how many experiments a line naming a missing one lists."""


def latest_parent(client: MlflowClient, experiment: str) -> Run:
    """The newest sweep's parent in ``experiment``; one line where there is none, or no such experiment."""
    if client.get_experiment_by_name(experiment) is None:
        found = [known.name for known in client.search_experiments(max_results=LISTED_EXPERIMENTS + 1)]
        listed = f" (its experiments: {', '.join(found)})" if 0 < len(found) <= LISTED_EXPERIMENTS else ""
        raise NoSweepError(
            f"no experiment {experiment!r} in {redacted(client.tracking_uri)}{listed}; --experiment names one, "
            "or run a sweep: python -m axoexp -m ..."
        )
    run = newest_run(client, experiment, f"tags.`{names.SWEEP_ROLE}` = 'parent'")
    if run is None:
        raise NoSweepError(f"no sweep in experiment {experiment!r}; run one with python -m axoexp -m ...")
    return run


def default_figure(parent: Run) -> Path:
    """:data:`FIGURE` in the sweep's own output directory where it still exists, else in the current
    directory; one line where it cannot be written."""
    sweep_dir = Path(parent.data.tags.get(names.SWEEP_DIR, "."))
    figure = (sweep_dir if sweep_dir.is_dir() else Path(".")) / FIGURE
    reason = unwritable(figure)
    if reason:
        raise ReportError(f"cannot write {figure} ({reason}); --out chooses another place")
    return figure


def figure_path(out: Path) -> Path:
    """Where ``--out`` puts the figure: a file of a type matplotlib writes, in an existing directory,
    or :data:`FIGURE` in an existing directory, where a file can be written; one line otherwise."""
    if out.is_dir():
        figure = out / FIGURE
    else:
        types = FigureCanvasBase.get_supported_filetypes()
        if out.suffix.lstrip(".").lower() not in types:
            raise ReportError(
                f"--out {out}: neither an existing directory nor a figure file; end it in one of "
                + ", ".join(f".{kind}" for kind in sorted(types))
            )
        if not out.parent.is_dir():
            raise ReportError(f"--out {out}: directory {out.parent} does not exist; create it or choose another path")
        figure = out
    reason = unwritable(figure)
    if reason:
        where = "there" if figure == out else figure
        raise ReportError(f"--out {out}: cannot write {where} ({reason}); choose another path")
    return figure


def unwritable(path: Path) -> str:
    """Why no file can be written at ``path``, in the system's words, or ``""``: it is opened to append
    (nothing is written) and, where it did not exist, removed again."""
    existed = os.path.lexists(path)  # a link, even a dangling one, is kept
    try:
        with path.open("ab"):
            pass
    except OSError as error:
        return error.strerror or str(error)
    if not existed:
        path.unlink()
    return ""


def named_run(client: MlflowClient, run_id: str) -> Run:
    """The run ``--parent`` names; one line if there is none."""
    run = run_or_none(client, run_id)
    if run is None:
        raise NoSweepError(f"--parent {run_id}: no such run at {redacted(client.tracking_uri)}")
    return run


def single_run_line(run: Run) -> str:
    """A run that is no sweep's parent, in one line: what it ran, its status, median and labels; for
    a sweep's job, the command that reports its sweep."""
    tags, metrics = run.data.tags, run.data.metrics
    parent = tags.get(names.PARENT_RUN_ID)
    what = f"a job of sweep {parent}, not a sweep" if parent else "a single run, not a sweep"
    sweep = f"; its sweep's report: python -m axoexp.report --parent {parent}" if parent else ""
    median, p10, p90 = (metrics.get(names.update_metric(stat)) for stat in ("median", "p10", "p90"))
    timing = (
        f"median {median:.3f} ms (p10 {p10:.3f}, p90 {p90:.3f})"
        if median is not None and p10 is not None and p90 is not None
        else "no latency logged"
    )
    return (
        f"run {run.info.run_id} '{run.info.run_name}' is {what}: "
        f"{tags.get(names.component_tag('executor'), '?')} {tags.get(names.SHAPE, '?')} {run.info.status}, "
        f"{timing}, contention {tags.get(names.TIMING_CONTENTION, '?')}, noise {tags.get(names.TIMING_NOISE, '?')}"
        f"{sweep}"
    )


def no_runs_line(parent: Run) -> str:
    """A sweep without a run to report (every job refused, or its launcher failed), in one line, with why."""
    why = parent.data.tags.get(names.FAILURE)
    state = (
        "it is still RUNNING (no job has started a run yet)"
        if parent.info.status == "RUNNING"
        else f"it ended {parent.info.status}{f': {why}' if why else ''}"
    )
    return f"sweep {parent.info.run_id} '{parent.info.run_name}' has no runs to report: {state}"


def main(argv: list[str] | None = None) -> None:
    """Print the report of a sweep; bad input or a store that cannot be read is one line and exit 2 or 1
    (:mod:`axoexp.readers`)."""
    with reading("axoexp.report") as store:
        run_report(store, argv)


def run_report(store: StoreReader, argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m axoexp.report", description=report.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action=VersionAction)
    add_store_option(parser)
    parser.add_argument("--experiment", default="axoexp")
    parser.add_argument("--parent", default=None, help="the sweep's parent run id (default: the newest sweep)")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="how the table prints; markdown, csv and json are also written as report.md|csv|json",
    )
    parser.add_argument(
        "--include-contended",
        action="store_true",
        help="pool runs measured under contention, with high noise or without their load recorded with the "
        "quiet ones and give them "
        "speedups (default: rows of their own, marked, without a speedup)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"the figure's path, or a directory for {FIGURE}; the other files go beside it "
        f"(default: {FIGURE} in the sweep's output directory)",
    )
    args = parser.parse_args(argv)
    out = figure_path(args.out) if args.out else None  # refused before the store is read
    client = store.open(args.tracking_uri, "run a sweep first: python -m axoexp -m ...")
    parent = named_run(client, args.parent) if args.parent else latest_parent(client, args.experiment)
    runs = sweep_runs(client, parent)
    if not runs:
        is_sweep = parent.data.tags.get(names.SWEEP_ROLE) == "parent"
        print_out(no_runs_line(parent) if is_sweep else single_run_line(parent))
        return
    figure = out or default_figure(parent)  # refused before anything is printed
    rows = build_rows(runs, client, parent.info.run_id, include_contended=args.include_contended)
    table = format_table(rows, args.format)
    heading = f"{parent.info.run_name} ({parent.info.status}, parent run {parent.info.run_id})\n"
    print_out((heading if args.format == "text" else "") + table)  # a reader gone (| head): the files still follow
    objectives = study_objectives(parent)  # an Optuna search's (hydra/sweeper=optuna), else none
    trials = study_runs(client, parent) if objectives else []
    front = pareto_front(trials, objectives)
    front_text = format_front(parent, trials, front, objectives, reused_trials(client, parent)) if objectives else ""
    if objectives and args.format == "text":
        print_out(front_text)
    elif objectives:  # stdout stays the table
        print(front_text, file=sys.stderr)
    written = write_files(rows, figure, title(parent, runs), table, args.format)
    if objectives:
        written.append(figure.with_name(PARETO_FIGURE))
        with local_file(written[-1]):
            plot_front(trials, front, objectives, title(parent, runs), written[-1])
    if store.read_only:
        logged = f"not logged to the parent run: the store is read-only, {store.read_only}"
    else:
        for path in written:
            client.log_artifact(parent.info.run_id, str(path))
        logged = "also logged to the parent run"
    print(f"report: {', '.join(map(str, written))} ({logged})", file=sys.stderr)


@contextmanager
def local_file(path: Path) -> Iterator[None]:
    """Writing ``path``: an OSError (a full disk, no permission) as one line naming the file, not as the store's."""
    try:
        yield
    except OSError as error:
        raise ReportWriteError(
            f"could not write {path}: {error.strerror or error}; --out chooses another place"
        ) from None


def write_files(rows: list[ReportRow], figure: Path, heading: str, table: str, style: str) -> list[Path]:
    """The figure at ``figure``, and beside it the lengths figure, the table file (``style`` not text)
    and the buckets CSV where they apply; the paths written."""
    written = [figure]
    with local_file(figure):
        plot(rows, heading, figure)
    if any(row.length_buckets for row in rows):  # runs with population.lengths: latency against length
        written.append(figure.with_name(LENGTHS_FIGURE))
        with local_file(written[-1]):
            plot_lengths(rows, heading, written[-1])
    if style != "text":
        written.append(figure.with_name(f"report.{FORMATS[style]}"))
        with local_file(written[-1]):
            written[-1].write_text(table + "\n")
    buckets = format_buckets(rows, "csv") if style == "csv" else ""
    if buckets:  # a CSV row has no room for its buckets: they are a CSV of their own
        written.append(figure.with_name(BUCKETS_CSV))
        with local_file(written[-1]):
            written[-1].write_text(buckets + "\n")
    return written
