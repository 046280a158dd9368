"""python -m axoexp.sync [PATH ...]: put what runs measured into MLflow, and end dead runs.

Each PATH is a journal (journal.jsonl) or a directory searched for journals (an outputs/
tree, a sweep directory). Each journal's run goes to the store the journal records (the
run's tracking.uri; a relative sqlite path is taken from the run's working directory),
unless --tracking-uri names another: then the line says it overrides, and a journal whose
run is in its own store is skipped, saying so, rather than copied. A journal whose run the
store lacks becomes a real run (name, start and end times, params, tags, metric series,
artifacts); one whose run was left RUNNING (the process was killed) or stopped mid-run (the
store died) is completed. The run is found again by its journal id (tag axoexp.journal_id)
and marked axoexp.synced, so syncing twice changes nothing.

A sweep's parent run the sweep could not end (its store failed as it ended) is ended as the
sweep decided, from the journal it kept in its folder (status, reason; axoexp.synced).

Then every RUNNING run of those stores (of the default store where no journal was given)
whose process (tags process.pid, hostname) ran on this host and is gone is ended KILLED
with the reason, from its journal if it has one. Where no journal was given or found and the
default store is a sqlite file that does not exist (or is empty), nothing is created: one line
says so, exit 0.

Exit status: 0 done; 2 a path that does not exist, a journal that cannot be read or a file that
is no journal (the others are synced) or a store that is no usable MLflow store (damaged,
half-built, an older schema, a file store, a file that is no MLflow store, a database without its
driver, one that cannot be written); 1 a store that was locked by another process for 20 s or did
not answer (the same command completes the rest later); 130 Ctrl-C.
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m: run_command imports this module anew, Ctrl-C in its imports one line
    from axoexp.signals import run_command

    run_command("axoexp.sync")

import argparse
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Run
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis

from axoexp import names, processes
from axoexp.errors import StoreLockedError, quiet_store_errors
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
    JournalLines,
    read_journal_lines,
)
from axoexp.signals import CTRL_C, OUTSIDE_A_RUN_EXIT
from axoexp.stdout import print_out, say
from axoexp.tracking import (
    SQLITE_PREFIX,
    TRACKING_URI_KEY,
    TRACKING_URI_OPTION,
    UNREACHABLE,
    Tracker,
    answering_client,
    bound_http_retries,
    experiment_id,
    no_store_yet,
    open_client,
    resolve_tracking_uri,
    run_or_none,
    sqlite_damaged,
    sqlite_path,
    store_problem,
    store_unreachable,
    tracking_uri_key,
)
from axoexp.versions import VersionAction
from axoexp.windows import MEASURED, WARMUP, UpdateTrace, log_traces

COMMAND = "axoexp.sync"
"""How the command names itself in its lines."""
RUNNING = "RUNNING"
INTERRUPTED = (
    f"{CTRL_C}; what was uploaded stays, and running the same command again completes the rest "
    "(nothing is logged twice)"
)
MEASURED_PARAM = "run.measured_updates"


def find_journals(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(found for found in path.rglob(JOURNAL_FILE) if found.is_file())
        elif path.is_file():
            yield path


def end_dead_run(client: MlflowClient, run_id: str, reason: str, end_time: int | None = None) -> None:
    """End a run whose process will never end it: KILLED, with the reason in ``axoexp.failure``."""
    client.set_tag(run_id, names.FAILURE, reason)
    client.set_terminated(run_id, status="KILLED", end_time=end_time)


def process_gone(tags: Mapping[str, str]) -> bool | None:
    """Whether the run's process is gone: ``None`` when that cannot be known here
    (no process tags, or another host)."""
    pid, host = tags.get(names.PROCESS_PID), tags.get(names.HOSTNAME)
    if not pid or not host or host != socket.gethostname():
        return None
    return not processes.alive(int(pid), tags.get(names.PROCESS_START))


def _run(client: MlflowClient, start: Mapping[str, Any] | None, journal_id: str | None) -> Run | None:
    """The journal's run in the store: by the start record's run id, else by its journal id."""
    if start is not None and start.get("run_id"):
        run = run_or_none(client, start["run_id"])
        if run is not None:
            return run
    if journal_id is None:
        return None
    if start is not None:
        found = client.get_experiment_by_name(start["experiment"])
        experiments = [found.experiment_id] if found is not None else []
    else:  # the start record is damaged: look in every experiment
        experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    if not experiments:
        return None
    runs = client.search_runs(experiments, filter_string=f"tags.`{names.JOURNAL_ID}` = '{journal_id}'", max_results=1)
    return runs[0] if runs else None


def _journal_ids(records: list[dict[str, Any]]) -> list[str]:
    """The journals whose records these are (a record of an older journal names none, its start does)."""
    return list(dict.fromkeys(journal_id for journal_id in map(_journal_of, records) if journal_id))


def _processes(records: list[dict[str, Any]]) -> str:
    starts = [record["tags"] for record in records if record["kind"] == START]
    return ", ".join(f"{tags.get(names.PROCESS_PID)} on {tags.get(names.HOSTNAME)}" for tags in starts) or "unknown"


def stored_updates(client: MlflowClient, run_id: str) -> int:
    """How many updates of the run the store holds (steps of its per-update latency series)."""
    return len({metric.step for metric in client.get_metric_history(run_id, names.UPDATE_SERIES)})


def sync_journal(client: MlflowClient, path: Path) -> str:
    """Put one journal into its run, whatever state the store left the run in; return what was
    done, in words (damaged lines named by number).

    The run is created if the store lacks it; completed if the store holds fewer of its
    updates than the journal, or it stopped answering mid-run; ended if it is still RUNNING
    and its process is gone. Everything is logged with the journal's own timestamps and
    update indices, so syncing again logs nothing twice. A journal two runs wrote (processes
    given one output folder) is synced run by run, each record to the run it names.
    """
    contents = read_journal_lines(path)
    records, damage = contents.records, contents.damage()
    said = f"; {damage}" if damage else ""
    cut_line = contents.damaged[-1] if contents.cut_at_end else None
    ids = _journal_ids(records)
    if len(ids) <= 1:
        return _sync_run(client, path, records, cut_line, said)
    owners = [_journal_of(record) for record in records]
    if None in owners:  # an older journal's records name no journal: whose they are is not known
        return (
            f"refused: it holds the records of {len(ids)} runs (processes {_processes(records)}) that shared one "
            f"output folder, and some records name no run; they are not merged{said}"
        )
    done = [
        _sync_run(
            client,
            path,
            [record for record, owner in zip(records, owners, strict=True) if owner == journal_id],
            cut_line if owners[-1] == journal_id else None,  # a line cut off at the end: the last writer's
            said,
        )
        for journal_id in ids
    ]
    return f"it holds the records of {len(ids)} runs that shared one output folder, each synced apart: " + "; ".join(
        done
    )


def _journal_of(record: Mapping[str, Any]) -> str | None:
    """The journal a record belongs to: its own ``journal`` key, or a start record's journal id."""
    return record.get("journal") or (record.get("journal_id") if record["kind"] == START else None)


