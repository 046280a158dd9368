"""MLflow: clients, bounded retries, one serialized and atomic store creation, and logging to one run.

The run's context, with its local journal and honest end status, is :mod:`axoexp.journal`.
"""

from __future__ import annotations

import atexit
import difflib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import mlflow
import requests
from mlflow.data.dataset import Dataset
from mlflow.entities import Dataset as DatasetEntity
from mlflow.entities import DatasetInput, InputTag, Metric, Param, Run, RunTag
from mlflow.environment_variables import (
    MLFLOW_ALLOW_FILE_STORE,
    MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT,
    MLFLOW_TRACKING_URI,
)
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.tracking.context.git_context import GitRunContext
from mlflow.tracking.context.registry import resolve_tags
from mlflow.utils.time import get_current_time_millis
from mlflow.utils.uri import get_uri_scheme
from omegaconf import DictConfig

from axoexp import names
from axoexp.databases import database_problem, database_unreachable
from axoexp.errors import STORE_LOGGER, StoreError, StoreLockedError, first_line
from axoexp.redact import redacted

_REVISION = re.compile(r"""^revision\s*=\s*["']([0-9A-Za-z_]+)["']\s*$""", re.MULTILINE)
_DOWN_REVISION = re.compile(r"""^down_revision\s*=\s*(?:["']([0-9A-Za-z_]+)["']|(None))\s*$""", re.MULTILINE)
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
TRACKING_URI_KEY = "tracking.uri"
"""Where a run and a sweep set their store (a Hydra key), as their lines name it."""
TRACKING_URI_OPTION = "--tracking-uri"
"""Where report, compare and sync set their store (an option), as their lines name it."""
FILE_STORE_SCHEMES = ("", "file")
"""What MLflow takes for a file store (a directory of files): a plain path, or ``file:``."""
CREATING_SUFFIX = ".creating"  # a store being created: <name>.creating-<pid>, renamed into place when complete
SQLITE_COMPANIONS = ("-journal", "-wal", "-shm")  # files sqlite keeps beside a database
SQLITE_PREFIX = "sqlite:///"
SQLITE_IN_MEMORY = ("sqlite://", SQLITE_PREFIX, f"{SQLITE_PREFIX}:memory:")
"""The sqlite URIs of an in-memory database (SQLAlchemy's forms), which keeps nothing once the process ends."""
MAX_BATCH = 1000  # MLflow's limit on metrics per log_batch call
MAX_TAG_LENGTH = 8000
"""MLflow's limit on a tag's value: a longer one (a failure's reason quoting a long error) is cut to it."""
MAX_PARAM_LENGTH = 500
SQLITE_LOCKED = ("database is locked", "database table is locked")  # how sqlite says SQLITE_BUSY, SQLITE_LOCKED
SQLITE_DAMAGED = ("database disk image is malformed", "file is not a database")  # SQLITE_CORRUPT, SQLITE_NOTADB
SQLITE_HEADER = b"SQLite format 3\x00"
"""The first bytes of every SQLite database file (an empty file is none yet: a new store is made there)."""
WAL_OFFSET, WAL_FORMAT = 18, b"\x02\x02"  # the header's file format versions of a database in WAL mode
MLFLOW_TABLES = frozenset({"experiments", "runs"})
"""Tables that mark an SQLite database as an MLflow store, the first MLflow creates (``alembic_version``
alone does not: Alembic's, of any application that uses it, Optuna's among them)."""
MAX_TABLES_NAMED = 6  # of another application's database, in the line that refuses it
STORE_LOCK_WAIT_S = 20
"""Seconds a check waits for a sqlite store another process holds locked (MLflow's own busy timeout)."""
UNREACHABLE = (MlflowException, requests.exceptions.RequestException, OSError)
"""What a client raises when its tracking store cannot be reached."""


MILLISECOND_DIGITS = 4
"""Milliseconds are logged to 0.1 microsecond (1.2776, not 1.277578999999): finer than any
clock axoexp reads is worth, and what a reader can take in at a glance."""


def metric_value(name: str, value: float) -> float:
    """``value`` as logged under ``name``: a duration in milliseconds (:func:`~axoexp.names.is_milliseconds`)
    rounded to :data:`MILLISECOND_DIGITS` decimals, anything else (a count, ``update_ms_rel_iqr``) as it is."""
    return round(float(value), MILLISECOND_DIGITS) if names.is_milliseconds(name) else float(value)


def configure_tracking(tracking: DictConfig) -> str:
    """Bound MLflow's HTTP retries as ``tracking.*`` says; return the tracking URI to use."""
    bound_http_retries(tracking.http_max_retries, tracking.http_timeout_s, tracking.http_backoff_factor)
    return resolve_tracking_uri(tracking.uri)


