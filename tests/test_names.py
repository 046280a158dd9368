"""The MLflow names axoexp spells itself are MLflow's own; what its metric names say of their units."""

from __future__ import annotations

from mlflow import environment_variables
from mlflow.utils import mlflow_tags

from axoexp import names


def test_mlflow_names_match_mlflow_constants() -> None:
    assert names.PARENT_RUN_ID == mlflow_tags.MLFLOW_PARENT_RUN_ID
    assert names.HTTP_MAX_RETRIES_ENV == environment_variables.MLFLOW_HTTP_REQUEST_MAX_RETRIES.name
    assert names.HTTP_TIMEOUT_ENV == environment_variables.MLFLOW_HTTP_REQUEST_TIMEOUT.name
    assert names.HTTP_BACKOFF_FACTOR_ENV == environment_variables.MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR.name
    assert names.HTTP_BACKOFF_JITTER_ENV == environment_variables.MLFLOW_HTTP_REQUEST_BACKOFF_JITTER.name
    assert names.ARTIFACTS_PROGRESS_BAR_ENV == environment_variables.MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name
    assert names.SOURCE_NAME == mlflow_tags.MLFLOW_SOURCE_NAME
    assert names.SOURCE_GIT_COMMIT == mlflow_tags.MLFLOW_GIT_COMMIT
    assert names.SOURCE_GIT_COMMIT.startswith(names.MLFLOW_GIT_PREFIX)
    assert names.DATASET_CONTEXT == mlflow_tags.MLFLOW_DATASET_CONTEXT


def test_shape_label_is_neurons_by_time_steps_by_contacts() -> None:
    assert names.shape_label(64, 256, 32) == "64x256x32"
    assert names.shape_size("64x256x32") == 64 * 256 * 32 and names.shape_size("?") == 0


def test_a_metric_is_milliseconds_by_its_name_unless_it_is_a_count_or_a_ratio() -> None:
    durations = (
        names.UPDATE_SERIES,
        names.FIRST_UPDATE,
        names.CAPTURE,
        names.phase_metric(names.bucket_phase(64)),
        names.UPDATE_MEDIAN,
        names.bucket_update_metric(64, "p10"),
        names.device_metric("p90"),
        names.HOST_OVERHEAD_MEDIAN,
        names.PROCESS_TOTAL,
        names.threads_calibration_metric(2),
    )
    assert [metric for metric in durations if not names.is_milliseconds(metric)] == []
    others = (
        names.UPDATE_REL_IQR,
        names.bucket_update_metric(64, "rel_iqr"),
        names.update_metric("count"),
        names.MEASURED_COMPLETED,
        names.STREAMS_PER_S,
        names.LOSS_FINAL,
    )
    assert [metric for metric in others if names.is_milliseconds(metric)] == []