def _sync_run(client: MlflowClient, path: Path, records: list[dict[str, Any]], cut_line: int | None, said: str) -> str:
    """:func:`sync_journal` for the records of one run (``cut_line``: the journal's last line, cut off
    mid-write, where it is this run's)."""
    starts = [record for record in records if record["kind"] == START]
    start = starts[0] if starts else None
    ids = _journal_ids(records)
    run = _run(client, start, ids[0] if ids else None)
    if start is None and run is None:
        return f"skipped: no readable start record, and no run in the store has its journal id{said}"
    tags = start["tags"] if start is not None else run.data.tags  # type: ignore[union-attr]
    updates = [record for record in records if record["kind"] == UPDATE]
    ends = [record for record in records if record["kind"] == END]
    stopped_mid_run = any(record["kind"] == TRACKING_LOST for record in records)
    if run is not None and run.info.status != RUNNING:
        complete = stored_updates(client, run.info.run_id) >= len(updates)
        if complete and (names.SYNCED in run.data.tags or not stopped_mid_run):
            already = "already synced to" if names.SYNCED in run.data.tags else "already complete in the store:"
            return f"{already} run {run.info.run_id} ({run.info.status}, {_counted(updates, tags)}){said}"
    gone = process_gone(tags)
    if not ends and not gone and (run is None or run.info.status == RUNNING):
        where = tags.get(names.HOSTNAME, "an unknown host")
        return (
            f"skipped: its process {tags.get(names.PROCESS_PID)} on {where} "
            f"{'still runs' if gone is False else 'cannot be checked from this host'}{said}"
        )
    if run is None:
        assert start is not None
        if tags.get(names.SWEEP_ROLE) == "parent":  # a new parent would hold none of the sweep's runs
            return f"skipped: the sweep's parent run {start['run_id']} is not in this store{said}"
        run = client.create_run(
            experiment_id(client, start["experiment"]),
            start_time=start["start_time"],
            run_name=start.get("run_name"),
            tags=start["tags"],
        )
    missing = _replay(Tracker(client, run.info.run_id), records)
    status, reason, end_time = _ending(run, records, ends, cut_line, tags)
    synced = {names.SYNCED: f"from {path} at {get_current_time_millis()} ms{said}"}
    if start is None:
        synced[names.SYNCED] += "; its start record was damaged: the run was found by its journal id"
    if missing:
        synced[names.SYNCED] += f"; missing artifact files: {', '.join(missing)}"
    stored = run.data.tags.get(names.FAILURE)
    if reason and (stored is None or reason.startswith(stored)):  # the first failure's reason is kept, or
        synced[names.FAILURE] = reason  # completed: a sweep wrote it, then failed to end the parent
    Tracker(client, run.info.run_id).set_tags(synced)
    client.set_terminated(run.info.run_id, status=status, end_time=end_time)
    return f"synced to run {run.info.run_id} ({status}, {_counted(updates, tags)}){said}"


