"""The report's rows, from runs with known timings in a real sqlite store (no timing measured)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.report.figure import plot, x_dimension
from axoexp.report.rows import ReportRow, build_rows, sweep_runs
from axoexp.report.table import format_table


def _logged_run(
    client: MlflowClient,
    experiment_id: str,
    executor: str,
    shape: str,
    median_ms: float,
    *,
    parent: str | None = None,
    status: str = "FINISHED",
    **params: str,
) -> str:
    tags = {names.component_tag("executor"): executor, names.SHAPE: shape}
    if parent:
        tags[names.PARENT_RUN_ID] = parent
    run = client.create_run(experiment_id, run_name=f"executor={executor}", tags=tags)
    neurons, time_steps, contacts = shape.split("x")
    for key, value in {
        "executor.name": executor,
        "population.neurons": neurons,
        "population.time_steps": time_steps,
        "population.contacts": contacts,
        "tracking.uri": "ignored",
        **params,
    }.items():
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


def test_rows_name_the_swept_settings_without_bookkeeping_and_mark_reused_runs(
    client: MlflowClient, experiment: str
) -> None:
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    for executor, lr, median in (("eager", "0.1", 10.0), ("fast", "0.1", 2.0), ("eager", "0.2", 10.0)):
        run_id = _logged_run(
            client,
            experiment,
            executor,
            "2x12x4",
            median,
            parent=parent,
            **{"optimizer.lr": lr, "sweep.resume": "same_sweep", "run.progress": executor},
        )
    earlier = _logged_run(client, experiment, "fast", "2x12x4", 4.0, **{"optimizer.lr": "0.2"})
    client.set_tag(parent, f"{names.REUSED_PREFIX}job3", earlier)

    rows = build_rows(sweep_runs(client, client.get_run(parent)), parent_id=parent)
    assert {row.settings for row in rows} == {(("optimizer.lr", "0.1"),), (("optimizer.lr", "0.2"),)}
    assert [row.run_id for row in rows if row.reused] == [earlier]
    reused = next(row for row in rows if row.reused)
    assert reused.speedup_vs_eager == pytest.approx(2.5) and reused.speedup_low is None
    assert run_id in {row.run_id for row in rows}


def _row(executor: str, neurons: int, time_steps: int, median: float, speedup: float, **extra) -> ReportRow:
    return ReportRow(
        shape=f"{neurons}x{time_steps}x4",
        executor=executor,
        status="FINISHED",
        median_ms=median,
        capture_ms=math.nan if executor == "eager" else 20.0,
        speedup_vs_eager=speedup,
        run_id=f"{executor}{neurons}{time_steps}",
        job="",
        p10_ms=median * 0.9,
        p90_ms=median * 1.2,
        settings=(("neurons", str(neurons)), ("time_steps", str(time_steps))),
        **extra,
    )


ROWS = [
    _row("eager", 3, 12, 4.0, 1.0),
    _row("cudagraph", 3, 12, 0.4, 10.0, speedup_low=9.0, speedup_high=11.0),
    _row("eager", 64, 12, 8.0, 1.0),
    _row("cudagraph", 64, 12, 1.0, 8.0, reused=True),
]


def test_the_table_prints_as_text_markdown_csv_and_json() -> None:
    text = format_table(ROWS).splitlines()
    assert text[0].split()[:4] == ["shape", "executor", "status", "median"]
    assert "nan" not in "\n".join(text), "a missing value is blank"
    assert text[4].split()[-4:] == ["reused", "neurons=64", "time_steps=12", "cudagraph6412"]
    markdown = format_table(ROWS, "markdown").splitlines()
    assert markdown[0].startswith("| shape | executor |") and markdown[1].startswith("| --- | --- | --- | ---: |")
    assert markdown[3] == (
        "| 3x12x4 | cudagraph | FINISHED | 0.400 | 0.360 | 0.480 | 20.0 | 10.00x | [9, 11] | 1 |  | "
        "neurons=3 time_steps=12 | cudagraph312 |"
    )
    records = list(csv.DictReader(io.StringIO(format_table(ROWS, "csv"))))
    assert records[1]["speedup_low"] == "9.0" and records[0]["capture_ms"] == "" and records[3]["reused"] == "True"
    parsed = json.loads(format_table(ROWS, "json"))
    assert parsed[0]["capture_ms"] is None and parsed[1]["settings"] == {"neurons": "3", "time_steps": "12"}


def test_the_latency_axis_is_the_swept_numeric_setting(tmp_path: Path) -> None:
    assert x_dimension(ROWS) == "neurons", "time_steps does not vary: no panels"
    plot(ROWS, "sweep\nCPU · torch 2 · today", tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
