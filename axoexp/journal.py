"""Every run's durable local record, written before anything goes to MLflow.

The journal is ``<output_dir>/journal.jsonl``: one JSON object per line, appended and flushed
as the run goes: its start (name, tags, store, process), every params/tags/metrics/artifact
call, every timed update (outside the clock, as an :class:`~axoexp.measure.Observer`), and
its end. A process that is killed, a store that dies mid-run or a full disk elsewhere
therefore loses nothing measured: ``python -m axoexp.sync`` uploads the journal later
(:mod:`axoexp.sync`). Records carry their own timestamps, so uploading one twice logs
nothing twice.

Each line is ``<crc32 of the JSON, 8 hex digits> <JSON>`` and each record names its journal
(``"journal": <id>``), so a reader can tell a damaged or cut line from a good one and the
records of one run from another's (:func:`read_journal_lines`). Lines of older journals,
plain JSON, are read unverified.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mlflow.data.dataset import Dataset
from mlflow.entities import Metric, Run
from mlflow.utils.time import get_current_time_millis

from axoexp import names, processes, signals
from axoexp.errors import TrackingUnavailableError
from axoexp.outputs import write_atomically
from axoexp.redact import redacted
from axoexp.signals import Interrupted
from axoexp.tracking import (
    UNREACHABLE,
    StoreOpening,
    Tracker,
    metric_value,
    store_failure,
    store_lock,
    store_reason,
    store_unreachable,
    with_mlflow_context,
)
from axoexp.windows import Observer

JOURNAL_FILE = "journal.jsonl"
START, PARAMS, TAGS, METRICS, SERIES, ARTIFACT = "start", "params", "tags", "metrics", "series", "artifact"
DATASET = "dataset"
WINDOW, WINDOW_END, UPDATE, TRACKING_LOST, END = "window", "window_end", "update", "tracking_lost", "end"
NO_RUN_YET = "no run was created yet, so none was left unfinished"
"""What a stop signal while the store is still being opened left behind, as the CLI's line says."""


@dataclass
class Journal:
    """An append-only JSON-lines file. A write that fails (e.g. disk full) stops the journal,
    not the run: the reason is kept in :attr:`lost` and reported on the run."""

    path: Path
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lost: str | None = None

    def __post_init__(self) -> None:
        self._stream: TextIO | None
        try:
            self._stream = self.path.open("a", encoding="utf-8")
        except OSError as error:
            self._stream = None
            self.lost = f"cannot open {self.path}: {error}"

    def append(self, kind: str, **fields: Any) -> None:
        if self._stream is None:
            return
        line = encode_record({"kind": kind, "time": get_current_time_millis(), "journal": self.id, **fields})
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except OSError as error:
            self._fail(error)

    def sync(self) -> None:
        """Force what was written onto the disk (window ends, run end)."""
        if self._stream is None:
            return
        try:
            self._stream.flush()
            os.fsync(self._stream.fileno())
        except OSError as error:
            self._fail(error)

    def close(self) -> None:
        self.sync()
        if self._stream is not None:
            try:
                self._stream.close()
            except OSError:
                pass
            self._stream = None

    def _fail(self, error: OSError) -> None:
        self.lost = f"writing {self.path} failed: {error}"
        try:
            if self._stream is not None:
                self._stream.close()
        except OSError:
            pass
        self._stream = None


def encode_record(record: Mapping[str, Any]) -> str:
    """One journal line: the record's JSON after its CRC-32, so damage is found on reading."""
    text = json.dumps(record, default=str)
    return f"{zlib.crc32(text.encode()):08x} {text}"


@dataclass
class JournalLines:
    """What a journal holds: its good records (each with its ``line`` number, from 1) and the
    numbers of the lines that failed their checksum or do not parse."""

    records: list[dict[str, Any]]
    damaged: list[int]
    cut_at_end: bool  # the last line is damaged and lacks its newline: the write was cut off

    def damage(self) -> str:
        """The damaged lines in words ("" when none)."""
        if not self.damaged:
            return ""
        lines = ", ".join(map(str, self.damaged[:20])) + (" ..." if len(self.damaged) > 20 else "")
        cut = " (the last one cut off mid-write)" if self.cut_at_end else ""
        return f"damaged journal lines skipped: {lines}{cut}"


