"""The command: ``python -m axoexp.report [--parent RUN_ID] [--format ...] [--out PNG]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from axoexp import names, report
from axoexp.errors import AxoexpError, NoSweepError, StoreError
from axoexp.report.figure import FIGURE, plot, title
from axoexp.report.rows import build_rows, sweep_runs
from axoexp.report.table import FORMATS, format_table
from axoexp.tracking import SQLITE_PREFIX, newest_run, resolve_tracking_uri, store_problem


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
        run_report(argv)
    except AxoexpError as error:
        print(f"axoexp.report: {error}", file=sys.stderr)
        sys.exit(2)


def run_report(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m axoexp.report", description=report.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
