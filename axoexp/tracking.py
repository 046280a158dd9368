"""MLflow: one run per experiment, logged as it goes, ended with an honest status."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
FAILURE_TAG = "axoexp.failure"
MAX_BATCH = 1000  # MLflow's limit on metrics per log_batch call
MAX_PARAM_LENGTH = 500


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
        self.client.log_artifact(self.run_id, path)

    def _log(self, metrics: list[Metric]) -> None:
        for start in range(0, len(metrics), MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + MAX_BATCH])


@contextmanager
def tracked_run(
    tracking_uri: str, experiment: str, run_name: str | None, tags: Mapping[str, str] | None = None
) -> Iterator[Tracker]:
    """An MLflow run that ends FINISHED, FAILED (reason in tag ``axoexp.failure``) or KILLED."""
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found else client.create_experiment(experiment)
    run = client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
    tracker = Tracker(client, run.info.run_id)
    try:
        yield tracker
    except KeyboardInterrupt:
        client.set_tag(tracker.run_id, FAILURE_TAG, "interrupted (KeyboardInterrupt)")
        client.set_terminated(tracker.run_id, status="KILLED")
        raise
    except BaseException as error:
        client.set_tag(tracker.run_id, FAILURE_TAG, f"{type(error).__name__}: {error}"[:5000])
        client.set_terminated(tracker.run_id, status="FAILED")
        raise
    else:
        client.set_terminated(tracker.run_id, status="FINISHED")
