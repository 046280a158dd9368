"""The report's rows, from runs with known timings in a real sqlite store (no timing measured)."""

from __future__ import annotations

import math

import pytest
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.report import build_rows, sweep_runs


def _logged_run(client: MlflowClient, experiment_id: str, executor: str, shape: str, median_ms: float,
                *, parent: str | None = None, status: str = "FINISHED", **params: str) -> str:
    tags = {names.component_tag("executor"): executor, names.SHAPE: shape}
    if parent:
        tags[names.PARENT_RUN_ID] = parent
    run = client.create_run(experiment_id, run_name=f"executor={executor}", tags=tags)
    neurons, time_steps, contacts = shape.split("x")
    for key, value in {"executor.name": executor, "population.neurons": neurons,
                       "population.time_steps": time_steps, "population.contacts": contacts,
                       "tracking.uri": "ignored", **params}.items():
        client.log_param(run.info.run_id, key, value)
    client.log_metric(run.info.run_id, names.UPDATE_MEDIAN, median_ms)
    client.set_terminated(run.info.run_id, status=status)
    return run.info.run_id


@pytest.fixture
def experiment(client: MlflowClient) -> str:
    return client.create_experiment("report")


def test_speedup_pairs_runs_that_differ_only_in_executor(client: MlflowClient, experiment: str) -> None:
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    _logged_run(client, experiment, "eager", "2x12x4", 10.0, parent=parent)
    _logged_run(client, experiment, "sleepy", "2x12x4", 20.0, parent=parent)
    _logged_run(client, experiment, "eager", "3x12x4", 30.0, parent=parent)
    _logged_run(client, experiment, "fast", "3x12x4", 3.0, parent=parent)
    _logged_run(client, experiment, "fast", "3x12x4", 6.0, parent=parent, **{"optimizer.lr": "0.1"})

    rows = build_rows(sweep_runs(client, client.get_run(parent)))
    by_key = {(row.shape, row.executor, row.median_ms): row for row in rows}
    assert [(row.shape, row.executor) for row in rows][:2] == [("2x12x4", "eager"), ("2x12x4", "sleepy")]
    assert by_key[("2x12x4", "sleepy", 20.0)].speedup_vs_eager == pytest.approx(0.5)
    assert by_key[("3x12x4", "fast", 3.0)].speedup_vs_eager == pytest.approx(10.0)
    assert by_key[("2x12x4", "eager", 10.0)].speedup_vs_eager == pytest.approx(1.0)
    assert math.isnan(by_key[("3x12x4", "fast", 6.0)].speedup_vs_eager), "no eager run with that lr"


def test_failed_eager_run_is_no_baseline_and_reused_runs_are_included(client: MlflowClient, experiment: str) -> None:
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    _logged_run(client, experiment, "eager", "2x12x4", 10.0, parent=parent, status="FAILED")
    earlier = _logged_run(client, experiment, "cudagraph", "2x12x4", 1.0)
    client.set_tag(parent, f"{names.REUSED_PREFIX}job1", earlier)

    rows = build_rows(sweep_runs(client, client.get_run(parent)))
    assert {row.run_id for row in rows} >= {earlier}
    assert all(math.isnan(row.speedup_vs_eager) for row in rows)