RETRY_LOGGER = "urllib3.connectionpool"
"""urllib3's logger, which warns of each retry with the connection error's repr, before axoexp's own
line names the server and the cause (a dead one's two retries printed two such lines)."""


class _QuietRetries(logging.Filter):
    """Drops urllib3's warning of each retry (:data:`RETRY_LOGGER`), unless urllib3's debug lines are
    asked for (``hydra.verbose=urllib3``); its other lines pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        retry = isinstance(record.msg, str) and record.msg.startswith("Retrying")
        return not retry or logging.getLogger("urllib3").isEnabledFor(logging.DEBUG)


def bound_http_retries(
    max_retries: int | None = None, timeout_s: int | None = None, backoff_factor: int | None = None
) -> None:
    """Bound MLflow's HTTP retries to a tracking server, so a dead server fails in seconds, not after
    MLflow's minutes: as given (a run's ``tracking.*``); where not given (sync, report, compare: no
    run config), as the environment sets them, else as ``tracking.*``'s defaults. Call it before the
    first request."""
    for variable, value, default in (
        (names.HTTP_MAX_RETRIES_ENV, max_retries, names.HTTP_MAX_RETRIES),
        (names.HTTP_TIMEOUT_ENV, timeout_s, names.HTTP_TIMEOUT_S),
        (names.HTTP_BACKOFF_FACTOR_ENV, backoff_factor, names.HTTP_BACKOFF_FACTOR),
    ):
        if value is None:
            os.environ.setdefault(variable, str(default))
        else:
            os.environ[variable] = str(value)
    os.environ.setdefault(names.HTTP_BACKOFF_JITTER_ENV, "0")
    retries = logging.getLogger(RETRY_LOGGER)
    if not any(isinstance(existing, _QuietRetries) for existing in retries.filters):
        retries.addFilter(_QuietRetries())


def config_digest(config: Mapping[str, Any]) -> str:
    """SHA-256 of a resolved config without its ``tracking`` and ``sweep`` settings and
    ``run.progress``, which say where results go and how a run is watched, not what is measured."""
    measured = {key: value for key, value in config.items() if key not in ("tracking", "sweep")}
    if isinstance(measured.get("run"), Mapping):
        measured["run"] = {key: value for key, value in measured["run"].items() if key != "progress"}
    return hashlib.sha256(json.dumps(measured, sort_keys=True, default=str).encode()).hexdigest()


def resolve_tracking_uri(uri: str | None) -> str:
    """The configured URI, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the cwd."""
    return uri or MLFLOW_TRACKING_URI.get() or DEFAULT_TRACKING_URI


def tracking_uri_key(uri: str | None, setting: str = TRACKING_URI_KEY) -> str:
    """Where the URI :func:`resolve_tracking_uri` gives for ``uri`` was set, as a message names it:
    ``setting``, the command's own (a run's :data:`TRACKING_URI_KEY`, the report's ``--tracking-uri``),
    or ``$MLFLOW_TRACKING_URI`` where ``uri`` is not given and that variable is."""
    return f"${MLFLOW_TRACKING_URI.name}" if not uri and MLFLOW_TRACKING_URI.get() else setting


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Scalar leaves of a nested mapping as dotted keys (for MLflow params)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)
    return flat


class RedactingClient(MlflowClient):
    """MLflow's client, every param, tag, run name and text it writes with any URI's password hidden
    (:func:`~axoexp.redact.redacted`): the one place a value is made safe on its way to MLflow,
    whether a run, a sweep, a search or the sync writes it; then cut to :data:`MAX_PARAM_LENGTH`
    or :data:`MAX_TAG_LENGTH` (a cut before would leave a password without its ``@``)."""

    def create_run(
        self,
        experiment_id: str,
        start_time: int | None = None,
        tags: dict[str, Any] | None = None,
        run_name: str | None = None,
    ) -> Run:
        hidden = None if tags is None else {key: _tag_value(value) for key, value in tags.items()}
        return super().create_run(experiment_id, start_time, hidden, None if run_name is None else redacted(run_name))

    def set_tag(self, run_id: str, key: str, value: Any, synchronous: bool | None = None) -> Any:
        return super().set_tag(run_id, key, _tag_value(value), synchronous)

    def log_param(self, run_id: str, key: str, value: Any, synchronous: bool | None = None) -> Any:
        return super().log_param(run_id, key, redacted(value)[:MAX_PARAM_LENGTH], synchronous)

    def log_batch(
        self,
        run_id: str,
        metrics: Sequence[Metric] = (),
        params: Sequence[Param] = (),
        tags: Sequence[RunTag] = (),
        synchronous: bool | None = None,
    ) -> Any:
        params = [Param(param.key, redacted(param.value)[:MAX_PARAM_LENGTH]) for param in params]
        tags = [RunTag(tag.key, _tag_value(tag.value)) for tag in tags]
        return super().log_batch(run_id, metrics, params, tags, synchronous)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        super().log_text(run_id, redacted(text), artifact_file)

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        """A file or folder as it is, or, where a text file in it holds a password (``result.json``,
        Hydra's ``.hydra/`` record of the overrides), a copy with it hidden."""
        source = Path(local_path)
        texts = {path: _text(path) for path in _files(source)}  # each file read once
        if all(text is None or redacted(text) == text for text in texts.values()):
            return super().log_artifact(run_id, local_path, artifact_path)
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / source.name
            for path, text in texts.items():
                target = copy / path.relative_to(source) if source.is_dir() else copy
                target.parent.mkdir(parents=True, exist_ok=True)
                if text is None:
                    shutil.copyfile(path, target)
                else:
                    target.write_text(redacted(text), encoding="utf-8")
            super().log_artifact(run_id, str(copy), artifact_path)


TEXT_SNIFF_BYTES = 8192
"""How much of a file to be uploaded is read first, to tell tensors from text."""


def _files(path: Path) -> list[Path]:
    return sorted(found for found in path.rglob("*") if found.is_file()) if path.is_dir() else [path]


def _text(path: Path) -> str | None:
    """A file's text, or None where it is no UTF-8 text: a safetensors file (the banks), told by its
    header and not read further, or bytes that do not decode. A text with NUL bytes (a log a crash
    cut short) is text."""
    with path.open("rb") as stream:
        head = stream.read(TEXT_SNIFF_BYTES)
        if _is_safetensors(head):
            return None
        data = head + stream.read()
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _is_safetensors(head: bytes) -> bool:
    """Whether a file begins as a safetensors file does: its JSON header's length as 8 little-endian
    bytes (under 100 MB, as the format caps it; a text's 8 bytes of characters read far larger), then ``{``."""
    return len(head) > 8 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000


def _tag_value(value: Any) -> str:
    return redacted(value)[:MAX_TAG_LENGTH]


@dataclass
class Tracker:
    """Logging calls bound to one MLflow run."""

    client: MlflowClient
    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [Param(key, str(value)) for key, value in params.items()]  # cut to MLflow's limit by the client
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [RunTag(key, str(value)) for key, value in tags.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, tags=items[start : start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0, timestamp_ms: int | None = None) -> None:
        now = timestamp_ms or get_current_time_millis()
        self.log_metric_objects([Metric(key, float(value), now, step) for key, value in metrics.items()])

    def log_series(self, name: str, values: list[float], first_step: int = 0, timestamp_ms: int | None = None) -> None:
        """One metric value per step, e.g. the loss of every update. An explicit timestamp
        makes logging the same values again a no-op (the store drops identical metrics)."""
        now = timestamp_ms or get_current_time_millis()
        self.log_metric_objects(
            [Metric(name, float(value), now, first_step + index) for index, value in enumerate(values)]
        )

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, path: str) -> None:
        """A file, or a directory with everything in it (logged under the directory's name)."""
        self.client.log_artifact(self.run_id, path)

    def log_dataset(self, dataset: Dataset, context: str) -> None:
        """An MLflow dataset input (the runs table's Dataset column), e.g. the workload."""
        self.log_dataset_record(dataset.to_dict(), context)

    def log_dataset_record(self, record: Mapping[str, Any], context: str) -> None:
        """A dataset input from its ``Dataset.to_dict()`` record (as the journal keeps it)."""
        self.client.log_inputs(
            self.run_id, [DatasetInput(DatasetEntity(**record), [InputTag(names.DATASET_CONTEXT, context)])]
        )

    def log_batch(self, params: Mapping[str, str], tags: Mapping[str, str], metrics: list[Metric]) -> None:
        """Params, tags and metrics in as few requests as MLflow's limits allow (100 params,
        100 tags, 1000 entries in all per request)."""
        param_items = [Param(key, str(value)[:MAX_PARAM_LENGTH]) for key, value in params.items()]
        tag_items = [RunTag(key, str(value)) for key, value in tags.items()]
        metric_items = list(metrics)
        while param_items or tag_items or metric_items:
            some_params, param_items = param_items[:100], param_items[100:]
            some_tags, tag_items = tag_items[:100], tag_items[100:]
            room = MAX_BATCH - len(some_params) - len(some_tags)
            some_metrics, metric_items = metric_items[:room], metric_items[room:]
            self.client.log_batch(self.run_id, metrics=some_metrics, params=some_params, tags=some_tags)

    def log_metric_objects(self, metrics: list[Metric]) -> None:
        """MLflow metrics as they are (key, value, timestamp, step), in batches of MLflow's limit."""
        for start in range(0, len(metrics), MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + MAX_BATCH])