def _counted(updates: list[dict[str, Any]], tags: Mapping[str, str]) -> str:
    """``302 updates: 2 warm-up, 300 measured``: the journal's updates, by window; a sweep's parent
    measures none, its journal keeps the end its sweep decided."""
    if tags.get(names.SWEEP_ROLE) == "parent":
        return "the end its sweep decided"
    measured = sum(1 for update in updates if update.get("window") == MEASURED)
    return f"{len(updates)} updates: {len(updates) - measured} warm-up, {measured} measured"


def _ending(
    run: Run, records: list[dict[str, Any]], ends: list[dict[str, Any]], cut_line: int | None, tags: Mapping[str, str]
) -> tuple[str, str | None, int | None]:
    """The run's end status, reason and time: the journal's end record where it has one; else
    what the store says where something (a sweep) already ended the run; else KILLED, or, where
    the journal stops in a cut line (a full disk, a crash), FAILED with the end unknown: a run
    that may have finished is never called killed."""
    if ends:
        return ends[-1]["status"], ends[-1]["reason"], ends[-1]["end_time"]
    if run.info.status != RUNNING:
        return run.info.status, None, run.info.end_time
    process = f"process {tags.get(names.PROCESS_PID)} on {tags.get(names.HOSTNAME)}"
    last_time = records[-1]["time"] if records else None
    if cut_line is not None:
        return (
            "FAILED",
            f"its journal stops at line {cut_line}, cut off mid-write (a full disk or a crash), and "
            f"{process} is gone: how the run ended is not known; completed from its journal by axoexp.sync",
            last_time,
        )
    return (
        "KILLED",
        f"{process} ended without ending its run (killed); completed from its journal by axoexp.sync",
        last_time,
    )


@dataclass
class _AtIndices:
    """A tracker for rebuilding per-update series from journal records: every metric carries
    one timestamp (logging it again is a no-op) and the i-th value of a series is logged at
    the i-th update's own index, so a damaged record never shifts the updates after it."""

    tracker: Tracker
    timestamp_ms: int
    steps: list[int]

    @property
    def run_id(self) -> str:
        return self.tracker.run_id

    def log_series(self, name: str, values: list[float], first_step: int = 0) -> None:
        metrics = [
            Metric(name, float(value), self.timestamp_ms, self.steps[first_step + offset])
            for offset, value in enumerate(values)
        ]
        self.tracker.log_metric_objects(metrics)

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        self.tracker.log_metrics(metrics, step, self.timestamp_ms)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.tracker.set_tags(tags)


def _replay(tracker: Tracker, records: list[dict[str, Any]]) -> list[str]:
    """Log every journaled call again (the store drops what it already has); rebuild the
    update series if the run died before logging them, the noise judged within the length buckets
    the updates' records name, as the run judged it. Returns artifact paths not found."""
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
            if Path(record["path"]).exists():  # a file, or a folder such as .hydra/
                tracker.log_artifact(record["path"])
            else:
                missing.append(record["path"])
    updates = sorted(
        {record["index"]: record for record in records if record["kind"] == UPDATE}.values(),
        key=lambda record: record["index"],
    )
    if updates and names.UPDATE_SERIES not in series:
        traces = {WARMUP: UpdateTrace(), MEASURED: UpdateTrace()}
        for window in (WARMUP, MEASURED):
            for update in updates:
                if update["window"] == window:
                    traces[window].latencies_ms.append(update["ms"])
                    traces[window].losses.append(update["loss"])
                    if "bucket" in update:  # written where the batches' lengths differ
                        traces[window].buckets.append(update["bucket"])
        steps = [update["index"] for window in (WARMUP, MEASURED) for update in updates if update["window"] == window]
        at = _AtIndices(tracker, max(update["time"] for update in updates), steps)
        log_traces(at, traces[WARMUP], traces[MEASURED], _planned_measured(records))
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


