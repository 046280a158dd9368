"""``python -m axoexp.sync [PATH ...]``: put what runs measured into MLflow, and end dead runs.

Each PATH is a journal (``journal.jsonl``) or a directory searched for journals (an
``outputs/`` tree, a sweep directory). A journal whose run the store lacks becomes a real
run (name, start and end times, params, tags, metric series, artifacts); one whose run was
left RUNNING (the process was killed) or stopped mid-run (the store died) is completed.
The run is found again by its journal id (tag ``axoexp.journal_id``) and marked
``axoexp.synced``, so syncing twice changes nothing.

Then every RUNNING run of the store whose process (tags ``process.pid``, ``hostname``) ran
on this host and is gone is ended KILLED with the reason, from its journal if it has one.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis

from axoexp import names, processes
from axoexp.journal import (
    ARTIFACT,
    DATASET,
    END,
    JOURNAL_FILE,
    METRICS,
    PARAMS,
    SERIES,
    START,
    TAGS,
    TRACKING_LOST,
    UPDATE,
    WINDOW,
    read_journal,
)
from axoexp.tracking import UNREACHABLE, Tracker, experiment_id, open_client, resolve_tracking_uri, store_problem
from axoexp.windows import MEASURED, WARMUP, UpdateTrace, log_traces

RUNNING = "RUNNING"
MEASURED_PARAM = "run.measured_updates"


@dataclass
class _AtTime:
    """A tracker whose metrics all carry one timestamp, so logging them again is a no-op."""

    tracker: Tracker
    timestamp_ms: int

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def log_series(self, name: str, values: list[float], first_step: int = 0) -> None:
        self.tracker.log_series(name, values, first_step, self.timestamp_ms)

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        self.tracker.log_metrics(metrics, step, self.timestamp_ms)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.tracker.set_tags(tags)


def find_journals(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(path.rglob(JOURNAL_FILE))
        elif path.is_file():
            yield path


def end_dead_run(client: MlflowClient, run_id: str, reason: str, end_time: int | None = None) -> None:
    """End a run whose process will never end it: KILLED, with the reason in ``axoexp.failure``."""
    client.set_tag(run_id, names.FAILURE, reason[:5000])
    client.set_terminated(run_id, status="KILLED", end_time=end_time)


def process_gone(tags: Mapping[str, str]) -> bool | None:
    """Whether the run's process is gone: ``None`` when that cannot be known here
    (no process tags, or another host)."""
    pid, host = tags.get(names.PROCESS_PID), tags.get(names.HOSTNAME)
    if not pid or not host or host != socket.gethostname():
        return None
    return not processes.alive(int(pid), tags.get(names.PROCESS_START))


def _run(client: MlflowClient, start: Mapping[str, Any]) -> Run | None:
    if start.get("run_id"):
        try:
            return client.get_run(start["run_id"])
        except MlflowException:
            pass
    found = client.get_experiment_by_name(start["experiment"])
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id], filter_string=f"tags.`{names.JOURNAL_ID}` = '{start['journal_id']}'", max_results=1
    )
    return runs[0] if runs else None


def sync_journal(client: MlflowClient, path: Path) -> str:
    """Upload one journal; return what was done, in words."""
    records = read_journal(path)
    starts = [record for record in records if record["kind"] == START]
    if not starts:
        return "skipped: not a journal (no start record)"
    start = starts[0]
    ends = [record for record in records if record["kind"] == END]
    run = _run(client, start)
    if run is not None and names.SYNCED in run.data.tags:
        return f"already synced to run {run.info.run_id}"
    stopped_mid_run = any(record["kind"] == TRACKING_LOST for record in records)
    if run is not None and run.info.status != RUNNING and not stopped_mid_run:
        return f"already complete in the store (run {run.info.run_id}, {run.info.status})"
    gone = process_gone(start["tags"])
    if not ends and not gone:
        where = start["tags"].get(names.HOSTNAME, "an unknown host")
        return (
            f"skipped: its process {start['tags'].get(names.PROCESS_PID)} on {where} "
            f"{'still runs' if gone is False else 'cannot be checked from this host'}"
        )
    if run is None:
        run = client.create_run(
            experiment_id(client, start["experiment"]),
            start_time=start["start_time"],
            run_name=start.get("run_name"),
            tags=start["tags"],
        )
    missing = _replay(Tracker(client, run.info.run_id), records)
    if ends:
        status, reason, end_time = ends[-1]["status"], ends[-1]["reason"], ends[-1]["end_time"]
    else:
        status, end_time = "KILLED", records[-1]["time"]
        reason = (
            f"process {start['tags'][names.PROCESS_PID]} on {start['tags'][names.HOSTNAME]} ended without "
            "ending its run (killed); completed from its journal by axoexp.sync"
        )
    tags = {names.SYNCED: f"from {path} at {get_current_time_millis()} ms"}
    if missing:
        tags[names.SYNCED] += f"; missing artifact files: {', '.join(missing)}"
    if reason:
        tags[names.FAILURE] = reason[:5000]
    Tracker(client, run.info.run_id).set_tags(tags)
    client.set_terminated(run.info.run_id, status=status, end_time=end_time)
    updates = sum(record["kind"] == UPDATE for record in records)
    return f"synced to run {run.info.run_id} ({status}, {updates} updates)"


def _replay(tracker: Tracker, records: list[dict[str, Any]]) -> list[str]:
    """Log every journaled call again (the store drops what it already has); rebuild the
    update series if the run died before logging them. Returns artifact files not found."""
    missing, series = [], set()
    for record in records:
        kind = record["kind"]
        if kind == START:
            continue
        if kind == PARAMS:
            tracker.log_params(record["params"])
        elif kind == TAGS:
            tracker.set_tags(record["tags"])
        elif kind == METRICS and record["metrics"]:
            tracker.log_metrics(record["metrics"], record["step"], record["timestamp"])
        elif kind == SERIES:
            series.add(record["name"])
            tracker.log_series(record["name"], record["values"], record["first_step"], record["timestamp"])
        elif kind == DATASET:
            tracker.log_dataset_record(record["dataset"], record["context"])
        elif kind == ARTIFACT:
            if Path(record["path"]).is_file():
                tracker.log_artifact(record["path"])
            else:
                missing.append(record["path"])
    updates = [record for record in records if record["kind"] == UPDATE]
    if updates and names.UPDATE_SERIES not in series:
        traces = {WARMUP: UpdateTrace(), MEASURED: UpdateTrace()}
        for update in sorted(updates, key=lambda record: record["index"]):
            traces[update["window"]].latencies_ms.append(update["ms"])
            traces[update["window"]].losses.append(update["loss"])
        log_traces(_AtTime(tracker, updates[-1]["time"]), traces[WARMUP], traces[MEASURED], _planned_measured(records))
    return missing


def _planned_measured(records: list[dict[str, Any]]) -> int:
    for record in records:
        if record["kind"] == WINDOW and record["window"] == MEASURED:
            return int(record["planned"])
    for record in records:
        if record["kind"] == PARAMS and MEASURED_PARAM in record["params"]:
            return int(record["params"][MEASURED_PARAM])
    return 0


def _running_runs(client: MlflowClient) -> Iterator[Run]:
    ids = [experiment.experiment_id for experiment in client.search_experiments()]
    token = None
    while ids:
        page = client.search_runs(ids, filter_string=f"attributes.status = '{RUNNING}'", page_token=token)
        yield from page
        token = page.token
        if not token:
            break


def end_dead_runs(client: MlflowClient) -> list[str]:
    """End every RUNNING run whose process ran on this host and is gone; what was done, in words."""
    done = []
    for run in list(_running_runs(client)):
        tags = run.data.tags
        if not process_gone(tags):
            continue
        journal = Path(tags[names.JOURNAL]) if names.JOURNAL in tags else None
        if journal is not None and journal.is_file():
            done.append(
                f"run {run.info.run_id}: its process is gone; journal {journal}: {sync_journal(client, journal)}"
            )
            continue
        end_dead_run(
            client,
            run.info.run_id,
            f"process {tags[names.PROCESS_PID]} on {tags[names.HOSTNAME]} is gone and never ended this run "
            "(killed, or its machine failed); ended by axoexp.sync",
        )
        done.append(f"run {run.info.run_id} ({run.info.run_name}): its process is gone; ended KILLED")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m axoexp.sync", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="journals, or directories to search for journal.jsonl")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="the MLflow store (default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
    )
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.paths if not path.exists()]
    if missing:
        print(f"axoexp.sync: no such journal or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    uri = resolve_tracking_uri(args.tracking_uri)
    problem = store_problem(uri)
    if problem:
        print(f"axoexp.sync: {problem}", file=sys.stderr)
        return 2
    try:
        client = open_client(uri)
        for path in find_journals(args.paths):
            print(f"{path}: {sync_journal(client, path)}", flush=True)
        for line in end_dead_runs(client):
            print(line, flush=True)
    except UNREACHABLE as error:
        print(
            f"axoexp.sync: MLflow tracking at {uri} is unreachable: {str(error).splitlines()[0][:300]}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
