"""The report's rows, from runs with known timings in a real sqlite store (no timing measured)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, gone_reader
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.report.__main__ import main as report_main
from axoexp.report.figure import CONTENDED_LABEL, plot, tick_labels, x_dimension
from axoexp.report.length_figure import LENGTHS_FIGURE, plot_lengths
from axoexp.report.pareto import front_axes
from axoexp.report.rows import BucketRow, ReportRow, build_rows, sweep_runs
from axoexp.report.table import BUCKETS_HEADING, format_buckets, format_table
from axoexp.tracking import RUNS_VIEW_COLUMNS


def logged_run(
    client: MlflowClient,
    experiment_id: str,
    executor: str,
    shape: str,
    median_ms: float,
    *,
    parent: str | None = None,
    status: str = "FINISHED",
    contention: str | None = "none",
    **params: str,
) -> str:
    """A run of ``executor`` at ``shape``; ``contention=None``: logged without timing labels, as
    before axoexp recorded them."""
    tags = {names.component_tag("executor"): executor, names.SHAPE: shape}
    if contention is not None:
        tags[names.TIMING_CONTENTION] = contention
        tags[names.TIMING_NOISE] = "low" if contention == "none" else "high"
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
    logged_run(client, experiment, "eager", "2x12x4", 10.0, parent=parent)
    logged_run(client, experiment, "sleepy", "2x12x4", 20.0, parent=parent)
    logged_run(client, experiment, "eager", "3x12x4", 30.0, parent=parent)
    logged_run(client, experiment, "fast", "3x12x4", 3.0, parent=parent)
    logged_run(client, experiment, "fast", "3x12x4", 6.0, parent=parent, **{"optimizer.lr": "0.1"})

    rows = build_rows(sweep_runs(client, client.get_run(parent)))
    by_key = {(row.shape, row.executor, row.median_ms): row for row in rows}
    assert [(row.shape, row.executor) for row in rows][:2] == [("2x12x4", "eager"), ("2x12x4", "sleepy")]
    assert by_key[("2x12x4", "sleepy", 20.0)].speedup_vs_eager == pytest.approx(0.5)
    assert by_key[("3x12x4", "fast", 3.0)].speedup_vs_eager == pytest.approx(10.0)
    assert by_key[("2x12x4", "eager", 10.0)].speedup_vs_eager == pytest.approx(1.0)
    assert math.isnan(by_key[("3x12x4", "fast", 6.0)].speedup_vs_eager), "no eager run with that lr"


def test_runs_that_differ_only_in_an_executor_setting_are_rows_apart_each_against_eager(
    client: MlflowClient, experiment: str
) -> None:
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    logged_run(client, experiment, "eager", "2x12x4", 10.0, parent=parent)
    for buckets, median in (("0", 2.0), ("0", 2.0), ("4", 5.0)):
        logged_run(client, experiment, "cudagraph", "2x12x4", median, parent=parent, **{"executor.buckets": buckets})

    rows = build_rows(sweep_runs(client, client.get_run(parent)))
    graphs = {row.setting("executor.buckets"): row for row in rows if row.executor == "cudagraph"}
    assert sorted(graphs) == ["0", "4"] and len(rows) == 3
    assert (graphs["0"].repeats, graphs["4"].repeats) == (2, 1)
    assert graphs["0"].speedup_vs_eager == pytest.approx(5.0) and graphs["4"].speedup_vs_eager == pytest.approx(2.0)
    assert graphs["4"].settings_text == "executor.buckets=4"
    eager = next(row for row in rows if row.executor == "eager")
    assert eager.speedup_vs_eager == pytest.approx(1.0) and eager.setting("executor.buckets") == ""


def test_failed_eager_run_is_no_baseline_and_reused_runs_are_included(client: MlflowClient, experiment: str) -> None:
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    logged_run(client, experiment, "eager", "2x12x4", 10.0, parent=parent, status="FAILED")
    earlier = logged_run(client, experiment, "cudagraph", "2x12x4", 1.0)
    client.set_tag(parent, f"{names.REUSED_PREFIX}job1", earlier)

    rows = build_rows(sweep_runs(client, client.get_run(parent)))
    assert {row.run_id for row in rows} >= {earlier}
    assert all(math.isnan(row.speedup_vs_eager) for row in rows)


@pytest.mark.parametrize("labelled", [True, False])
def test_a_run_that_did_not_finish_has_no_speedup_or_labels_whatever_it_logged(
    client: MlflowClient, experiment: str, labelled: bool
) -> None:
    """A KILLED run's row got a speedup where it carried quiet labels and none where it carried
    none, while its labels always showed blank: both are now judged from FINISHED runs only."""
    logged_run(client, experiment, "eager", "2x12x4", 10.0)
    logged_run(client, experiment, "cudagraph", "2x12x4", 2.0, status="KILLED", contention="none" if labelled else None)
    runs = client.search_runs([experiment])
    for include_contended in (False, True):
        rows = {row.executor: row for row in build_rows(runs, include_contended=include_contended)}
        assert rows["eager"].speedup_vs_eager == 1.0 and rows["eager"].contention == "none"
        killed = rows["cudagraph"]
        assert killed.status == "KILLED" and math.isnan(killed.speedup_vs_eager)
        assert (killed.contention, killed.noise) == ("", "")


def test_rows_name_the_swept_settings_without_bookkeeping_and_mark_reused_runs(
    client: MlflowClient, experiment: str
) -> None:
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    for executor, lr, median in (("eager", "0.1", 10.0), ("fast", "0.1", 2.0), ("eager", "0.2", 10.0)):
        run_id = logged_run(
            client,
            experiment,
            executor,
            "2x12x4",
            median,
            parent=parent,
            **{"optimizer.lr": lr, "sweep.resume": "same_sweep", "run.progress": executor},
        )
    earlier = logged_run(client, experiment, "fast", "2x12x4", 4.0, **{"optimizer.lr": "0.2"})
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
    _row("eager", 3, 12, 4.0, 1.0, contention="none", noise="low"),
    _row(
        "cudagraph",
        3,
        12,
        0.4,
        10.0,
        speedup_low=9.0,
        speedup_high=11.0,
        contention="none",
        noise="low",
        run_ids=("cudagraph312", "cudagraph312-b"),
    ),
    _row("eager", 64, 12, 8.0, 1.0, contention="none", noise="low"),
    _row("cudagraph", 64, 12, 1.0, 8.0, reused=True, contention="none", noise="low"),
    _row("cudagraph", 64, 12, 9.0, math.nan, contention="cpu", noise="high"),
]


def test_the_table_prints_as_text_markdown_csv_and_json() -> None:
    text = format_table(ROWS).splitlines()
    assert text[0].split()[:4] == ["shape", "executor", "status", "median"]
    assert "nan" not in "\n".join(text), "a missing value is blank"
    assert text[0].split()[-6:] == ["contention", "noise", "reused", "settings", "run", "id"]
    assert text[4].split()[-6:] == ["none", "low", "reused", "neurons=64", "time_steps=12", "cudagraph6412"]
    assert text[5].split()[-5:-3] == ["cpu", "high"]
    markdown = format_table(ROWS, "markdown").splitlines()
    assert markdown[0].startswith("| shape | executor |") and markdown[1].startswith("| --- | --- | --- | ---: |")
    assert markdown[3] == (
        "| 3x12x4 | cudagraph | FINISHED | 0.400 | 0.360 | 0.480 | 20.0 | 10x | [9, 11] | 1 | none | low |  | "
        "neurons=3 time_steps=12 | cudagraph312 |"
    )
    assert markdown[6].split(" | ")[10:12] == ["cpu", "high"]
    records = list(csv.DictReader(io.StringIO(format_table(ROWS, "csv"))))
    assert records[1]["speedup_low"] == "9.0" and records[0]["capture_ms"] == "" and records[3]["reused"] == "True"
    assert (records[4]["contention"], records[4]["noise"]) == ("cpu", "high")
    assert records[1]["settings"] == "neurons=3 time_steps=12", "readable, not a Python repr"
    assert records[1]["run_ids"] == " ".join(ROWS[1].run_ids)
    parsed = json.loads(format_table(ROWS, "json"))
    assert parsed[0]["capture_ms"] is None and parsed[1]["settings"] == {"neurons": "3", "time_steps": "12"}
    assert (parsed[4]["contention"], parsed[4]["noise"]) == ("cpu", "high")


def test_a_speedup_prints_inside_its_printed_interval() -> None:
    """0.2014 beside an interval from 0.2008 read "0.20x [0.201, 0.203]" (a CI run of
    test_sweep_repeats_are_child_runs_that_the_report_pools): both now round alike."""
    row = _row("sleepy", 3, 12, 5.0, 0.2014, speedup_low=0.2008, speedup_high=0.2031, contention="none", noise="low")
    cells = format_table([row], "markdown").splitlines()[2].split(" | ")
    assert cells[7:9] == ["0.201x", "[0.201, 0.203]"]
    large = dataclasses.replace(row, speedup_vs_eager=1234.5, speedup_low=999.6, speedup_high=1500.0)
    cells = format_table([large], "markdown").splitlines()[2].split(" | ")
    assert cells[7:9] == ["1230x", "[1000, 1500]"], "never 1.23e+03x"


def test_the_latency_axis_is_the_swept_numeric_setting(tmp_path: Path) -> None:
    assert x_dimension(ROWS) == "neurons", "time_steps does not vary: no panels"
    plot(ROWS, "sweep\nCPU · torch 2 · today", tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_pareto_figure_puts_a_latency_along_x_and_a_ratio_is_none() -> None:
    minimized = [(names.UPDATE_REL_IQR, "minimize"), (names.UPDATE_MEDIAN, "minimize")]
    assert front_axes(minimized) == (names.UPDATE_MEDIAN, names.UPDATE_REL_IQR), "update_ms_rel_iqr is IQR / median"
    assert front_axes([("loss_final", "minimize"), (names.CAPTURE, "minimize")]) == (names.CAPTURE, "loss_final")


def test_contended_runs_are_rows_of_their_own_without_a_speedup_unless_included(
    client: MlflowClient, experiment: str
) -> None:
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    for executor, median, contention in (("eager", 10.0, "none"), ("eager", 40.0, "cpu"), ("fast", 2.0, "none")):
        logged_run(client, experiment, executor, "2x12x4", median, parent=parent, contention=contention)
    logged_run(client, experiment, "fast", "2x12x4", 30.0, parent=parent, contention="cpu,gpu-shared")
    runs = sweep_runs(client, client.get_run(parent))

    rows = {(row.executor, row.contention): row for row in build_rows(runs)}
    assert set(rows) == {("eager", "none"), ("eager", "cpu"), ("fast", "none"), ("fast", "cpu,gpu-shared")}
    assert rows[("fast", "none")].speedup_vs_eager == pytest.approx(5.0), "quiet against quiet only"
    assert rows[("fast", "cpu,gpu-shared")].contended and rows[("fast", "cpu,gpu-shared")].noise == "high"
    assert math.isnan(rows[("fast", "cpu,gpu-shared")].speedup_vs_eager)
    assert math.isnan(rows[("eager", "cpu")].speedup_vs_eager), "a contended eager run is no baseline"

    pooled = {row.executor: row for row in build_rows(runs, include_contended=True)}
    assert pooled["fast"].repeats == 2 and pooled["fast"].contention == "cpu,gpu-shared"
    assert pooled["fast"].speedup_vs_eager == pytest.approx(25.0 / 16.0)


def test_runs_without_timing_labels_are_set_apart_as_load_not_recorded_unless_included(
    client: MlflowClient, experiment: str
) -> None:
    """An older store's runs lack timing.contention and timing.noise: their load is unknown, so they
    are rows of their own, marked, without a speedup, and no eager baseline, as contended runs are."""
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    for executor, median, contention in (("eager", 10.0, "none"), ("eager", 40.0, None), ("fast", 2.0, "none")):
        logged_run(client, experiment, executor, "2x12x4", median, parent=parent, contention=contention)
    logged_run(client, experiment, "fast", "2x12x4", 8.0, parent=parent, contention=None)
    runs = sweep_runs(client, client.get_run(parent))

    rows = {(row.executor, row.contention): row for row in build_rows(runs)}
    assert set(rows) == {("eager", "none"), ("eager", "not recorded"), ("fast", "none"), ("fast", "not recorded")}
    unrecorded = rows[("fast", "not recorded")]
    assert (unrecorded.noise, unrecorded.contended, unrecorded.repeats) == ("not recorded", True, 1)
    assert math.isnan(unrecorded.speedup_vs_eager) and math.isnan(rows[("eager", "not recorded")].speedup_vs_eager)
    assert rows[("fast", "none")].speedup_vs_eager == pytest.approx(5.0), "quiet against quiet only"
    assert "not recorded" in format_table(list(rows.values())).splitlines()[-1]

    pooled = {row.executor: row for row in build_rows(runs, include_contended=True)}
    assert (pooled["fast"].repeats, pooled["fast"].contention, pooled["fast"].contended) == (2, "not recorded", True)
    assert pooled["fast"].speedup_vs_eager == pytest.approx(25.0 / 5.0)


def test_the_mlflow_view_shows_contention_and_noise() -> None:
    assert {f"tags.`{names.TIMING_CONTENTION}`", f"tags.`{names.TIMING_NOISE}`"} <= set(RUNS_VIEW_COLUMNS)


def _labels_in_view(axes) -> tuple[list[str], list[str]]:
    return tick_labels(axes.xaxis), tick_labels(axes.yaxis)


@pytest.mark.parametrize(
    ("medians", "scale"),
    [
        ((1.21, 1.26, 1.31, 1.74), "linear"),  # CPU medians between 1 and 2 ms: no decade inside
        ((0.4, 1.3, 4.2, 9.6), "log"),  # a log axis whose only decade ticks were "2" and "5" above the points
        ((0.05, 3.0, 40.0, 200.0), "log"),
    ],
)
def test_every_numeric_axis_has_three_labelled_ticks_across_the_data(
    tmp_path: Path, medians: tuple[float, ...], scale: str
) -> None:
    rows = [
        _row("eager", 3, 12, medians[0] * 1.1, 1.0),
        _row("cudagraph", 3, 12, medians[1], medians[0] * 1.1 / medians[1]),
        _row("eager", 64, 12, medians[3], 1.0),
        _row("cudagraph", 64, 12, medians[2], medians[3] / medians[2]),
    ]
    rows = [dataclasses.replace(row, p10_ms=row.median_ms, p90_ms=row.median_ms) for row in rows]
    figure = plot(rows, "sweep", tmp_path / "report.png")
    latency, speedup = figure.axes
    assert latency.get_yscale() == scale
    for axis in (latency.xaxis, latency.yaxis, speedup.yaxis):
        labels = tick_labels(axis)
        assert len(labels) >= 3, (axis, labels)
        assert all(label.replace(".", "").replace("x", "").isdigit() for label in labels), labels
    annotations = {text.get_text() for text in latency.texts}
    assert {f"{value:.3g}" for value in (medians[1], medians[2])} <= annotations, "few points: values written"


def test_a_speedup_near_one_has_labelled_ticks_and_contended_points_have_a_legend(tmp_path: Path) -> None:
    rows = [
        _row("eager", 3, 12, 1.3, 1.0),
        _row("cudagraph", 3, 12, 1.2, 1.08, speedup_low=1.01, speedup_high=1.15),
        _row("eager", 64, 12, 1.5, 1.0),
        _row("cudagraph", 64, 12, 1.4, 1.07),
        _row("cudagraph", 64, 12, 9.0, math.nan, contention="cpu", noise="high"),
    ]
    figure = plot(rows, "sweep", tmp_path / "report.png")
    speedup_labels = tick_labels(figure.axes[1].yaxis)
    assert len(speedup_labels) >= 3 and all(label.endswith("x") for label in speedup_labels), speedup_labels
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert CONTENDED_LABEL in legend
    hollow = [line for line in figure.axes[0].lines if line.get_markerfacecolor() == "none"]
    assert [tuple(line.get_ydata()) for line in hollow] == [(9.0,)]


def test_a_figure_with_nothing_finished_says_so_and_long_titles_wrap(tmp_path: Path) -> None:
    failed = [dataclasses.replace(row, status="FAILED", median_ms=math.nan) for row in ROWS[:2]]
    heading = "sweep 12-03 18:00:00 " + " ".join(f"optimizer.option_{index}=a,b,c" for index in range(12))
    figure = plot(failed, heading + "\nCPU x86_64 · torch 2.13 · 2026-12-03", tmp_path / "report.png")
    texts = [text.get_text() for axes in figure.axes for text in axes.texts]
    assert texts == [
        "no run finished (2 FAILED): nothing to plot;\nthe table lists each run and the parent's tags say why"
    ]
    title = figure._suptitle.get_text().splitlines()
    assert len(title) > 2 and max(map(len, title)) <= figure.get_figwidth() * 13


def test_the_report_answers_a_single_run_in_one_line_and_an_unknown_parent_with_exit_2(
    client: MlflowClient, tracking_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = client.create_experiment("axoexp")
    single = logged_run(client, experiment, "eager", "3x12x4", 1.25, contention="none")
    argv = ["--tracking-uri", tracking_uri, "--out", str(tmp_path / "figure.png")]
    report_main([*argv, "--parent", single])
    out = capsys.readouterr().out
    assert out.startswith(f"run {single} 'executor=eager' is a single run, not a sweep: eager 3x12x4 FINISHED, ")
    assert out.endswith("contention none, noise low\n") and out.count("\n") == 1
    assert not (tmp_path / "figure.png").exists(), "no empty figure"
    with pytest.raises(SystemExit) as exit_info:
        report_main([*argv, "--parent", "nope"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"axoexp.report: --parent nope: no such run at {tracking_uri}\n"


def test_the_report_names_a_jobs_sweep_a_missing_experiment_and_a_sweep_without_runs(
    client: MlflowClient, tracking_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sweep's job given as --parent names its sweep and the command that reports it (it once
    said "a single run"); --experiment naming none says so and lists those there (it once said "no
    sweep in experiment"); a sweep with no runs (its launcher failed) says why in one line, where it
    once printed an empty table and wrote an empty figure."""
    experiment = client.create_experiment("axoexp")
    parent = client.create_run(experiment, run_name="sweep", tags={names.SWEEP_ROLE: "parent"}).info.run_id
    job = logged_run(client, experiment, "eager", "3x12x4", 1.25, parent=parent)
    argv = ["--tracking-uri", tracking_uri, "--out", str(tmp_path / "figure.png")]
    report_main([*argv, "--parent", job])
    out = capsys.readouterr().out
    assert out.startswith(f"run {job} 'executor=eager' is a job of sweep {parent}, not a sweep: eager 3x12x4 ")
    assert out.endswith(f"; its sweep's report: python -m axoexp.report --parent {parent}\n"), out
    with pytest.raises(SystemExit) as exit_info:
        report_main([*argv, "--experiment", "nope"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"axoexp.report: no experiment 'nope' in {tracking_uri} (its experiments: axoexp, Default); "
        "--experiment names one, or run a sweep: python -m axoexp -m ...\n"
    )
    empty = client.create_run(experiment, run_name="sweep 2", tags={names.SWEEP_ROLE: "parent"}).info.run_id
    client.set_tag(empty, names.FAILURE, "2 of 2 jobs never started; no Ray instance at ...")
    client.set_terminated(empty, "FAILED")
    report_main([*argv, "--parent", empty])
    assert capsys.readouterr().out == (
        f"sweep {empty} 'sweep 2' has no runs to report: it ended FAILED: 2 of 2 jobs never started; "
        "no Ray instance at ...\n"
    )
    assert not (tmp_path / "figure.png").exists(), "no empty figure"


def report_sweep(client: MlflowClient, tmp_path: Path) -> str:
    """A sweep's parent with two runs, in an experiment whose artifacts go to ``tmp_path/artifacts``."""
    experiment = client.create_experiment("axoexp", artifact_location=str(tmp_path / "artifacts"))
    parent = client.create_run(experiment, run_name="sweep", tags={names.SWEEP_ROLE: "parent"}).info.run_id
    logged_run(client, experiment, "eager", "2x12x4", 10.0, parent=parent, contention="none")
    logged_run(client, experiment, "eager", "3x12x4", 12.0, parent=parent, contention="none")
    client.set_terminated(parent)
    return parent


def test_out_names_a_figure_file_or_a_directory_for_it_else_one_line(
    client: MlflowClient, tracking_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parent = report_sweep(client, tmp_path)
    folder = tmp_path / "figs"
    (folder / "mlruns").mkdir(parents=True)  # a directory with a store in it: only the figure is logged
    argv = ["--tracking-uri", tracking_uri, "--parent", parent, "--format", "csv", "--out"]
    report_main([*argv, str(folder)])
    assert capsys.readouterr().err == (
        f"report: {folder / 'report.png'}, {folder / 'report.csv'} (also logged to the parent run)\n"
    )
    assert sorted(item.path for item in client.list_artifacts(parent)) == ["report.csv", "report.png"]
    report_main([*argv, str(folder / "r.svg")])
    assert (folder / "r.svg").read_text().startswith("<?xml"), "the type the suffix names"
    assert capsys.readouterr().err.startswith(f"report: {folder / 'r.svg'}, ")

    for out, message in (
        (tmp_path / "fig", "neither an existing directory nor a figure file; end it in one of "),
        (tmp_path / "r.txt", "neither an existing directory nor a figure file; end it in one of "),
        (tmp_path / "nodir" / "r.png", f"directory {tmp_path / 'nodir'} does not exist; create it"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            report_main([*argv, str(out)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.startswith(f"axoexp.report: --out {out}: ") and message in err, err
        assert err.count("\n") == 1 and ".png" in err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["artifacts", "figs", "mlflow.db"], (
        "nothing else written"
    )


def test_a_figure_that_cannot_be_written_is_refused_before_anything_is_printed(
    client: MlflowClient, tracking_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """/proc takes no new file, for root too (whom a read-only directory would not stop): an --out
    there is refused before the store is read, and the sweep's own folder, where --out is not given,
    before the table is printed; one line, exit 2, nothing printed, nothing logged."""
    parent = report_sweep(client, tmp_path)
    absent = f"sqlite:///{tmp_path / 'absent.db'}"  # read first, it would say there is no store
    for uri, out, where in (
        (tracking_uri, "/proc/x.png", "there"),
        (absent, "/proc/x.png", "there"),
        (tracking_uri, "/proc", "/proc/report.png"),
    ):
        with pytest.raises(SystemExit) as ended:
            report_main(["--tracking-uri", uri, "--parent", parent, "--out", out])
        printed, err = capsys.readouterr()
        assert (ended.value.code, printed) == (2, "")
        refused = rf"axoexp.report: --out {out}: cannot write {where} \(.+\); choose another path\n"
        assert re.fullmatch(refused, err), err

    client.set_tag(parent, names.SWEEP_DIR, "/proc")
    with pytest.raises(SystemExit) as ended:
        report_main(["--tracking-uri", tracking_uri, "--parent", parent])
    printed, err = capsys.readouterr()
    assert (ended.value.code, printed) == (2, "")
    assert re.fullmatch(r"axoexp.report: cannot write /proc/report.png \(.+\); --out chooses another place\n", err), err
    assert client.list_artifacts(parent) == []


@pytest.mark.slow
def test_a_reader_that_stops_early_still_gets_the_files_written(
    client: MlflowClient, tracking_uri: str, tmp_path: Path
) -> None:
    """``report --format csv | head -1``: the reader closes the pipe; the figure and CSV still follow."""
    parent = report_sweep(client, tmp_path)
    with gone_reader() as write:
        args = ["--tracking-uri", tracking_uri, "--parent", parent, "--format", "csv", "--out", str(tmp_path)]
        ended = subprocess.run(
            [sys.executable, "-m", "axoexp.report", *args], cwd=REPO, stdout=write, stderr=subprocess.PIPE, text=True
        )
    assert ended.returncode == 0 and ended.stderr.startswith(f"report: {tmp_path / 'report.png'}, "), ended.stderr
    assert sorted(item.path for item in client.list_artifacts(parent)) == ["report.csv", "report.png"]


def _with_buckets(
    client: MlflowClient, run_id: str, buckets_tag: str, padding: float, buckets: dict[int, tuple[float, ...]]
) -> None:
    """Log what a run with ``population.lengths`` logs: per bucket (count, median, p10, p90)."""
    client.set_tag(run_id, names.LENGTH_BUCKETS, buckets_tag)
    client.log_metric(run_id, names.PADDING_OVERHEAD, padding)
    for bucket, values in buckets.items():
        for stat, value in zip(("count", "median", "p10", "p90"), values, strict=False):
            client.log_metric(run_id, names.bucket_update_metric(bucket, stat), value)
    client.log_metric(run_id, names.bucket_verify_metric(bucket, "verify_passed"), 1.0)  # not a latency


def test_runs_with_length_buckets_report_each_bucket_and_plot_latency_against_length(
    client: MlflowClient, experiment: str, tmp_path: Path
) -> None:
    parent = client.create_run(experiment, run_name="sweep").info.run_id
    lengths = {"population.lengths": "uniform:20:64"}
    eager = logged_run(client, experiment, "eager", "3x40x4", 2.0, parent=parent, **lengths)
    _with_buckets(client, eager, "exact", 1.0, {20: (2, 1.0, 0.9, 1.1), 41: (1, 2.0, 2.0, 2.0), 64: (3, 3.0, 2.8, 3.3)})
    graphs = logged_run(client, experiment, "cudagraph", "3x40x4", 0.5, parent=parent, **lengths)
    _with_buckets(client, graphs, "32,48,64", 1.25, {32: (2, 0.3, 0.25, 0.35), 48: (1, 0.4), 64: (3, 0.5, 0.45, 0.6)})
    logged_run(client, experiment, "eager", "3x12x4", 1.0, parent=parent)  # a fixed length: no buckets

    rows = build_rows(sweep_runs(client, client.get_run(parent)))
    by_executor = {row.executor: row for row in rows if row.length_buckets}
    assert sorted(by_executor) == ["cudagraph", "eager"] and len(rows) == 3
    padded, exact = by_executor["cudagraph"], by_executor["eager"]
    assert padded.padded and not exact.padded and padded.padding_overhead == 1.25 and padded.lengths == "uniform:20:64"
    first, middle, last = padded.length_buckets
    assert (first, last) == (BucketRow(32, 2, 0.3, 0.25, 0.35), BucketRow(64, 3, 0.5, 0.45, 0.6))
    assert (middle.bucket, middle.count, middle.median_ms) == (48, 1, 0.4)
    assert math.isnan(middle.p10_ms) and math.isnan(middle.p90_ms), "a statistic not logged stays missing"
    assert [bucket.bucket for bucket in exact.length_buckets] == [20, 41, 64]

    text = format_table(rows).splitlines()
    start = text.index(BUCKETS_HEADING)
    cells = [line.split() for line in text[start + 2 :]]  # shape executor settings bucket lengths updates ...
    lines = {(line[1], *line[3:6]): line[6:] for line in cells}
    assert lines[("cudagraph", "32", "20-32", "2")] == ["0.300", "0.250", "0.350", "1.250x", graphs]
    assert lines[("cudagraph", "48", "33-48", "1")] == ["0.400", "1.250x", graphs], "missing values are blank"
    assert lines[("eager", "41", "41", "1")] == ["2.000", "2.000", "2.000", "1.000x", eager]
    assert len(lines) == 6 and text[start + 1].split()[:4] == ["shape", "executor", "settings", "bucket"]
    markdown = format_table(rows, "markdown")
    assert (
        f"| 3x40x4 | cudagraph | time_steps=40 | 64 | 49-64 | 3 | 0.500 | 0.450 | 0.600 | 1.250x | {graphs} |"
        in markdown
    )
    records = list(csv.DictReader(io.StringIO(format_buckets(rows, "csv"))))
    assert [tuple(record.values())[3:11] for record in records][1:4] == [
        ("48", "33", "48", "1", "0.4", "", "", "1.25"),
        ("64", "49", "64", "3", "0.5", "0.45", "0.6", "1.25"),
        ("20", "20", "20", "2", "1.0", "0.9", "1.1", "1.0"),
    ]
    assert "length_buckets" not in next(csv.DictReader(io.StringIO(format_table(rows, "csv"))))
    parsed = {row["executor"]: row for row in json.loads(format_table(rows, "json")) if row["length_buckets"]}
    assert parsed["cudagraph"]["length_buckets"][1] == {
        "bucket": 48,
        "count": 1,
        "median_ms": 0.4,
        "p10_ms": None,
        "p90_ms": None,
    }

    figure = plot_lengths(rows, "sweep\nCPU · torch 2 · today", tmp_path / LENGTHS_FIGURE)
    assert (tmp_path / LENGTHS_FIGURE).is_file()
    (axes,) = figure.axes
    assert tick_labels(axes.xaxis) == ["32", "48", "64"], "the bucket boundaries label the length axis"
    assert len(tick_labels(axes.yaxis)) >= 3
    assert [text.get_text() for text in axes.get_legend().get_texts()] == [
        "cudagraph time_steps=40 (padding 1.25x)",
        "eager time_steps=40 (exact lengths)",
    ]
    boundaries = [line.get_xdata()[0] for line in axes.lines if line.get_linestyle() == ":"]
    assert boundaries == [32, 48, 64]
    spans = [segment[:, 0].tolist() for collection in axes.collections for segment in collection.get_segments()]
    assert [20.0, 32.0] in spans and [33.0, 48.0] in spans, "each padded bucket's bar spans the lengths it holds"