def _ui_column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"


RUNS_VIEW_COLUMNS = (
    *(_ui_column("metrics", names.update_metric(stat)) for stat in ("median", "p10", "p90")),
    _ui_column("metrics", names.CAPTURE),
    _ui_column("metrics", names.EVAL_LOSS_BEFORE),
    _ui_column("metrics", names.EVAL_LOSS_AFTER),
    _ui_column("tags", names.TIMING_CONTENTION),  # contention and noise travel with the numbers
    _ui_column("tags", names.TIMING_NOISE),
    _ui_column("tags", names.component_tag("executor")),
    _ui_column("tags", names.SHAPE),
    _ui_column("tags", names.TRIAL),  # an Optuna search's trial number (hydra/sweeper=optuna)
    *(_ui_column("attributes", key) for key in ("Dataset", "Source", "Version")),
)


def runs_view() -> str:
    """The MLflow UI's runs table as axoexp's results read best: the summary columns first."""
    widths = {
        _ui_column("attributes", "Run Name"): 300,
        **{column: 130 for column in RUNS_VIEW_COLUMNS if column.startswith("metrics.")},
    }
    return json.dumps(
        {
            "selectedColumns": list(RUNS_VIEW_COLUMNS),
            "columnWidths": widths,
            "columnOrder": [_ui_column("attributes", "Run Name"), *RUNS_VIEW_COLUMNS],
        }
    )


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (``None`` for any other store, an in-memory one included)."""
    if not tracking_uri.startswith(SQLITE_PREFIX) or in_memory(tracking_uri):
        return None
    return Path(tracking_uri[len(SQLITE_PREFIX) :].partition("?")[0]).expanduser()


def in_memory(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` names an in-memory sqlite database (:data:`SQLITE_IN_MEMORY`)."""
    return tracking_uri.partition("?")[0] in SQLITE_IN_MEMORY