def read_journal_lines(path: Path) -> JournalLines:
    """Every record of a journal that passes its checksum; the others by line number."""
    records, damaged = [], []
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, raw in enumerate(lines, start=1):
        record = _decode(raw.decode("utf-8", errors="replace"))
        if record is None:
            damaged.append(number)
        else:
            records.append({**record, "line": number})
    cut = bool(damaged) and damaged[-1] == len(lines) and not data.endswith(b"\n")
    return JournalLines(records, damaged, cut)


def _decode(line: str) -> dict[str, Any] | None:
    checksum, _, text = line.partition(" ")
    if line.startswith("{"):  # an older journal's line, without a checksum
        text = line
    elif len(checksum) != 8 or checksum != f"{zlib.crc32(text.encode()):08x}":
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("kind"), str) else None


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The good records of a journal (:func:`read_journal_lines` says which lines were not)."""
    return read_journal_lines(path).records


def first_record(path: Path, kind: str) -> dict[str, Any] | None:
    """A journal's first good record of ``kind``, or ``None``: read line by line, and only the lines
    that name the kind decoded (a long run's journal holds a record per update)."""
    marker = json.dumps({"kind": kind})[1:-1]  # '"kind": "start"', as encode_record writes it
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            record = _decode(line.rstrip("\n")) if marker in line else None
            if record is not None and record["kind"] == kind:
                return record
    return None


@dataclass
class JournaledLog(Observer):
    """The run's :class:`~axoexp.tracking.RunLog`: every call goes to the journal first, then
    to MLflow. Params, tags and metrics go to MLflow together when the run ends, in as few
    requests as MLflow allows (the journal has them from the moment they are logged); files
    and datasets go at once. When MLflow stops answering, the run goes on with the journal alone."""

    journal: Journal | None
    remote: Tracker | None
    run_id: str
    remote_lost: str | None = None
    in_mlflow: bool = True  # MLflow has the run (not ended where remote_lost): run_id is its id, else the journal's
    _journal_loss_reported: bool = False
    _params: dict[str, str] = field(default_factory=dict)  # held for the batch at the end
    _tags: dict[str, str] = field(default_factory=dict)
    _metrics: list[Metric] = field(default_factory=list)

    def log_params(self, params: Mapping[str, Any]) -> None:
        values = {key: str(value) for key, value in params.items()}
        self._record(PARAMS, params=values)
        self._params.update(values)
        self._send_unless_journaled()

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        values = {key: str(value) for key, value in tags.items()}
        self._record(TAGS, tags=values)
        self._tags.update(values)
        self._send_unless_journaled()

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        now, values = get_current_time_millis(), {key: metric_value(key, value) for key, value in metrics.items()}
        self._record(METRICS, metrics=values, step=step, timestamp=now)
        self._metrics.extend(Metric(key, value, now, step) for key, value in values.items())
        self._send_unless_journaled()

    def log_series(self, name: str, values: list[float], first_step: int = 0) -> None:
        now, series = get_current_time_millis(), [metric_value(name, value) for value in values]
        self._record(SERIES, name=name, values=series, first_step=first_step, timestamp=now)
        self._metrics.extend(Metric(name, value, now, first_step + index) for index, value in enumerate(series))
        self._send_unless_journaled()

    def log_text(self, text: str, artifact_file: str) -> None:
        """Kept as a file next to the journal, which names it, then uploaded."""
        if self.journal is not None and self.journal.lost is None:
            path = self.journal.path.parent / artifact_file
            try:
                write_atomically(path, text)
                self._record(ARTIFACT, path=str(path))
            except OSError as error:
                self.output_lost(f"writing {path} failed: {error}")
        self._deliver(lambda remote: remote.log_text(text, artifact_file))

    @property
    def output_loss(self) -> str | None:
        """Why the output folder's files stopped being written (``None``: all written, or no folder)."""
        return None if self.journal is None else self.journal.lost

    def output_lost(self, reason: str) -> None:
        """A file of the output folder could not be written: tag ``axoexp.journal_lost`` says so,
        unless an earlier failure already did (the first reason is the one kept)."""
        if self.journal is not None and self.journal.lost is None:
            self.journal.lost = reason
        self._report_journal_loss()

    def log_artifact(self, path: str) -> None:
        self._record(ARTIFACT, path=str(Path(path).resolve()))
        self._deliver(lambda remote: remote.log_artifact(path))

    def log_dataset(self, dataset: Dataset, context: str) -> None:
        record = dataset.to_dict()
        self._record(DATASET, dataset=record, context=context)
        self._deliver(lambda remote: remote.log_dataset_record(record, context))

    # --- Observer: the timed loop, outside the clock
    def window_started(self, window: str, planned_updates: int) -> None:
        self._record(WINDOW, window=window, planned=planned_updates)

    def update_finished(self, window: str, index: int, latency_ms: float, loss: float, bucket: int | None) -> None:
        """An ``update`` record, with its ``bucket`` only where the batches' lengths differ: a replay then judges
        the noise within buckets as the run did. With one length every update's would be the same, so none is
        written: records without one (also an older journal's) are judged across all updates."""
        extra = {} if bucket is None else {"bucket": bucket}
        self._record(UPDATE, window=window, index=index, ms=latency_ms, loss=loss, **extra)

    def window_finished(self, window: str, completed_updates: int) -> None:
        self._record(WINDOW_END, window=window, completed=completed_updates)
        if self.journal is not None:
            self.journal.sync()

    def end(self, status: str, reason: str | None) -> None:
        """Record the end, send what was held for MLflow, then end the MLflow run (if it still answers)."""
        now = get_current_time_millis()
        self._record(END, status=status, reason=reason, end_time=now)
        if self.journal is not None:
            self.journal.close()
        self._report_journal_loss()
        self._send_held()

        def terminate(remote: Tracker) -> None:
            if reason:
                remote.client.set_tag(remote.run_id, names.FAILURE, reason)
            remote.client.set_terminated(remote.run_id, status=status, end_time=now)

        self._deliver(terminate)

    def _record(self, kind: str, **fields: Any) -> None:
        if self.journal is not None:
            self.journal.append(kind, **fields)
            self._report_journal_loss()

    def _send_unless_journaled(self) -> None:
        """Without a working journal nothing is kept locally, so nothing is held back either."""
        if self.journal is None or self.journal.lost is not None:
            self._send_held()

    def _send_held(self) -> None:
        params, tags, metrics = self._params, self._tags, self._metrics
        self._params, self._tags, self._metrics = {}, {}, []
        if params or tags or metrics:
            self._deliver(lambda remote: remote.log_batch(params, tags, metrics))

    def _report_journal_loss(self) -> None:
        if self.journal is None or self.journal.lost is None or self._journal_loss_reported:
            return
        self._journal_loss_reported = True
        self._tags[names.JOURNAL_LOST] = self.journal.lost

    def _deliver(self, call: Callable[[Tracker], None]) -> None:
        if self.remote is None:
            return
        try:
            call(self.remote)
        except UNREACHABLE as error:
            self.remote, self.remote_lost = None, store_reason(error)
            self._record(TRACKING_LOST, reason=self.remote_lost)


def process_tags() -> dict[str, str]:
    """Which process on which host runs the run: how a sync tells a dead run from a live one."""
    tags = {names.PROCESS_PID: str(os.getpid()), names.HOSTNAME: socket.gethostname()}
    started = processes.start_time(os.getpid())
    if started is not None:
        tags[names.PROCESS_START] = started
    return tags


def journal_end(
    folder: Path, run: Run, *, experiment: str, tracking_uri: str, status: str, reason: str | None
) -> str | None:
    """Keep in ``folder``'s journal the end a process decided for ``run`` but could not write to
    MLflow (a sweep's parent on a full or locked store): a start record that finds the run, then
    its end, which ``python -m axoexp.sync`` writes to the run instead of calling it killed. Why it
    could not be kept (the folder's disk is full too), or ``None``."""
    journal = Journal(folder / JOURNAL_FILE)
    journal.append(
        START,
        journal_id=journal.id,
        run_id=run.info.run_id,
        experiment=experiment,
        run_name=run.info.run_name,
        tracking_uri=tracking_uri,
        cwd=os.getcwd(),
        tags=run.data.tags,
        start_time=run.info.start_time,
    )
    journal.append(END, status=status, reason=reason, end_time=get_current_time_millis())
    journal.close()
    return journal.lost


@contextmanager
def journaled_run(
    tracking_uri: str,
    experiment: str,
    run_name: str | None,
    tags: Mapping[str, str],
    *,
    output_dir: Path | None,
    store: StoreOpening | None = None,
) -> Iterator[JournaledLog]:
    """An MLflow run, journaled in ``output_dir``, that ends FINISHED, FAILED (reason in tag
    ``axoexp.failure``) or KILLED (a signal or Ctrl-C).

    If the store cannot be reached at the start, or stops answering during the run, the run
    goes on with the journal alone and :class:`TrackingUnavailableError` is raised at its
    end, naming the journal to sync; without ``output_dir`` an unreachable store is an error
    at once. ``store`` is the store already being opened (else it is opened here).
    """
    store = store or StoreOpening(tracking_uri, experiment)
    journal = Journal(output_dir / JOURNAL_FILE) if output_dir is not None else None
    try:
        opened: tuple[Any, str] | BaseException = store.result()
    except UNREACHABLE as error:
        opened = error
    except Interrupted as interrupted:  # e.g. Ctrl-C while a fresh store is created
        if journal is not None:
            journal.close()
        interrupted.run_outcome = NO_RUN_YET
        raise
    tags = with_mlflow_context({**tags, **process_tags()})
    if journal is not None:
        tags.update({names.JOURNAL_ID: journal.id, names.JOURNAL: str(journal.path.resolve())})
    start_time = get_current_time_millis()
    remote, lost = None, None
    try:
        if isinstance(opened, BaseException):
            raise opened
        client, experiment_id = opened
        with store_lock(tracking_uri):
            run = client.create_run(experiment_id, start_time=start_time, run_name=run_name, tags=tags)
        remote = Tracker(client, run.info.run_id)
    except UNREACHABLE as error:
        if journal is None:
            raise TrackingUnavailableError(store_unreachable(tracking_uri, error)) from error
        lost = store_reason(error)
    run_id = remote.run_id if remote is not None else f"journal-{journal.id}"  # type: ignore[union-attr]
    log = JournaledLog(journal, remote, run_id, remote_lost=lost, in_mlflow=remote is not None)
    log._record(
        START,
        journal_id=journal.id if journal else None,
        run_id=remote.run_id if remote else None,
        experiment=experiment,
        run_name=run_name,
        tracking_uri=tracking_uri,
        cwd=os.getcwd(),  # what a relative sqlite:/// path in tracking_uri is relative to
        tags=tags,
        start_time=start_time,
    )
    if lost is not None:
        log._record(TRACKING_LOST, reason=lost)
    try:
        yield log
    except KeyboardInterrupt as error:
        _end(log, "KILLED", str(error) or "interrupted (KeyboardInterrupt)", tracking_uri, error)
        raise
    except BaseException as error:
        _end(log, "FAILED", f"{type(error).__name__}: {error}", tracking_uri)
        raise
    else:
        _end(log, "FINISHED", None, tracking_uri)
    if log.remote_lost is not None:
        raise TrackingUnavailableError(_not_updated(log, tracking_uri, ""))


def _end(
    log: JournaledLog, status: str, reason: str | None, tracking_uri: str, stopped: BaseException | None = None
) -> None:
    """End the run with any stop signal held off until its last upload is done, or given up on within
    the store's bounded timeouts; the signal that came meanwhile, or ``stopped`` (the one that ended
    the run), then says what became of the run in MLflow."""
    try:
        with signals.deferred():
            log.end(status, reason)  # the FAILURE tag
    except Interrupted as interrupted:  # it came during the last upload
        interrupted.run_outcome = _run_outcome(log, status, tracking_uri)
        raise
    if isinstance(stopped, Interrupted):
        stopped.run_outcome = _run_outcome(log, status, tracking_uri)


def _run_outcome(log: JournaledLog, status: str, tracking_uri: str) -> str:
    if log.remote_lost is not None:
        return _not_updated(log, tracking_uri, ", so it was not updated and the run there is not ended")
    if status == "FINISHED":
        return "it came after the run had finished measuring: the run ended FINISHED in MLflow with all it measured"
    return f"the run ended {status} in MLflow with what was measured"


def _not_updated(log: JournaledLog, tracking_uri: str, then: str) -> str:
    """The store could not be written: why (locked, a full disk, unreachable), ``then`` what it meant,
    where the run's results are, and the command that uploads them."""
    assert log.remote_lost is not None
    reason = log.remote_lost
    state = f"{store_failure(reason)}{then}"
    journal = log.journal
    if journal is None:
        return redacted(
            f"MLflow tracking at {tracking_uri} {state} ({reason}); no output directory was given, "
            "so only the error's result (TrackingUnavailableError.result) holds what was measured"
        )
    kept = (
        f"the run's results are in {journal.path}"
        if journal.lost is None
        else f"and the local journal failed too ({journal.lost})"
    )
    return redacted(
        f"MLflow tracking at {tracking_uri} {state} ({reason}); {kept}; upload them with: "
        f"python -m axoexp.sync {journal.path.parent} --tracking-uri {tracking_uri}"
    )
