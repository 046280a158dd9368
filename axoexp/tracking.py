"""MLflow: clients, bounded retries, one serialized store creation, and logging to one run.

The run's context, with its local journal and honest end status, is :mod:`axoexp.journal`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import requests
from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis
from omegaconf import DictConfig

from axoexp import names

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
SQLITE_PREFIX = "sqlite:///"
MAX_BATCH = 1000  # MLflow's limit on metrics per log_batch call
MAX_PARAM_LENGTH = 500
UNREACHABLE = (MlflowException, requests.exceptions.RequestException, OSError)
"""What a client raises when its tracking store cannot be reached."""


def configure_tracking(tracking: DictConfig) -> str:
    """Bound MLflow's HTTP retries as ``tracking.*`` says (a dead server then fails in seconds,
    not ~4 minutes); return the tracking URI to use."""
    os.environ[names.HTTP_MAX_RETRIES_ENV] = str(tracking.http_max_retries)
    os.environ[names.HTTP_TIMEOUT_ENV] = str(tracking.http_timeout_s)
    os.environ[names.HTTP_BACKOFF_FACTOR_ENV] = str(tracking.http_backoff_factor)
    os.environ[names.HTTP_BACKOFF_JITTER_ENV] = "0"
    return resolve_tracking_uri(tracking.uri)


def config_digest(config: Mapping[str, Any]) -> str:
    """SHA-256 of a resolved config without its ``tracking`` and ``sweep`` settings,
    which say where and how results go, not what is measured."""
    measured = {key: value for key, value in config.items() if key not in ("tracking", "sweep")}
    return hashlib.sha256(json.dumps(measured, sort_keys=True, default=str).encode()).hexdigest()


def resolve_tracking_uri(uri: str | None) -> str:
    """The configured URI, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the cwd."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Scalar leaves of a nested mapping as dotted keys (for MLflow params)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_LENGTH]
    return flat


class RunLog(Protocol):
    """Where one experiment's params, tags, metrics and artifacts go."""

    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None: ...
    def log_series(self, name: str, values: list[float], first_step: int = 0) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def log_artifact(self, path: str) -> None: ...


@dataclass
class Tracker:
    """Logging calls bound to one MLflow run."""

    client: MlflowClient
    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [Param(key, str(value)[:MAX_PARAM_LENGTH]) for key, value in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start:start + 100])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [RunTag(key, str(value)) for key, value in tags.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, tags=items[start:start + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0, timestamp_ms: int | None = None) -> None:
        now = timestamp_ms or get_current_time_millis()
        self._log([Metric(key, float(value), now, step) for key, value in metrics.items()])

    def log_series(self, name: str, values: list[float], first_step: int = 0,
                   timestamp_ms: int | None = None) -> None:
        """One metric value per step, e.g. the loss of every update. An explicit timestamp
        makes logging the same values again a no-op (the store drops identical metrics)."""
        now = timestamp_ms or get_current_time_millis()
        self._log([Metric(name, float(value), now, first_step + index) for index, value in enumerate(values)])

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, path: str) -> None:
        self.client.log_artifact(self.run_id, path)

    def _log(self, metrics: list[Metric]) -> None:
        for start in range(0, len(metrics), MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + MAX_BATCH])


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (``None`` for any other store)."""
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return None
    return Path(tracking_uri[len(SQLITE_PREFIX):].partition("?")[0]).expanduser()


def store_problem(tracking_uri: str) -> str | None:
    """Why a sqlite store cannot be written, found in a moment (MLflow itself retries ~100 s)."""
    path = sqlite_path(tracking_uri)
    if path is None or str(path) == ":memory:":
        return None
    directory = path.parent.resolve()
    if not directory.is_dir():
        return f"tracking.uri={tracking_uri}: directory {directory} does not exist; create it or choose another path"
    if path.is_dir():
        return f"tracking.uri={tracking_uri}: {path} is a directory, not a database file"
    target = path if path.exists() else directory
    if not os.access(target, os.W_OK) or _read_only_filesystem(directory):
        return f"tracking.uri={tracking_uri}: {target} is not writable; choose a writable path"
    return None


def _read_only_filesystem(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
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
    """A client whose store exists: a fresh sqlite store is created under :func:`store_lock`."""
    if sqlite_path(tracking_uri) is None:
        return MlflowClient(tracking_uri=tracking_uri)
    with store_lock(tracking_uri):
        client = MlflowClient(tracking_uri=tracking_uri)
        client.search_experiments(max_results=1)
    return client


def experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment's id, created if missing (also when another process creates it meanwhile)."""
    found = client.get_experiment_by_name(name)
    if found:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException as error:
        if error.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
        found = client.get_experiment_by_name(name)
        assert found is not None
        return found.experiment_id


def newest_run(client: MlflowClient, experiment: str, filter_string: str) -> Run | None:
    """The most recently started run of ``experiment`` that matches, if any (creates nothing)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], filter_string=filter_string,
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None