def sqlite_uri_problem(tracking_uri: str) -> str | None:
    """Why a ``sqlite:`` URI names no database file: an in-memory database, or too few slashes
    (``sqlite://x.db``), which SQLAlchemy refuses only once the run has begun."""
    if in_memory(tracking_uri):
        return (
            f"an in-memory store keeps nothing once the process ends; name a database file, e.g. {DEFAULT_TRACKING_URI}"
        )
    if not tracking_uri.startswith("sqlite:") or tracking_uri.startswith(SQLITE_PREFIX):
        return None
    path = tracking_uri.removeprefix("sqlite:").lstrip("/")
    return (
        "a sqlite URI has three slashes before a relative path and four before an absolute one: "
        f"did you mean {SQLITE_PREFIX}{path} (or {SQLITE_PREFIX}/{path})?"
    )


def store_problem(tracking_uri: str, key: str = TRACKING_URI_KEY, *, writes: bool = True) -> str | None:
    """Why the store cannot be used, found in a moment (MLflow itself retries ~100 s): a scheme no
    MLflow store has (:func:`scheme_problem`), a database whose driver is missing
    (:func:`~axoexp.databases.database_problem`), a file store (:func:`file_store_problem`), a
    sqlite file that is no usable MLflow store (:func:`store_damage`), or one that cannot be written
    (:func:`store_read_only`) where the caller ``writes`` (a run, a sweep, sync; the report and
    compare only read); ``key`` says where the URI was set. A sqlite file
    another process holds locked raises :class:`StoreLockedError` (not a problem of the config: the
    same command works once the lock is gone)."""
    setting = f"{key}={redacted(tracking_uri)}"
    outside = (
        scheme_problem(tracking_uri)
        or sqlite_uri_problem(tracking_uri)
        or database_problem(tracking_uri)
        or file_store_problem(tracking_uri)
    )
    if outside:
        return f"{setting}: {redacted(outside)}"
    path = sqlite_path(tracking_uri)
    if path is None:
        return None
    directory = path.parent.resolve()
    if not directory.is_dir():
        blocking = next((folder for folder in (directory, *directory.parents) if folder.exists()), None)
        if blocking is not None and not blocking.is_dir():
            return f"{setting}: {blocking} is a file, not a directory; choose another path"
        return f"{setting}: directory {directory} does not exist; create it or choose another path"
    if path.is_dir():
        return f"{setting}: {path} is a directory, not a database file"
    read_only = store_read_only(path) if writes else None
    if read_only:
        return f"{setting}: {read_only}; choose a writable path"
    try:
        damage = store_damage(path) if holds_data(path) else None
    except StoreLockedError as error:
        raise StoreLockedError(f"{setting}: {error}") from None
    return f"{setting}: {damage}" if damage else None


