"""MLflow: one run per experiment, logged as it goes, ended with an honest status."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import requests
from mlflow.data.dataset import Dataset
from mlflow.entities import DatasetInput, InputTag, Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.tracking.context.registry import resolve_tags
from mlflow.utils.time import get_current_time_millis
from omegaconf import DictConfig

from axoexp import names
from axoexp.errors import TrackingUnavailableError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
OFFLINE_FILE = "tracking-offline.json"
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
    """SHA-256 of a resolved config without its ``tracking`` and ``sweep`` settings and
    ``run.progress``, which say where results go and how a run is watched, not what is measured."""
    measured = {key: value for key, value in config.items() if key not in ("tracking", "sweep")}
    if isinstance(measured.get("run"), Mapping):
        measured["run"] = {key: value for key, value in measured["run"].items() if key != "progress"}
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
    def log_dataset(self, dataset: Dataset, context: str) -> None: ...


@dataclass
class OfflineLog:
    """Everything a run would have logged, kept in ``<output_dir>/tracking-offline.json``."""

    directory: Path
    reason: str
    run_id: str = field(default_factory=lambda: f"offline-{uuid.uuid4().hex[:12]}")
    record: dict[str, Any] = field(default_factory=lambda: {"params": {}, "tags": {}, "metrics": {}, "datasets": []})

    def log_params(self, params: Mapping[str, Any]) -> None:
        self._update("params", {key: str(value) for key, value in params.items()})

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._update("tags", {key: str(value) for key, value in tags.items()})

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        self._update("metrics", {key: float(value) for key, value in metrics.items()})

    def log_series(self, name: str, values: list[float], first_step: int = 0) -> None:
        self._update("metrics", {f"{name}_series_from_{first_step}": [float(v) for v in values]})

    def log_text(self, text: str, artifact_file: str) -> None:
        (self.directory / artifact_file).write_text(text)

    def log_artifact(self, path: str) -> None:
        """Artifacts already lie in the output directory."""

    def log_dataset(self, dataset: Dataset, context: str) -> None:
        self.record["datasets"].append({**dataset.to_dict(), "context": context})
        self._update("tags", {})  # writes the record

    def _update(self, section: str, values: Mapping[str, Any]) -> None:
        self.record[section].update(values)
        self.record["unreachable"] = self.reason
        (self.directory / OFFLINE_FILE).write_text(json.dumps(self.record, indent=2))


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

    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        now = get_current_time_millis()
        self._log([Metric(key, float(value), now, step) for key, value in metrics.items()])

    def log_series(self, name: str, values: list[float], first_step: int = 0) -> None:
        """One metric value per step, e.g. the loss of every update."""
        now = get_current_time_millis()
        self._log([Metric(name, float(value), now, first_step + index) for index, value in enumerate(values)])

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_artifact(self, path: str) -> None:
        """A file, or a directory with everything in it (logged under the directory's name)."""
        self.client.log_artifact(self.run_id, path)

    def log_dataset(self, dataset: Dataset, context: str) -> None:
        """An MLflow dataset input (the runs table's Dataset column), e.g. the workload."""
        self.client.log_inputs(self.run_id, [DatasetInput(dataset._to_mlflow_entity(),
                                                          [InputTag(names.DATASET_CONTEXT, context)])])

    def _log(self, metrics: list[Metric]) -> None:
        for start in range(0, len(metrics), MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + MAX_BATCH])


def _ui_column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"


RUNS_VIEW_COLUMNS = (
    *(_ui_column("metrics", names.update_metric(stat)) for stat in ("median", "p10", "p90")),
    _ui_column("metrics", names.CAPTURE), _ui_column("tags", names.component_tag("executor")),
    _ui_column("tags", names.SHAPE), *(_ui_column("attributes", key) for key in ("Dataset", "Source", "Version")),
)


