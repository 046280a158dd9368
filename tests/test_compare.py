"""``python -m axoexp.compare``: verdicts on real sqlite stores whose runs have known per-update series."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, gone_reader, run_clis
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from axoexp import metadata, names
from axoexp.compare import main, parse_threshold, too_few_runs, verdict
from axoexp.errors import ComparisonError
from axoexp.statistics import MIN_RUNS, NOISE_THRESHOLD

UPDATES = [10.0 + 0.01 * (index % 10) for index in range(60)]  # median 10.045 ms, tight


def _run(
    client: MlflowClient,
    experiment: str,
    parent: str | None,
    lr: str,
    scale: float,
    *,
    commit: str = "aaaa",
    repeat: int = 0,
    status: str = "FINISHED",
    params: dict[str, str] | None = None,
    labelled: bool = True,
    series: bool = True,
    **tags: str,
) -> str:
    """A FINISHED run of eager at 2x12x4 and ``optimizer.lr=lr`` (and ``params``) whose updates take
    ``scale`` x UPDATES; ``labelled=False``: without timing.contention and timing.noise, as an older
    store's runs; ``series=False``: its median only, without the per-update series."""
    all_tags = {
        names.component_tag("executor"): "eager",
        names.SHAPE: "2x12x4",
        names.GIT_COMMIT: commit,
        names.GIT_DIRTY: "false",
        names.CODE_HASH: commit * 16,
        names.PLUGINS_HASH: "p" * 64,
        names.TIMING_CONTENTION: "none",
        names.TIMING_NOISE: "low",
        **tags,
    }
    if not labelled:
        del all_tags[names.TIMING_CONTENTION], all_tags[names.TIMING_NOISE]
    if parent:
        all_tags[names.PARENT_RUN_ID] = parent
    run_id = client.create_run(experiment, tags=all_tags).info.run_id
    params = {
        "executor.name": "eager",
        "population.neurons": "2",
        "population.time_steps": "12",
        "population.contacts": "4",
        "optimizer.lr": lr,
        "run.warmup_updates": "5",
        "sweep.repeat": str(repeat),
        "tracking.uri": f"somewhere-{commit}",
        **(params or {}),
    }
    for key, value in params.items():
        client.log_param(run_id, key, value)
    latencies = [value * scale for value in UPDATES]
    if series:
        client.log_batch(run_id, metrics=[Metric(names.UPDATE_SERIES, v, 0, step) for step, v in enumerate(latencies)])
    client.log_metric(run_id, names.UPDATE_MEDIAN, sorted(latencies[5:])[len(latencies[5:]) // 2])
    client.set_terminated(run_id, status)
    return run_id


def _repeats(client: MlflowClient, experiment: str, parent: str, lr: str, scale: float, repeats: int = 2, **kwargs):
    """``repeats`` runs of one config (sweep.repeats), the second 1% slower than the first."""
    for repeat in range(repeats):
        _run(client, experiment, parent, lr, scale * (1 + 0.01 * repeat), repeat=repeat, **kwargs)


def _sweep(client: MlflowClient, experiment: str, scales: dict[str, float], repeats: int = 2, **kwargs) -> str:
    parent = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    for lr, scale in scales.items():
        _repeats(client, experiment, parent, lr, scale, repeats, **kwargs)
    client.set_terminated(parent, "FINISHED")
    return parent


@pytest.fixture
def experiment(client: MlflowClient) -> str:
    return client.create_experiment("axoexp")


def _compare(tracking_uri: str, *args: str) -> int:
    with pytest.raises(SystemExit) as ended:
        main(["--tracking-uri", tracking_uri, *args])
    return int(ended.value.code or 0)


def test_verdicts_of_known_medians_and_a_contended_slowdown_is_no_regression(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _sweep(client, experiment, {"0.1": 1.0, "0.2": 1.0, "0.3": 1.0, "0.4": 1.0, "0.5": 1.0})
    new = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    _repeats(client, experiment, new, "0.1", 1.02, commit="bbbb")  # within 5%: no change
    _repeats(client, experiment, new, "0.2", 0.8, commit="bbbb")  # faster
    _repeats(client, experiment, new, "0.3", 1.5, commit="bbbb", **{names.TIMING_CONTENTION: "cpu"})
    _repeats(client, experiment, new, "0.4", 1.5, commit="bbbb", **{names.TIMING_NOISE: "high"})
    _run(client, experiment, new, "0.5", 1.5, commit="bbbb", status="FAILED")

    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    report = json.loads(capsys.readouterr().out)
    rows = {row["settings"]: row for row in report["rows"]}
    assert {key: row["verdict"] for key, row in rows.items()} == {
        "optimizer.lr=0.1": "no change",
        "optimizer.lr=0.2": "faster",
        "optimizer.lr=0.3": "slower",
        "optimizer.lr=0.4": "slower",
        "optimizer.lr=0.5": "not compared",
    }
    assert rows["optimizer.lr=0.2"]["ratio"] == pytest.approx(0.8)
    assert rows["optimizer.lr=0.2"]["ratio_low"] <= 0.8 <= rows["optimizer.lr=0.2"]["ratio_high"]
    assert rows["optimizer.lr=0.3"]["caution"] == "contended (cpu)" and not rows["optimizer.lr=0.3"]["regression"]
    assert rows["optimizer.lr=0.4"]["caution"] == "noisy" and not rows["optimizer.lr=0.4"]["regression"]
    assert rows["optimizer.lr=0.5"]["caution"] == "new FAILED" and rows["optimizer.lr=0.5"]["ratio_low"] is None
    assert report["base"]["code"][names.GIT_COMMIT] == "aaaa" and report["new"]["code"][names.GIT_COMMIT] == "bbbb"
    pooled = rows["optimizer.lr=0.2"]
    assert len(pooled["base_run_ids"]) == pooled["base_runs"] == 2 and len(set(pooled["new_run_ids"])) == 2
    assert set(pooled["base_run_ids"]) <= set(report["base"]["run_ids"])


def test_a_regression_exits_1_and_is_shown_in_capitals(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _sweep(client, experiment, {"0.1": 1.0, "0.2": 1.0})
    new = _sweep(client, experiment, {"0.1": 1.0, "0.2": 1.2}, commit="bbbb")

    assert _compare(tracking_uri, base, new) == 1
    text = capsys.readouterr().out
    assert "BASE: 4 runs; git.commit aaaa, git.dirty false" in text and "NEW: 4 runs; git.commit bbbb" in text
    slower = next(line for line in text.splitlines() if "optimizer.lr=0.2" in line)
    assert "SLOWER" in slower and " 1.200 " in slower
    assert "no change" in next(line for line in text.splitlines() if "optimizer.lr=0.1" in line)
    # a 25% threshold tolerates it; a threshold is shown as given
    assert _compare(tracking_uri, base, new, "--threshold", "25%", "--format", "markdown") == 0
    assert "| slower |" not in capsys.readouterr().out
    assert _compare(tracking_uri, base, new, "--threshold", "2.5%") == 1
    assert "against 1 ± 2.5%, given" in capsys.readouterr().out


def test_an_interval_too_wide_to_tell_is_unclear_not_no_change(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NEW's two repeats 1.0x and 2.0x BASE's: the interval reaches far above 1.05 but not wholly, so
    neither slower nor no change: unclear, no regression, exit 0."""
    base = _sweep(client, experiment, {"0.1": 1.0})
    new = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    for repeat, scale in enumerate((1.0, 2.0)):
        _run(client, experiment, new, "0.1", scale, commit="bbbb", repeat=repeat)

    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["ratio_low"] < 1.05 < 1.5 < row["ratio_high"]
    assert (row["verdict"], row["regression"], row["caution"]) == ("unclear", False, "")


def test_configs_that_differ_only_in_an_executor_setting_are_compared_apart(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sides = []
    for commit, slower in (("aaaa", 1.0), ("bbbb", 1.5)):  # NEW: executor.buckets=4 1.5x slower, 0 the same
        parent = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
        for buckets, scale in (("0", 1.0), ("4", slower)):
            _repeats(client, experiment, parent, "0.1", scale, commit=commit, params={"executor.buckets": buckets})
        client.set_terminated(parent, "FINISHED")
        sides.append(parent)

    assert _compare(tracking_uri, *sides, "--format", "json") == 1
    rows = {row["settings"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert {settings: (row["verdict"], row["base_runs"], row["new_runs"]) for settings, row in rows.items()} == {
        "executor.buckets=0": ("no change", 2, 2),
        "executor.buckets=4": ("slower", 2, 2),
    }


def test_quiet_repeats_are_compared_with_quiet_ones_and_a_contended_repeat_apart(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three repeats per side, one of them contended: the quiet pairs decide (NEW 4x slower: a
    regression), the contended pair is a row of its own, marked, which never replaces them."""
    contended = {names.TIMING_CONTENTION: "cpu"}
    sides = []
    for commit, scale in (("aaaa", 1.0), ("bbbb", 4.0)):
        parent = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
        _repeats(client, experiment, parent, "0.1", scale, commit=commit)
        _run(client, experiment, parent, "0.1", scale, commit=commit, repeat=2, **contended)
        client.set_terminated(parent, "FINISHED")
        sides.append(parent)

    assert _compare(tracking_uri, *sides, "--format", "json") == 1
    quiet, disturbed = json.loads(capsys.readouterr().out)["rows"]
    assert (quiet["verdict"], quiet["regression"], quiet["caution"]) == ("slower", True, "")
    assert (quiet["base_runs"], quiet["new_runs"]) == (2, 2) and quiet["ratio"] == pytest.approx(4.0, rel=0.02)
    assert (disturbed["base_runs"], disturbed["new_runs"]) == (1, 1) and not disturbed["regression"]
    assert disturbed["caution"].endswith("contended (cpu)")


def test_a_quiet_row_short_of_repeats_says_its_contended_runs_were_set_apart(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """sweep.repeats=2 on a busy machine: one repeat a side contended leaves one quiet run a side."""
    sides = []
    for commit in ("aaaa", "bbbb"):
        parent = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
        _run(client, experiment, parent, "0.1", 1.0, commit=commit)
        _run(client, experiment, parent, "0.1", 1.0, commit=commit, repeat=1, **{names.TIMING_CONTENTION: "cpu"})
        client.set_terminated(parent, "FINISHED")
        sides.append(parent)

    assert _compare(tracking_uri, *sides, "--format", "json") == 0
    quiet, _ = json.loads(capsys.readouterr().out)["rows"]
    assert quiet["caution"] == (
        "one quiet run per side: run-to-run spread unknown; 2 contended runs of it set apart "
        "(--include-contended pools them)"
    )


def test_a_quiet_run_of_base_is_compared_where_new_has_only_contended_runs(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """BASE's two repeats, one contended; NEW's two both contended: BASE's quiet run is compared with
    NEW's contended row (it went unshown), and the contended pair's row names BASE's quiet run as set
    apart instead of asking for the repeats BASE has."""
    contended = {names.TIMING_CONTENTION: "cpu"}
    base = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    quiet = _run(client, experiment, base, "0.1", 1.0, commit="aaaa")
    _run(client, experiment, base, "0.1", 1.0, commit="aaaa", repeat=1, **contended)
    client.set_terminated(base, "FINISHED")
    new = _sweep(client, experiment, {"0.1": 1.0}, commit="bbbb", **contended)

    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    disturbed, lent = json.loads(capsys.readouterr().out)["rows"]
    assert (disturbed["base_runs"], disturbed["new_runs"]) == (1, 2)
    assert disturbed["caution"] == (
        "one contended run on BASE: run-to-run spread unknown; 1 quiet run of it set apart "
        "(--include-contended pools them), contended (cpu)"
    )
    assert lent["base_run_ids"] == [quiet] and lent["new_run_ids"] == disturbed["new_run_ids"]
    assert lent["caution"].endswith("contended (cpu)") and not lent["regression"]


def test_a_failed_run_is_no_timing_of_unknown_load(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NEW's second repeat FAILED before it measured (no timing labels): no row of its own marked
    "load not recorded", and no run "set apart" that --include-contended would pool."""
    base = _sweep(client, experiment, {"0.1": 1.0})
    new = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    _run(client, experiment, new, "0.1", 1.0, commit="bbbb")
    _run(client, experiment, new, "0.1", 1.0, commit="bbbb", repeat=1, status="FAILED", labelled=False, series=False)
    client.set_terminated(new, "FINISHED")

    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["caution"] == "one run on NEW: run-to-run spread unknown; measure with sweep.repeats=2 or more"


def test_contended_runs_in_use_are_not_counted_as_set_apart(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """BASE's two repeats both contended, NEW's one of two: NEW's quiet run is compared with BASE's
    contended row, so only NEW's contended run is set apart (it said 3, counting BASE's in use)."""
    contended = {names.TIMING_CONTENTION: "cpu"}
    base = _sweep(client, experiment, {"0.1": 1.0}, **contended)
    new = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    _run(client, experiment, new, "0.1", 1.0, commit="bbbb")
    _run(client, experiment, new, "0.1", 1.0, commit="bbbb", repeat=1, **contended)
    client.set_terminated(new, "FINISHED")

    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    quiet, disturbed = json.loads(capsys.readouterr().out)["rows"]
    assert (quiet["base_runs"], quiet["new_runs"], quiet["base_run_ids"]) == (2, 1, disturbed["base_run_ids"])
    assert quiet["caution"] == (
        "one quiet run on NEW: run-to-run spread unknown; 1 contended run of it set apart "
        "(--include-contended pools them), contended (cpu)"
    )


def test_runs_of_an_older_store_without_timing_labels_are_marked_and_never_regressions(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """BASE from a store older than timing.contention and timing.noise, NEW 1.5x slower and quiet:
    a timing whose load was never recorded cannot claim to be quiet, so the row is marked, exit 0.
    Within NEW, an unlabelled repeat is set apart from the quiet ones as a contended one is, and
    --include-contended pools it (still marked)."""
    base = _sweep(client, experiment, {"0.1": 1.0, "0.2": 1.0}, labelled=False)
    new = _sweep(client, experiment, {"0.1": 1.5}, commit="bbbb")
    _repeats(client, experiment, new, "0.2", 1.5, commit="bbbb")
    _run(client, experiment, new, "0.2", 1.5, commit="bbbb", repeat=2, labelled=False)

    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(row["settings"], row["verdict"], row["caution"], row["regression"]) for row in rows] == [
        ("optimizer.lr=0.1", "slower", "load not recorded", False),
        ("optimizer.lr=0.2", "slower", "load not recorded", False),
        (
            "optimizer.lr=0.2",
            "no verdict",
            "one contended run on NEW: run-to-run spread unknown; 2 quiet runs of it set apart (--include-contended "
            "pools them), load not recorded",
            False,
        ),
    ]
    assert [(row["base_runs"], row["new_runs"]) for row in rows] == [(2, 2), (2, 2), (2, 1)]
    assert _compare(tracking_uri, base, new, "--format", "json", "--include-contended") == 0
    pooled = json.loads(capsys.readouterr().out)["rows"]
    assert [(row["new_runs"], row["caution"], row["regression"]) for row in pooled] == [
        (2, "load not recorded", False),
        (3, "load not recorded", False),
    ]


GRACE_CPUINFO = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0
"""


def test_the_cpu_model_tells_arm_designs_apart_where_cpuinfo_names_no_model() -> None:
    """x86's ``model name``; on Arm (a Grace host's Neoverse V2 here), which has none, its implementer
    and part, not the bare architecture that every Arm host shares."""
    assert metadata.cpuinfo_model("processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n") == (
        "AMD EPYC 9654 96-Core Processor"
    )
    grace = metadata.cpuinfo_model(GRACE_CPUINFO)
    assert grace == f"{platform.machine()} (CPU implementer 0x41, part 0xd4f)"
    assert grace != metadata.cpuinfo_model(GRACE_CPUINFO.replace("0xd4f", "0xd0c")), "Neoverse N1 apart"
    assert metadata.cpuinfo_model("processor\t: 0\n") is None


H200 = {names.GPU_NAME: "NVIDIA H200", names.CPU_MODEL: "AMD EPYC 9654 96-Core Processor"}
A100 = {**H200, names.GPU_NAME: "NVIDIA A100-SXM4-80GB"}
ANOTHER_H200 = {  # another host's H200: another UUID, device index, driver and torch; the same hardware
    **H200,
    names.HOSTNAME: "node7",
    names.LEASE_DEVICE: "cuda:1 GPU-7f3e",
    names.DEVICE: "cuda:1",
    names.GPU_DRIVER: "570.86",
    names.version_tag("torch"): "2.6.0",
}


def test_rows_timed_on_other_hardware_are_marked_and_never_regressions(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NEW 1.5x slower on every row: only the row on the same GPU and CPU model is a regression, however
    its host, GPU, driver and torch differ; another GPU model, a side pooling two, another CPU model
    (CPU runs), both sides pooling the same two and a CUDA run whose GPU's name is missing (never taken
    for a CPU run: "no GPU") are each marked."""
    amd, intel = {names.CPU_MODEL: H200[names.CPU_MODEL]}, {names.CPU_MODEL: "Intel(R) Xeon(R) Platinum 8480+"}
    unnamed = {names.DEVICE: "cuda:0", **amd}
    repeats = {  # optimizer.lr: the tags of BASE's two repeats, of NEW's two
        "0.1": ((H200, H200), (A100, A100)),
        "0.2": ((H200, H200), (ANOTHER_H200, ANOTHER_H200)),
        "0.3": ((H200, H200), (H200, A100)),
        "0.4": ((amd, amd), (intel, intel)),  # CPU runs
        "0.5": ((H200, A100), (H200, A100)),
        "0.6": ((H200, H200), (unnamed, unnamed)),
    }
    parents = []
    for side, (commit, scale) in enumerate((("aaaa", 1.0), ("bbbb", 1.5))):
        parent = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
        for lr, tags in repeats.items():
            for repeat, hardware in enumerate(tags[side]):
                _run(
                    client,
                    experiment,
                    parent,
                    lr,
                    scale * (1 + 0.01 * repeat),
                    commit=commit,
                    repeat=repeat,
                    **hardware,
                )
        client.set_terminated(parent, "FINISHED")
        parents.append(parent)

    assert _compare(tracking_uri, *parents, "--format", "json") == 1
    report = json.loads(capsys.readouterr().out)
    rows = {row["settings"]: row for row in report["rows"]}
    assert {settings: (row["verdict"], row["regression"], row["caution"]) for settings, row in rows.items()} == {
        "optimizer.lr=0.1": ("slower", False, "other hardware: NVIDIA H200 -> NVIDIA A100-SXM4-80GB"),
        "optimizer.lr=0.2": ("slower", True, ""),
        "optimizer.lr=0.3": ("slower", False, "other hardware: NVIDIA H200 -> NVIDIA A100-SXM4-80GB and NVIDIA H200"),
        "optimizer.lr=0.4": (
            "slower",
            False,
            "other hardware: AMD EPYC 9654 96-Core Processor -> Intel(R) Xeon(R) Platinum 8480+",
        ),
        "optimizer.lr=0.5": ("slower", False, "mixed hardware: NVIDIA A100-SXM4-80GB and NVIDIA H200"),
        "optimizer.lr=0.6": ("slower", False, "other hardware: NVIDIA H200 -> ?"),
    }
    assert rows["optimizer.lr=0.1"]["ratio"] == pytest.approx(1.5, rel=0.02) and rows["optimizer.lr=0.1"]["ratio_low"]
    assert report["new"]["hardware"] == {
        names.GPU_NAME: "?,NVIDIA A100-SXM4-80GB,NVIDIA H200,no GPU",
        names.CPU_MODEL: "AMD EPYC 9654 96-Core Processor,Intel(R) Xeon(R) Platinum 8480+",
    }
    assert report["new"]["environment"] == {names.GPU_DRIVER: "570.86,?", names.version_tag("torch"): "2.6.0,?"}


def test_the_header_says_the_sides_ran_on_different_hardware(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 1.5x slowdown measured on an A100 against an H200: no regression, exit 0, and the header says why."""
    environment = {names.GPU_DRIVER: "550.54", names.version_tag("torch"): "2.5.1"}
    base = _sweep(client, experiment, {"0.1": 1.0}, **H200, **environment)
    new = _sweep(client, experiment, {"0.1": 1.5}, commit="bbbb", **A100, **environment)

    assert _compare(tracking_uri, base, new) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(
        "; gpu.name NVIDIA H200, cpu AMD EPYC 9654 96-Core Processor; gpu.driver 550.54, version.torch 2.5.1"
    )
    assert lines[3] == (
        "BASE and NEW ran on different hardware (gpu.name NVIDIA H200 -> NVIDIA A100-SXM4-80GB): rows on other "
        "or mixed hardware are marked and never counted as regressions"
    )
    assert "slower   other hardware: NVIDIA H200 -> NVIDIA A100-SXM4-80GB" in lines[-1]


def test_repeats_pool_and_latest_2_compares_the_two_newest_sweeps(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    for repeat in (0, 1, 2):
        _run(client, experiment, base, "0.1", 1.0 + 0.1 * repeat, repeat=repeat)
    _sweep(client, experiment, {"0.1": 1.5}, commit="bbbb")

    assert _compare(tracking_uri, "--latest", "2", "--format", "csv") == 1
    header, row = capsys.readouterr().out.splitlines()
    record = dict(zip(header.split(","), row.split(","), strict=True))
    assert record["base_runs"] == "3" and record["new_runs"] == "2" and record["verdict"] == "slower"


def test_a_row_not_compared_for_a_missing_series_names_the_runs_without_it(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run logged without its per-update series (its median only) leaves no interval: the row is not
    compared, and says which run lacks which metric; a row whose series are all there is compared."""
    base = _sweep(client, experiment, {"0.1": 1.0, "0.2": 1.0})
    new = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    _run(client, experiment, new, "0.1", 1.5, commit="bbbb")
    lacking = _run(client, experiment, new, "0.1", 1.5, commit="bbbb", repeat=1, series=False)
    _repeats(client, experiment, new, "0.2", 1.0, commit="bbbb")

    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    missing, compared = json.loads(capsys.readouterr().out)["rows"]
    assert (missing["verdict"], missing["ratio_low"], missing["regression"]) == ("not compared", None, False)
    assert missing["caution"] == f"no per-update series (metric {names.UPDATE_SERIES}) in new run {lacking}"
    assert (compared["verdict"], compared["caution"]) == ("no change", "")
    assert _compare(tracking_uri, base, new) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "optimizer.lr=0.1" in line)
    assert f"not compared  no per-update series (metric {names.UPDATE_SERIES}) in new run {lacking}" in row


def test_one_run_on_a_side_gets_no_verdict_and_says_why(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two single runs of one config, the second 1.8x slower (the run-to-run spread of a shared
    machine): one run per side shows no run-to-run spread, so no verdict, no interval, exit 0."""
    base = _run(client, experiment, None, "0.1", 1.0)
    new = _run(client, experiment, None, "0.1", 1.8)
    assert _compare(tracking_uri, base, new) == 0
    text = capsys.readouterr().out
    assert "\n1 row matched; verdict from " in text, text  # not "1 rows"
    row = next(line for line in text.splitlines() if line.startswith("2x12x4"))
    assert "no verdict" in row and "one run per side: run-to-run spread unknown; measure with sweep.repeats=2" in row
    assert " 1.800 " in row and "[" not in row and row.endswith("1/1")

    repeated = _sweep(client, experiment, {"0.1": 1.8})  # one side repeated: still none, naming the other
    assert _compare(tracking_uri, repeated, base, "--format", "json") == 0
    (record,) = json.loads(capsys.readouterr().out)["rows"]
    assert record["verdict"] == "no verdict" and record["ratio_low"] is None and not record["regression"]
    assert record["caution"] == "one run on NEW: run-to-run spread unknown; measure with sweep.repeats=2 or more"


def test_bad_input_is_one_line_and_exit_2(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _sweep(client, experiment, {"0.1": 1.0})
    other = _run(client, experiment, None, "0.9", 1.0)
    for args, message in (
        ((run, "nosuchrun"), "axoexp.compare: NEW=nosuchrun: no such run in this store"),
        ((run,), "axoexp.compare: runs=" + run + ": give BASE NEW (two run ids) or --latest 2"),
        ((run, run, "--threshold", "lots"), "axoexp.compare: --threshold=lots: not a fraction"),
        ((run, run), f"axoexp.compare: runs={run} {run}: BASE and NEW are one run; give two run ids"),
        (
            (run, other),
            f"axoexp.compare: BASE={run} (a sweep of 2 runs) NEW={other} (a single run: eager 2x12x4): no config "
            "and executor was measured on both sides",
        ),
        ((), "axoexp.compare: nothing to compare: give BASE NEW (two run ids) or --latest 2"),
    ):
        assert _compare(tracking_uri, *args) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and err.count("\n") == 1, err


def test_nothing_matched_names_the_keys_the_closest_configs_differ_in(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two single runs of one shape, the second started from the first's banks, at another commit,
    tracking.uri and sweep.repeat (bookkeeping: never named); runs five keys apart (one a param only
    one logs) name three; sweeps name their closest pair of configs."""
    measured = "no config and executor was measured on both sides; "
    base = _run(client, experiment, None, "0.1", 1.0, params={"population.init_from": "None"})
    new = _run(client, experiment, None, "0.1", 1.0, commit="bbbb", repeat=1, params={"population.init_from": base})
    far = _run(
        client,
        experiment,
        None,
        "0.2",
        1.0,
        params={
            "population.init_from": "None",
            "population.neurons": "3",
            "population.time_steps": "16",
            "seed": "1",
            "gradient_transform.max_norm": "1.0",
        },
    )
    expected = {
        (base, new): f"they differ in population.init_from (None vs {base})",
        (base, far): "they differ in population.neurons (2 vs 3), population.time_steps (12 vs 16), "
        "gradient_transform.max_norm (not logged vs 1.0) and 2 more keys",
    }
    for (before, after), differ in expected.items():
        assert _compare(tracking_uri, before, after) == 2
        err = capsys.readouterr().err
        assert err.endswith(f"(a single run: eager 2x12x4): {measured}{differ}\n") and err.count("\n") == 1, err

    sweeps = (
        _sweep(client, experiment, {"0.1": 1.0, "0.2": 1.0}),
        _sweep(client, experiment, {"0.1": 1.0, "0.3": 1.0}, commit="bbbb", params={"population.neurons": "3"}),
    )
    assert _compare(tracking_uri, *sweeps) == 2
    assert capsys.readouterr().err.endswith(
        f"(a sweep of 4 runs): {measured}the closest configs differ in population.neurons (2 vs 3)\n"
    )


def test_rows_whose_sides_share_runs_a_resumed_sweep_reused_are_not_compared(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """NEW resumed BASE: it reused both repeats of optimizer.lr=0.1 and one of 0.2 (its parent's tags
    axoexp.reused.jobN) and measured the rest anew. A row whose sides share runs is not compared (it
    showed 1.000, no change: a run against itself), has no ratio and says so; 0.3 is compared."""
    base = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id
    runs = {
        (lr, repeat): _run(client, experiment, base, lr, 1.0, repeat=repeat)
        for lr in ("0.1", "0.2", "0.3")
        for repeat in (0, 1)
    }
    reused = (runs["0.1", 0], runs["0.1", 1], runs["0.2", 0])
    tags = {f"{names.REUSED_PREFIX}job{job}": run_id for job, run_id in enumerate(reused)}
    new = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent", **tags}).info.run_id
    _run(client, experiment, new, "0.2", 1.0, commit="bbbb", repeat=1)
    _repeats(client, experiment, new, "0.3", 1.0, commit="bbbb")

    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    rows = {row["settings"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert {settings: (row["verdict"], row["caution"], row["ratio"]) for settings, row in rows.items()} == {
        "optimizer.lr=0.1": ("not compared", "the same 2 runs on both sides", None),
        "optimizer.lr=0.2": ("not compared", "the same run on both sides", None),
        "optimizer.lr=0.3": ("no change", "", pytest.approx(1.0, rel=0.02)),
    }
    assert rows["optimizer.lr=0.1"]["ratio_low"] is None and not rows["optimizer.lr=0.1"]["regression"]
    assert _compare(tracking_uri, base, new) == 0
    reused_row = next(line for line in capsys.readouterr().out.splitlines() if "optimizer.lr=0.1" in line)
    assert "not compared  the same 2 runs on both sides" in reused_row and "1.000" not in reused_row


def test_configs_on_one_side_only_are_counted(
    client: MlflowClient, experiment: str, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """BASE swept optimizer.lr=0.1,0.2,0.3, NEW 0.1,0.4: one row matched, and the line says what was
    left out of it, as do markdown's and JSON's."""
    base = _sweep(client, experiment, {"0.1": 1.0, "0.2": 1.0, "0.3": 1.0})
    new = _sweep(client, experiment, {"0.1": 1.0, "0.4": 1.0}, commit="bbbb")
    fewer = _sweep(client, experiment, {"0.1": 1.0}, commit="cccc")

    assert _compare(tracking_uri, base, new) == 0
    assert "\n1 row matched; 2 configs only in BASE, 1 only in NEW; verdict from the 95% interval" in (
        capsys.readouterr().out
    )
    assert _compare(tracking_uri, fewer, new, "--format", "markdown") == 0
    assert "\n- 1 row matched; 1 config only in NEW; verdict from" in capsys.readouterr().out
    assert _compare(tracking_uri, base, new, "--format", "json") == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["base"]["unmatched_configs"], report["new"]["unmatched_configs"], len(report["rows"])) == (2, 1, 1)


@pytest.mark.slow
def test_a_reader_that_stops_early_leaves_the_verdict_as_the_exit_status(
    client: MlflowClient, experiment: str, tracking_uri: str
) -> None:
    """``compare ... | head -0``: the reader closes the pipe, which is no fault of the comparison; the
    exit status is still the verdict's (1 on a regression, 0 without), nothing on stderr. Both run at once."""
    base = _sweep(client, experiment, {"0.1": 1.0})
    news = {_sweep(client, experiment, {"0.1": scale}, commit="bbbb"): status for scale, status in ((1.5, 1), (1.0, 0))}
    with gone_reader() as write:  # the reader is gone before anything is written
        started = {
            new: subprocess.Popen(
                [sys.executable, "-m", "axoexp.compare", "--tracking-uri", tracking_uri, base, new, "--format", "json"],
                cwd=REPO,
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
            )
            for new in news
        }
        ended = {new: (process.communicate(timeout=300)[1], process.returncode) for new, process in started.items()}
    assert ended == {new: ("", status) for new, status in news.items()}


def test_decide_md_states_the_noise_threshold_the_code_uses() -> None:
    text = (REPO / "docs" / "decide.md").read_text()
    assert f"IQR / median above {NOISE_THRESHOLD}," in text and f"fewer than {MIN_RUNS} FINISHED runs" in text


def test_verdict_needs_the_whole_interval_beyond_the_threshold() -> None:
    assert verdict(1.06, 1.2, 0.05) == "slower"
    assert verdict(0.8, 0.94, 0.05) == "faster"
    assert verdict(0.95, 1.05, 0.05) == verdict(0.99, 1.02, 0.05) == "no change", "within 1 ± threshold"
    assert verdict(1.04, 1.2, 0.05) == verdict(0.9, 1.02, 0.05) == verdict(0.5, 2.0, 0.05) == "unclear"
    assert verdict(None, None, 0.05) == "not compared"
    assert too_few_runs(2, 3) == "" and too_few_runs(1, 1).startswith("one run per side")
    assert parse_threshold("5%") == pytest.approx(0.05) == parse_threshold("0.05")
    with pytest.raises(ComparisonError, match="--threshold=120%"):
        parse_threshold("120%")


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_real_single_runs_give_no_verdict_and_repeated_ones_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two single runs of one config, then two sweeps of it with sweep.repeats=2, each pair measured
    side by side (identical code: whatever the machine's load, a verdict is only given with repeats).
    ``--include-contended`` pools every repeat, so a repeat that a loaded machine disturbed still
    counts (without it, it would form a row of its own, apart from its quiet twin)."""
    short = ("run.warmup_updates=2", "run.measured_updates=20", "run.progress=false")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for commands in ([short, short], [("-m", *short, "sweep.repeats=2", "sweep.resume=false")] * 2):
        for result in run_clis([(command, tmp_path, None) for command in commands]):
            assert result.returncode == 0, result.stderr
        assert _compare(uri, "--latest", "2", "--format", "json", "--include-contended") in (0, 1)
        (row,) = json.loads(capsys.readouterr().out)["rows"]
        if commands[0] == short:
            assert (row["verdict"], row["ratio_low"], row["regression"]) == ("no verdict", None, False)
            assert row["caution"].startswith("one run per side: run-to-run spread unknown")
        else:
            assert (row["base_runs"], row["new_runs"]) == (2, 2) and row["ratio_low"] <= row["ratio_high"]
            assert row["verdict"] in ("slower", "faster", "no change", "unclear")


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_real_runs_apart_name_what_differs_and_a_resumed_sweep_shares_its_runs(
    tmp_path: Path, client: MlflowClient, tracking_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's commands: a run and one started from its banks (population.init_from) match
    nothing and the line names the key; a sweep's rerun reuses every job (sweep.resume_contended=true,
    however loaded the machine), so each row holds the same runs on both sides: none is compared
    (--include-contended: a repeat the machine's load disturbed is no row of its own)."""
    short = ("loss=causal_mse", "run.warmup_updates=2", "run.measured_updates=20", "run.progress=false")
    sweep = ("-m", *short, "population.neurons=3,4", "sweep.repeats=2", "sweep.resume_contended=true")
    for result in run_clis([(short, tmp_path, None), (sweep, tmp_path, None)]):
        assert result.returncode == 0, result.stderr
    experiment = [client.get_experiment_by_name("axoexp").experiment_id]
    (single,) = client.search_runs(experiment, f"tags.`{names.SHAPE}` = '3x12x4' and params.`sweep.repeats` = '1'")
    first = single.info.run_id
    for result in run_clis([((*short, f"population.init_from={first}"), tmp_path, None), (sweep, tmp_path, None)]):
        assert result.returncode == 0, result.stderr
    parents = client.search_runs(experiment, f"tags.`{names.SWEEP_ROLE}` = 'parent'", order_by=["start_time ASC"])
    ids = (parent.info.run_id for parent in parents)
    assert _compare(tracking_uri, *ids, "--format", "json", "--include-contended") == 0  # a busy machine's too
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(row["verdict"], row["caution"].split(",")[0], row["ratio"]) for row in rows] == [
        ("not compared", "the same 2 runs on both sides", None)
    ] * 2
    (started,) = client.search_runs(experiment, f"params.`population.init_from` = '{first}'")
    assert _compare(tracking_uri, first, started.info.run_id) == 2
    assert capsys.readouterr().err.endswith(f"they differ in population.init_from (None vs {first})\n")