def store_read_only(path: Path) -> str | None:
    """Why the sqlite file at ``path`` cannot be written (it, or the journal sqlite writes beside it):
    permissions, a read-only mount, a pseudo file system such as /proc; ``None`` where it can."""
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    if not _can_create_files_in(path.parent.resolve()):
        return f"no file can be created in {path.parent.resolve()}"
    return None


def scheme_problem(tracking_uri: str) -> str | None:
    """Why no MLflow store can open ``tracking_uri``: its scheme is none MLflow registers
    (``postgres://`` for ``postgresql://``), which MLflow says only once the run has begun."""
    from mlflow.tracking._tracking_service.utils import _tracking_store_registry

    try:
        scheme = get_uri_scheme(tracking_uri)
    except MlflowException as error:
        return error.message
    known = sorted(key for key in _tracking_store_registry._registry if key)
    if scheme in FILE_STORE_SCHEMES or scheme in known:
        return None
    close = difflib.get_close_matches(scheme, known, n=1)
    guess = f" (did you mean {close[0]}://?)" if close else ""
    return f"no MLflow store has the scheme {scheme}://{guess}; its schemes: {', '.join(known)}"


def file_store_problem(tracking_uri: str) -> str | None:
    """Why MLflow will refuse a file store URI (a plain path such as ``./mlruns``, or ``file:...``): MLflow 3
    raises on the first call to one unless ``$MLFLOW_ALLOW_FILE_STORE`` is true (then it is used)."""
    if get_uri_scheme(tracking_uri) not in FILE_STORE_SCHEMES:
        return None
    try:
        if MLFLOW_ALLOW_FILE_STORE.get():
            return None
    except ValueError as error:  # MLflow raises it too, where it reads the variable
        return f"a file store, and {error}"
    return (
        f"a file store, which MLflow {mlflow.__version__} refuses; use a database file, sqlite:///PATH "
        f"(e.g. {DEFAULT_TRACKING_URI}), or a tracking server, http(s)://HOST:PORT "
        "(mlflow migrate-filestore copies an existing file store into a database)"
    )


def holds_data(path: Path) -> bool:
    """Whether the file ``path`` holds anything: an empty one is no store yet, whoever made it."""
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def no_store_yet(tracking_uri: str) -> str | None:
    """Why the sqlite store ``tracking_uri`` names is no store yet for a reader, which must create
    nothing in it (MLflow would create its tables): ``"does not exist"`` or ``"is an empty file"``;
    ``None`` where the file holds data or the URI names no sqlite file."""
    path = sqlite_path(tracking_uri)
    if path is None or holds_data(path):
        return None
    return "is an empty file" if path.is_file() else "does not exist"