def _run_journal(tags: Mapping[str, str]) -> Path | None:
    """The run's journal (tag ``axoexp.journal``); a sweep's parent's is in its sweep's folder, where
    the sweep kept the end it could not write (:func:`~axoexp.journal.journal_end`)."""
    if names.JOURNAL in tags:
        return Path(tags[names.JOURNAL])
    return Path(tags[names.SWEEP_DIR]) / JOURNAL_FILE if names.SWEEP_DIR in tags else None


def end_dead_runs(client: MlflowClient) -> list[str]:
    """End every RUNNING run whose process ran on this host and is gone; what was done, in words."""
    done = []
    for run in list(_running_runs(client)):
        tags = run.data.tags
        if not process_gone(tags):
            continue
        reason = (
            f"process {tags[names.PROCESS_PID]} on {tags[names.HOSTNAME]} is gone and never ended this run "
            "(killed, or its machine failed); ended by axoexp.sync"
        )
        journal = _run_journal(tags)
        if journal is not None and journal.is_file():
            outcome = sync_journal(client, journal)
            done.append(f"run {run.info.run_id}: its process is gone; journal {journal}: {outcome}")
            if client.get_run(run.info.run_id).info.status != RUNNING:
                continue
            reason += f"; its journal could not complete it ({outcome})"
        end_dead_run(client, run.info.run_id, reason)
        done.append(f"run {run.info.run_id} ({run.info.run_name}): its process is gone; ended KILLED")
    return done


def journal_store(contents: JournalLines) -> str | None:
    """The store a journal's run was logged to: its start record's ``tracking_uri``, a relative
    ``sqlite:///`` path taken from the run's working directory (from this one for a journal that
    predates recording it); ``None`` where the start record is unreadable."""
    start = next((record for record in contents.records if record["kind"] == START), None)
    if start is None or not start.get("tracking_uri"):
        return None
    return absolute_store(start["tracking_uri"], Path(start.get("cwd") or "."))


def absolute_store(uri: str, base: Path) -> str:
    """``uri`` with a relative sqlite database path made absolute against ``base``; other URIs as they are."""
    path = sqlite_path(uri)
    if path is None or path.is_absolute():
        return uri
    query = uri.partition("?")[2]
    return f"{SQLITE_PREFIX}{(base / path).resolve()}" + (f"?{query}" if query else "")


def run_in_store(uri: str, contents: JournalLines) -> Run | None:
    """The journal's run in the store ``uri`` where that store exists and answers, else ``None``;
    nothing is created."""
    if store_problem(uri) or no_store_yet(uri):
        return None
    ids = _journal_ids(contents.records)
    start = next((record for record in contents.records if record["kind"] == START), None)
    try:
        return _run(answering_client(uri), start, ids[0] if len(ids) == 1 else None)
    except UNREACHABLE:
        return None


def not_a_journal(contents: JournalLines) -> str | None:
    """Why a file is no journal (``python -m axoexp.sync README.md``): none of its lines is a record,
    and it is more than one write cut off (a process killed as it wrote its start record); else ``None``."""
    if contents.records or not contents.damaged or (contents.damaged == [1] and contents.cut_at_end):
        return None
    return f"none of its {len(contents.damaged)} lines is a journal record: it is no axoexp journal"


def _target(contents: JournalLines, explicit: str | None, default: str) -> tuple[str, str]:
    """The store a journal's run goes to and what to say about it: its own store, unless
    ``--tracking-uri`` names another (said; and refused, in words, where its own store has the run)."""
    own = journal_store(contents)
    if explicit is None or own is None:
        return own or default, ""
    if own == absolute_store(explicit, Path.cwd()):
        return explicit, ""
    earlier = run_in_store(own, contents)
    if earlier is not None:
        return "", (
            f"skipped: its run {earlier.info.run_id} is in its own store {own} ({earlier.info.status}); "
            f"--tracking-uri {explicit} would make a second copy (without --tracking-uri, sync completes it there)"
        )
    return explicit, f" (--tracking-uri overrides its own store {own}, which does not have the run)"