def runs_view() -> str:
    """The MLflow UI's runs table as axoexp's results read best: the summary columns first."""
    widths = {_ui_column("attributes", "Run Name"): 300,
              **{column: 130 for column in RUNS_VIEW_COLUMNS if column.startswith("metrics.")}}
    return json.dumps({"selectedColumns": list(RUNS_VIEW_COLUMNS), "columnWidths": widths,
                       "columnOrder": [_ui_column("attributes", "Run Name"), *RUNS_VIEW_COLUMNS]})


def experiment_id(client: MlflowClient, name: str) -> str:
    """The experiment ``name``, created if missing, tagged for the MLflow UI: of the training
    kind, with axoexp's runs view (:func:`runs_view`)."""
    tags = {names.EXPERIMENT_KIND: names.EXPERIMENT_KIND_TRAINING,
            names.SHARED_VIEW_PREFIX + names.RUNS_VIEW: runs_view()}
    found = client.get_experiment_by_name(name)
    if found is None:
        return client.create_experiment(name, tags=tags)
    for key, value in tags.items():
        if found.tags.get(key) != value:  # made by an older axoexp or by hand
            client.set_experiment_tag(found.experiment_id, key, value)
    return found.experiment_id


def with_mlflow_context(tags: Mapping[str, str]) -> dict[str, str]:
    """MLflow's standard run tags (``mlflow.user``, ``mlflow.source.*``), as MLflow's own context
    resolution finds them, with ``tags`` over them.

    MLflow takes the git tags from the repository holding ``sys.argv[0]`` (pytest's, a
    launcher worker's); they are dropped here, so ``tags`` name the code that ran.
    """
    context = {key: value for key, value in resolve_tags().items() if not key.startswith(names.MLFLOW_GIT_PREFIX)}
    return {**context, **tags}


def newest_run(client: MlflowClient, experiment: str, filter_string: str) -> Run | None:
    """The most recently started run of ``experiment`` that matches, if any (creates nothing)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], filter_string=filter_string,
                              order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


@contextmanager
def tracked_run(
    tracking_uri: str, experiment: str, run_name: str | None, tags: Mapping[str, str] | None = None,
    *, offline_dir: Path | None = None,
) -> Iterator[RunLog]:
    """An MLflow run that ends FINISHED, FAILED (reason in tag ``axoexp.failure``) or KILLED.

    If the store cannot be reached and ``offline_dir`` is given, the run is logged there
    instead (:class:`OfflineLog`) and :class:`TrackingUnavailableError` is raised at the end,
    so the measurement is kept and the failure is still reported.
    """
    client = MlflowClient(tracking_uri=tracking_uri)
    tags = with_mlflow_context(tags or {})
    try:
        run = client.create_run(experiment_id(client, experiment), run_name=run_name, tags=tags)
    except UNREACHABLE as error:
        if offline_dir is None:
            raise TrackingUnavailableError(f"MLflow tracking at {tracking_uri} is unreachable: {error}") from error
        offline = OfflineLog(offline_dir, f"{type(error).__name__}: {error}"[:2000])
        offline.set_tags(tags)
        yield offline
        raise TrackingUnavailableError(
            f"MLflow tracking at {tracking_uri} is unreachable ({type(error).__name__}); the run "
            f"finished and its results are in {offline_dir} ({OFFLINE_FILE}, result.json)"
        ) from error
    tracker = Tracker(client, run.info.run_id)
    try:
        yield tracker
    except KeyboardInterrupt:
        client.set_tag(tracker.run_id, names.FAILURE, "interrupted (KeyboardInterrupt)")
        client.set_terminated(tracker.run_id, status="KILLED")
        raise
    except BaseException as error:
        client.set_tag(tracker.run_id, names.FAILURE, f"{type(error).__name__}: {error}"[:5000])
        client.set_terminated(tracker.run_id, status="FAILED")
        raise
    else:
        client.set_terminated(tracker.run_id, status="FINISHED")