def store_damage(path: Path) -> str | None:
    """Why the sqlite file at ``path`` is not a usable MLflow store, and what to do: a file of another
    kind or another application's database is named as such (choose another path), and only an MLflow
    store, damaged, half-built or of an older schema, gets the command that moves it aside or upgrades
    it; ``None`` when it is a usable one. Reads its header and schema (milliseconds); raises
    :class:`StoreLockedError` where another process holds it locked for :data:`STORE_LOCK_WAIT_S`."""
    foreign = _not_sqlite(path)
    if foreign:
        return foreign
    try:
        with closing(sqlite3.connect(path, timeout=STORE_LOCK_WAIT_S)) as database:
            tables = {row[0] for row in database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = None
            if "alembic_version" in tables:  # Alembic's own table, of any application that migrates with it
                row = database.execute("SELECT * FROM alembic_version").fetchone()
                version = row[0] if row else None
            runs = database.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
    except sqlite3.DatabaseError as error:
        if isinstance(error, sqlite3.OperationalError) and sqlite_busy(error):
            raise StoreLockedError(
                f"{path} is locked by another process ({error} for {STORE_LOCK_WAIT_S} s); the store is not "
                "damaged: retry once that process is done with it"
            ) from None
        if _in_wal_mode(path) and not _can_create_files_in(path.parent):
            return (
                f"{path} is in WAL mode on a read-only file system, where sqlite cannot read it without its "
                f"{path.name}-shm file; copy it, and its {path.name}-wal file if there is one, to a writable place"
            )
        return (
            f"{path} is a damaged SQLite database ({error}): its tables cannot be read, so whether it is an "
            "MLflow store is not known; choose another path"
        )
    if not tables & MLFLOW_TABLES and version not in _migrations()[0]:  # no revision of MLflow's
        named = sorted(tables)[:MAX_TABLES_NAMED]
        more = f", ... ({len(tables)} in all)" if len(tables) > len(named) else ""
        return (
            f"{path} is an SQLite database of another application (tables: {', '.join(named) or 'none'}{more}), "
            "not an MLflow store; choose another path"
        )
    head = latest_schema_revision()
    leftovers = [table for table in tables if table.startswith("_alembic_tmp_")]
    # an empty store not at the newest schema is taken for a half-built one (an upgrade could fail on it)
    if version is None or leftovers or "runs" not in tables or (version != head and runs == 0):
        return (
            f"{path} is a half-built MLflow store (its creation or upgrade was cut off, e.g. by a signal to an "
            f"older axoexp; {runs} runs in it); move it aside and a new store is created: {_aside(path)}"
        )
    if version != head:
        return (
            f"{path} has MLflow schema {version}, this MLflow expects {head}; back it up, then upgrade it: "
            f"mlflow db upgrade {SQLITE_PREFIX}{path}"
        )
    return None


NO_SUCH_RUN = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")
"""The error codes of MLflow's ``get_run`` for a run id the store does not hold."""


def run_or_none(client: MlflowClient, run_id: str) -> Run | None:
    """The run ``run_id`` names, or ``None`` where the store holds no such run; a store that cannot
    be read raises (:data:`UNREACHABLE`), for the caller to name the fault, never a missing run."""
    try:
        return client.get_run(run_id)
    except MlflowException as error:
        if error.error_code in NO_SUCH_RUN:
            return None
        raise


def damaged_store(path: Path, reason: str) -> str:
    """The line naming the MLflow store at ``path`` as damaged (``reason``: sqlite's words), found while
    reading it past the schema :func:`store_damage` checked, with the command that moves it aside; a
    file that is no SQLite database (by now) is named as such, without it."""
    return (
        _not_sqlite(path) or f"{path} is damaged, not a readable MLflow store ({reason}); move it aside: {_aside(path)}"
    )


def _not_sqlite(path: Path) -> str | None:
    """Why the file at ``path`` is no SQLite database (its header) or cannot be read; ``None`` for one."""
    try:
        with path.open("rb") as file:
            if file.read(len(SQLITE_HEADER)) == SQLITE_HEADER:
                return None
    except OSError as error:
        return f"{path} cannot be read ({error.strerror}); choose another path"
    return f"{path} is not an SQLite database, so not an MLflow store; choose another path"


def _in_wal_mode(path: Path) -> bool:
    """Whether the SQLite database at ``path`` is in WAL mode, by its header."""
    try:
        with path.open("rb") as file:
            file.seek(WAL_OFFSET)
            return file.read(len(WAL_FORMAT)) == WAL_FORMAT
    except OSError:
        return False


def _aside(path: Path) -> str:
    return f"mv {path} {path}.broken"


def sqlite_damaged(uri: str, error: BaseException) -> Path | None:
    """The sqlite file of the store ``uri`` where ``error`` (sqlite's, or one wrapping it), met while
    reading it past the schema its opening checks, says the file is damaged; else ``None``."""
    text = str(error).lower()
    return sqlite_path(uri) if any(phrase in text for phrase in SQLITE_DAMAGED) else None


def store_failure(reason: str) -> str:
    """What a store error's text says of the store, as a message's verb: locked, on a full disk, or
    (anything else: a dead server, a refused connection) unreachable."""
    text = reason.lower()
    if any(phrase in text for phrase in SQLITE_LOCKED):
        return "is locked by another process"
    if "database or disk is full" in text or "no space left on device" in text:
        return "is on a full disk"
    return "is unreachable"


def store_reason(error: BaseException) -> str:
    """A store's error as one short, whole line, any password hidden: the operating system's words where
    it comes of one (``Connection refused``, ``Name or service not known``: MLflow nests them deep in
    the repr of urllib3's errors), else its message's first line (:func:`~axoexp.errors.first_line`)."""
    root = _os_error_at_root(error)
    if root is not None:
        return redacted(str(root) if root.filename is not None else root.strerror or str(root))
    return first_line(error, typed=False)


def _os_error_at_root(error: BaseException) -> OSError | None:
    """The operating system's error that ``error`` wraps, through causes, contexts, urllib3's ``reason``
    and requests' arguments, where the innermost error is one; else ``None``."""
    pending, seen = [error], set[int]()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        wrapped = [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args]
        inner = [found for found in wrapped if isinstance(found, BaseException)]
        if not inner and isinstance(current, OSError):
            return current
        pending += inner
    return None


def store_unreachable(uri: str, error: BaseException) -> str:
    """``MLflow tracking at URI is on a full disk: <the error's reason>`` (locked, unreachable;
    :func:`store_reason`), or the sqlite file named damaged with the command that moves it aside."""
    reason = store_reason(error)
    damaged = sqlite_damaged(uri, error)
    if damaged is not None:
        return f"MLflow tracking at {redacted(uri)}: {damaged_store(damaged, reason)}"
    return f"MLflow tracking at {redacted(uri)} {store_failure(reason)}: {reason}"


def sqlite_busy(error: BaseException) -> bool:
    """Whether ``error`` (sqlite's, or one wrapping it) says the database is locked by another connection."""
    text = str(error).lower()
    return any(phrase in text for phrase in SQLITE_LOCKED) or "busy" in text


@cache
def _migrations() -> tuple[dict[str, str], bool]:
    """MLflow's store schemas as its migration scripts name them: each revision with the one it
    upgrades (``"None"`` for the first), and whether every script is one plain migration."""
    upgrades: dict[str, str] = {}
    plain = True
    for script in (Path(mlflow.__file__).parent / "store" / "db_migrations" / "versions").glob("[!_]*.py"):
        text = script.read_text()
        revision = _REVISION.search(text)
        parent = _DOWN_REVISION.search(text)
        if revision is None or parent is None:
            plain = False
        else:
            upgrades[revision[1]] = parent[1] or parent[2]
    return upgrades, plain


def latest_schema_revision() -> str:
    """The newest store schema this MLflow knows: the one migration no other names as its
    ``down_revision``, read from MLflow's migration scripts (milliseconds). Alembic's own reading
    (``mlflow.store.db.utils._get_latest_schema_revision``) imports SQLAlchemy and Alembic, about
    half a second that planning's main thread would spend before the store's thread imports them
    anyway; it answers where the scripts are not one plain chain (a merge, a branch)."""
    upgrades, plain = _migrations()
    parents = set(upgrades.values())
    heads = set(upgrades) - parents
    if plain and len(heads) == 1 and len(parents - {"None"}) == len(upgrades) - 1:
        return heads.pop()
    from mlflow.store.db.utils import _get_latest_schema_revision

    return str(_get_latest_schema_revision())


def _can_create_files_in(directory: Path) -> bool:
    """Whether a file can be created in ``directory``, found by creating (and removing) one:
    permissions, a read-only mount and a pseudo file system such as /proc all show."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".axoexp-probe-"):
            return True
    except OSError:
        return False


@contextmanager
def store_lock(tracking_uri: str) -> Iterator[None]:
    """Serialize sqlite store creation across processes (MLflow's schema migration is not
    safe when two processes create one store together); a no-op for other stores."""
    path = sqlite_path(tracking_uri)
    if path is None or not path.parent.is_dir():
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def open_client(tracking_uri: str) -> MlflowClient:
    """A client whose store exists: a fresh sqlite store is created under :func:`store_lock`,
    atomically (:func:`create_store`); other stores as :func:`answering_client` opens them."""
    path = sqlite_path(tracking_uri)
    if path is None:
        return answering_client(tracking_uri)
    with store_lock(tracking_uri):
        if not holds_data(path):
            create_store(path)
        client = RedactingClient(tracking_uri=tracking_uri)
        client.search_experiments(max_results=1)
    return client


def answering_client(tracking_uri: str) -> MlflowClient:
    """A client of ``tracking_uri``, which it creates nothing in; a database server that does not
    answer within the HTTP timeout (``tracking.http_timeout_s``) raises :class:`MlflowException` at
    once, as a dead tracking server does, where MLflow's engine would retry for about 100 s. A URI
    holding a password keeps MLflow from printing its run links, which would show it."""
    silent = database_unreachable(tracking_uri, float(os.environ.get(names.HTTP_TIMEOUT_ENV, names.HTTP_TIMEOUT_S)))
    if silent is not None:
        raise MlflowException(silent)
    if redacted(tracking_uri) != tracking_uri:
        os.environ[MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.name] = "true"
    return RedactingClient(tracking_uri=tracking_uri)


STORE_CREATION_WAIT_S = 10.0
"""How long a process that exits waits for a store it is creating (about a second of migrations)."""


def create_store(path: Path) -> None:
    """Create and migrate a sqlite MLflow store under a temporary name in its directory, and
    rename it to ``path`` only when complete: a signal, a crash or a full disk during the
    migrations (about a second) leaves no half-built store. A process that exits meanwhile (a
    signal in its main thread while this runs in another) waits up to :data:`STORE_CREATION_WAIT_S`
    for it, so no temporary file is left either. Call it under :func:`store_lock`, which also makes
    any temporary file left by a killed process safe to remove."""
    from mlflow.store.db.utils import _initialize_tables, create_sqlalchemy_engine

    for stale in path.parent.iterdir():
        if stale.name.startswith(f"{path.name}{CREATING_SUFFIX}-"):
            stale.unlink(missing_ok=True)
    temporary = path.with_name(f"{path.name}{CREATING_SUFFIX}-{os.getpid()}")
    created = threading.Event()

    def exiting() -> None:  # a Ctrl-C as the run starts: the thread that creates it (StoreOpening's)
        try:  # ends it, and its clean-up runs
            created.wait(STORE_CREATION_WAIT_S)
        except KeyboardInterrupt:  # a second one: exit now (the next run removes the temporary file)
            pass

    atexit.register(exiting)
    try:
        engine = create_sqlalchemy_engine(f"{SQLITE_PREFIX}{temporary}")
        tables = logging.getLogger(STORE_LOGGER)
        level = tables.level
        tables.setLevel(max(level, logging.WARNING))  # its two lines per migration
        try:
            _initialize_tables(engine)
        finally:
            tables.setLevel(level)
            engine.dispose()
        os.replace(temporary, path)
    except Exception as error:  # e.g. a full disk; a signal's KeyboardInterrupt passes, after the clean-up
        reason = first_line(getattr(error, "orig", None) or error, typed=False)  # sqlite's, not SQLAlchemy's
        raise StoreError(
            f"the MLflow store {path} could not be created: {reason}; free space on its disk "
            f"or choose another {TRACKING_URI_KEY}"
        ) from error
    finally:
        for leftover in (temporary, *(temporary.with_name(temporary.name + end) for end in SQLITE_COMPANIONS)):
            leftover.unlink(missing_ok=True)
        created.set()
        atexit.unregister(exiting)


def experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment ``name``, created if missing (also when another process creates it
    meanwhile), tagged for the MLflow UI: of the training kind, with axoexp's runs view
    (:func:`runs_view`)."""
    tags = {
        names.EXPERIMENT_KIND: names.EXPERIMENT_KIND_TRAINING,
        names.SHARED_VIEW_PREFIX + names.RUNS_VIEW: runs_view(),
    }
    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, tags=tags)
        except MlflowException as error:
            if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
                raise
            found = client.get_experiment_by_name(name)
            assert found is not None
    for key, value in tags.items():
        if found.tags.get(key) != value:  # made by an older axoexp, by hand, or by a racing process
            client.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def with_mlflow_context(tags: Mapping[str, str]) -> dict[str, str]:
    """MLflow's standard run tags (``mlflow.user``, ``mlflow.source.*``), as MLflow's own context
    resolution finds them, with ``tags`` over them.

    MLflow takes the git tags from the repository holding ``sys.argv[0]`` (pytest's, a
    launcher worker's); they are not asked for (reading them imports GitPython: 50 ms of a run's
    start) and any other provider's are dropped, so ``tags`` name the code that ran.
    """
    context = resolve_tags(ignore=[GitRunContext])  # type: ignore[list-item]  # its isinstance check takes classes
    context = {key: value for key, value in context.items() if not key.startswith(names.MLFLOW_GIT_PREFIX)}
    return {**context, **tags}