def _store_key(uri: str, explicit: str | None, default: str) -> str:
    """Where ``uri`` was set, as a line names it: ``--tracking-uri``, ``$MLFLOW_TRACKING_URI`` (or
    ``tracking.uri``, for the default), or a journal's own store, its run's ``tracking.uri``."""
    if explicit is not None and uri == explicit:
        return TRACKING_URI_OPTION
    return tracking_uri_key(None) if uri == default else TRACKING_URI_KEY


def main(argv: list[str] | None = None) -> int:
    """The command; its exit status as the module says (one line on Ctrl-C: a journal cut off mid-upload
    is completed by the same command again)."""
    try:
        return _main(argv)
    except StoreLockedError as error:
        say(COMMAND, error)
        return 1
    except KeyboardInterrupt:
        say(COMMAND, INTERRUPTED)
        return OUTSIDE_A_RUN_EXIT


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m axoexp.sync", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument("paths", nargs="*", type=Path, help="journals, or directories to search for journal.jsonl")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="the MLflow store for every journal, overriding the store each journal records (default: each "
        "journal's own store; where none is recorded or no journal is given: $MLFLOW_TRACKING_URI, else "
        "sqlite:///mlflow.db)",
    )
    args = parser.parse_args(argv)
    bound_http_retries()
    quiet_store_errors()
    missing = [str(path) for path in args.paths if not path.exists()]
    if missing:
        say(COMMAND, f"no such journal or directory: {', '.join(missing)}")
        return 2
    default = resolve_tracking_uri(args.tracking_uri)
    journals = list(find_journals(args.paths))
    if args.paths and not journals:
        print_out(f"no {JOURNAL_FILE} below {', '.join(map(str, args.paths))}: nothing to upload")
    absent = None if journals else no_store_yet(default)
    if absent:  # no RUNNING run to end either: the store is not created for nothing
        if not args.paths:
            print_out(
                f"no journal given, and the MLflow store {default} {absent}: nothing to sync; "
                f"name journals or the folders that hold them (python -m axoexp.sync outputs/)"
            )
        return 0
    status, targets = 0, list[tuple[Path, str, str]]()
    for path in journals:  # each read once here; sync_journal reads it again as it syncs
        try:
            contents = read_journal_lines(path)
        except OSError as error:
            refused: str | None = f"it cannot be read ({error.strerror or error})"
        else:
            refused = not_a_journal(contents)
            if refused is None:
                targets.append((path, *_target(contents, args.tracking_uri, default)))
        if refused is not None:
            print_out(f"{path}: skipped: {refused}")
            status = 2
    stores = list(dict.fromkeys(uri for _, uri, _ in targets if uri)) if journals else [default]
    problems = {
        uri: problem for uri in stores if (problem := store_problem(uri, _store_key(uri, args.tracking_uri, default)))
    }
    if problems and len(problems) == len(stores):
        say(COMMAND, "; ".join(problems.values()))
        return 2
    clients: dict[str, MlflowClient] = {}

    def client(uri: str) -> MlflowClient:
        if uri not in clients:
            clients[uri] = open_client(uri)
        return clients[uri]

    for path, uri, said in targets:
        if not uri:  # its run is in its own store
            print_out(f"{path}: {said}")
        elif uri in problems:
            print_out(f"{path}: skipped: {problems[uri]}")
            status = 2
        else:  # stdout is written outside the try: a reader gone (| head) is no unreachable store
            try:
                synced = sync_journal(client(uri), path)
            except UNREACHABLE as error:
                say(COMMAND, f"{path}: {store_unreachable(uri, error)}")
                status = max(status, _failed_status(uri, error))
            else:
                where = "" if uri == absolute_store(default, Path.cwd()) and not said else f" in {uri}"
                print_out(f"{path}: {synced}{where}{said}")
    for uri in (uri for uri in stores if uri not in problems):
        try:
            ended = end_dead_runs(client(uri))
        except UNREACHABLE as error:
            say(COMMAND, store_unreachable(uri, error))
            status = max(status, _failed_status(uri, error))
        else:
            for line in ended:
                print_out(line)
    return status


def _failed_status(uri: str, error: BaseException) -> int:
    """2 for a sqlite store found damaged while syncing (no retry mends it), else 1 (locked, silent)."""
    return 2 if sqlite_damaged(uri, error) is not None else 1