def newest_run(client: MlflowClient, experiment: str, filter_string: str) -> Run | None:
    """The most recently started run of ``experiment`` that matches, if any (creates nothing)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id], filter_string=filter_string, order_by=["attributes.start_time DESC"], max_results=1
    )
    return runs[0] if runs else None


def child_runs(client: MlflowClient, parent: Run) -> list[Run]:
    """The runs whose ``mlflow.parentRunId`` is ``parent``."""
    return client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`{names.PARENT_RUN_ID}` = '{parent.info.run_id}'"
    )


class StoreOpening:
    """The store opened, and the experiment found or created, in a background thread, so that
    the run's other set-up (CUDA initialisation, git state, tags) overlaps importing the
    store's backend and creating a fresh store's schema; :meth:`result` waits for it."""

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        self._outcome: tuple[MlflowClient, str] | BaseException | None = None
        self._thread = threading.Thread(
            target=self._open, args=(tracking_uri, experiment), name="axoexp-store-opening", daemon=True
        )
        self._thread.start()

    def _open(self, tracking_uri: str, experiment: str) -> None:
        try:
            client = open_client(tracking_uri)
            with store_lock(tracking_uri):
                self._outcome = (client, experiment_id(client, experiment))
        except BaseException as error:  # raised again in the waiting thread
            self._outcome = error

    def result(self) -> tuple[MlflowClient, str]:
        """The client and the experiment's id, or what opening the store raised."""
        self._thread.join()
        if isinstance(self._outcome, BaseException):
            raise self._outcome
        assert self._outcome is not None
        return self._outcome
