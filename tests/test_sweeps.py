"""Sweeps: parent and child MLflow runs, failures, resume, launchers and the report."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import helpers
import pytest
from helpers import free_port, run_cli, run_clis, sleepy_executor_plugin, start_mlflow
from mlflow.tracking import MlflowClient
from test_faults import start_cli

from axoexp import names, signals
from axoexp.experiment import run_experiment
from axoexp.journal import read_journal_lines
from axoexp.sweep import MlflowSweepCallback
from axoexp.tracking import experiment_id

pytestmark = pytest.mark.slow  # every test here starts processes

SLOW_EXECUTOR = sleepy_executor_plugin(5)


FAILING_EXECUTOR = '''
from axoexp import component
from axoexp.executors.eager import EagerExecutor

@component("executor", "flaky")
class Flaky(EagerExecutor):
    """Fails on its second update: a run that starts, measures a little, then fails."""
    calls = 0

    def step(self, inputs, targets):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("flaky executor failed on purpose")
        return super().step(inputs, targets)
'''


REFUSED_WHERE_IT_RUNS = """
import os
from axoexp import component
from axoexp.components.population import lite

_PLANNING = os.getpid()  # the sweep's process, which plans every job; each job runs in a process of its own


@component("population", "node_only")
def node_only(*, device, dtype, seed, neurons: int = 3):
    \"\"\"lite, refused where the job runs (as a cluster's node judges what it has), not while planning.\"\"\"
    return lite(device=device, dtype=dtype, seed=seed, neurons=neurons)


node_only.config_problems = lambda params, config: [] if os.getpid() == _PLANNING else ["this node lacks it"]
"""


def _runs(uri: str) -> tuple[MlflowClient, list]:
    client = MlflowClient(tracking_uri=uri)
    return client, client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])


def _split(runs: list) -> tuple[list, list]:
    parents = [run for run in runs if run.data.tags.get(names.SWEEP_ROLE) == "parent"]
    return parents, [run for run in runs if run not in parents]


SWEEPS = {  # sweeps in the default launcher (one job at a time) that share nothing: a name, its plugin, its overrides
    "failing": (
        ("flaky.py", FAILING_EXECUTOR),
        ("executor=eager,flaky", "population.neurons=0,2", "run.measured_updates=3"),
    ),
    "refused where it runs": (
        ("node_only.py", REFUSED_WHERE_IT_RUNS),
        ("population=node_only", "population.neurons=2,3", "run.measured_updates=3"),
    ),
    "report": (
        ("sleepy.py", SLOW_EXECUTOR),
        ("executor=eager,sleepy", "population.neurons=2,3", "run.measured_updates=5"),
    ),
}


@pytest.fixture(scope="module")
def sweeps(
    tmp_path_factory: pytest.TempPathFactory, empty_store: Path
) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """What each of ``SWEEPS`` printed and its folder (a copy of the empty store, its plugin): the
    two run side by side."""
    folders = {name: tmp_path_factory.mktemp("sweep") for name in SWEEPS}
    calls = []
    for name, ((file, plugin), overrides) in SWEEPS.items():
        shutil.copyfile(empty_store, folders[name] / "mlflow.db")
        (folders[name] / "plugins").mkdir()
        (folders[name] / "plugins" / file).write_text(plugin)
        calls.append((("-m", *overrides), folders[name], None))
    return {name: (result, folders[name]) for name, result in zip(SWEEPS, run_clis(calls), strict=True)}


def test_jobs_refused_only_where_they_run_are_named_with_why_as_the_sweep_ends(sweeps) -> None:
    """Jobs planning accepted but refused as they ran (a SLURM node judges the CUDA, CPUs and memory it
    has) were counted at the end, their reasons only in the parent's tags; each is a line now, and the
    first one's error is not said again, without its job, after them."""
    result, _ = sweeps["refused where it runs"]
    assert result.returncode == 1
    refusal = "invalid experiment config: this node lacks it"
    assert result.stderr.strip().splitlines()[-3:] == [
        f"axoexp: refused job 0 (population=node_only population.neurons=2 run.measured_updates=3): {refusal}",
        f"axoexp: refused job 1 (population=node_only population.neurons=3 run.measured_updates=3): {refusal}",
        "axoexp: the sweep ended FAILED: 2 jobs were refused before creating a run (tags axoexp.refused.*)",
    ]


def test_failing_job_fails_the_parent_but_keeps_the_others(sweeps) -> None:
    result, folder = sweeps["failing"]
    assert result.returncode == 1, "a sweep in which a job failed exits 1"
    lines = result.stderr.splitlines()
    bare = "axoexp: invalid experiment config: population.neurons=0: must be at least 1"
    assert bare not in lines, "the first refusal again, without its job, after the last job's lines"
    notice = "axoexp: 2 of 4 jobs cannot run and will create no run; the others run, and the sweep will end FAILED:"
    assert notice in lines, "said before the jobs run"
    for job, executor in ((0, "eager"), (2, "flaky")):  # every refused job is listed, not only the first
        line = (
            f"axoexp: refused job {job} (executor={executor} population.neurons=0 run.measured_updates=3): "
            "invalid experiment config: population.neurons=0: must be at least 1"
        )
        assert lines.count(line) == 2 and lines.index(line) > lines.index(notice), "listed up front and at the end"
    measuring = [line.split(": ")[0] for line in result.stdout.splitlines() if line.startswith("measuring ")]
    assert measuring == [
        f"measuring executor={executor} population.neurons=2 run.measured_updates=3" for executor in ("eager", "flaky")
    ], "a refused job says only why it was refused"
    _, runs = _runs(f"sqlite:///{folder / 'mlflow.db'}")
    (parent,), children = _split(runs)
    assert parent.info.status == "FAILED"
    assert parent.data.tags[names.FAILURE] == (
        "1 of 4 jobs did not finish (03 flaky 2x12x4 neurons=2 measured_updates=3); "
        "2 jobs were refused before creating a run (tags axoexp.refused.*)"
    )
    assert lines[-2].startswith("axoexp: 03 flaky 2x12x4 neurons=2 measured_updates=3: FAILED: ")
    assert lines[-1] == f"axoexp: the sweep ended FAILED: {parent.data.tags[names.FAILURE]}"
    assert "Error executing job" not in result.stderr, "Hydra's line for the first failed job: the lines above say it"
    refused = sorted(value for key, value in parent.data.tags.items() if key.startswith(names.REFUSED_PREFIX))
    assert [value.split(":")[0] for value in refused] == [
        "executor=eager population.neurons=0 run.measured_updates=3",
        "executor=flaky population.neurons=0 run.measured_updates=3",
    ]
    remeasured = sorted(key for key in parent.data.tags if key.startswith(names.REMEASURED_PREFIX))
    assert remeasured == [f"{names.REMEASURED_PREFIX}job{job}" for job in (1, 3)], "a refused job was not measured"
    assert "measured 2 new jobs (no earlier run to reuse; " in result.stdout
    statuses = {child.info.run_name: child.info.status for child in children}
    assert statuses == {
        "01 eager 2x12x4 neurons=2 measured_updates=3": "FINISHED",
        "03 flaky 2x12x4 neurons=2 measured_updates=3": "FAILED",
    }


@pytest.mark.parametrize(
    ("child_status", "refused", "reason"),
    [
        ("FINISHED", True, "1 job was refused before creating a run (tags axoexp.refused.*)"),
        (
            "FAILED",
            True,
            "1 of 1 child runs did not finish (child); 1 job was refused before creating a run (tags axoexp.refused.*)",
        ),
        ("FINISHED", False, "a job failed or the sweep was interrupted"),  # a job that failed before its run
    ],
)
def test_a_sweeps_reason_names_only_what_went_wrong(
    client: MlflowClient, tracking_uri: str, tmp_path: Path, child_status: str, refused: bool, reason: str
) -> None:
    """A sweep whose faults are a refused job, or a job that failed before it made a run, says that,
    never also "0 of 1 child runs did not finish"."""
    experiment = experiment_id(client, "axoexp")
    tags = {names.SWEEP_ROLE: "parent"}
    if refused:
        tags[f"{names.REFUSED_PREFIX}job0"] = "population.neurons=0: ..."
    parent = client.create_run(experiment, tags=tags)
    child = client.create_run(experiment, run_name="child", tags={names.PARENT_RUN_ID: parent.info.run_id})
    client.set_terminated(child.info.run_id, child_status)
    sweep = MlflowSweepCallback()
    sweep.client, sweep.parent_run_id, sweep.parent_created = client, parent.info.run_id, parent
    sweep.uri, sweep.sweep_dir, sweep.experiment = tracking_uri, str(tmp_path), "axoexp"
    sweep.end_parent(all_jobs_returned=refused)
    ended = client.get_run(parent.info.run_id)
    assert (ended.info.status, ended.data.tags[names.FAILURE]) == ("FAILED", reason)


def test_a_stopped_sweeps_reason_counts_the_jobs_that_never_started(
    client: MlflowClient, tracking_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during the first of three jobs: ``1 of 3 jobs did not finish (...), 2 never started``,
    where it once read "1 of 1 child runs did not finish", as if the sweep had one job."""
    experiment = experiment_id(client, "axoexp")
    parent = client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"})
    tags = {names.PARENT_RUN_ID: parent.info.run_id}
    child = client.create_run(experiment, run_name="00 eager 3x12x4 neurons=3", tags=tags)
    client.set_terminated(child.info.run_id, "KILLED")
    monkeypatch.setattr(signals, "_received", ["SIGINT"])
    sweep = MlflowSweepCallback()
    sweep.client, sweep.parent_run_id, sweep.parent_created = client, parent.info.run_id, parent
    sweep.uri, sweep.sweep_dir, sweep.experiment, sweep.jobs = tracking_uri, str(tmp_path), "axoexp", 3
    sweep.end_parent(all_jobs_returned=False)
    ended = client.get_run(parent.info.run_id)
    assert (ended.info.status, ended.data.tags[names.FAILURE]) == (
        "KILLED",
        "interrupted by SIGINT; 1 of 3 jobs did not finish (00 eager 3x12x4 neurons=3), 2 never started",
    )


@pytest.mark.usefixtures("migrated_store")
def test_a_sweep_is_a_parent_run_with_named_children_and_a_rerun_reuses_them_unless_told_not_to(
    tmp_path: Path,
) -> None:
    assert run_cli("population.neurons=2", "run.measured_updates=3", cwd=tmp_path).returncode == 0
    # resume_contended: this test is about reuse, and on a busy machine every run is contended
    sweep = ("-m", "population.neurons=2,3", "run.measured_updates=3", "sweep.resume_contended=true")
    first = run_cli(*sweep, cwd=tmp_path)
    assert first.returncode == 0 and "reused" not in first.stdout, "a single run is not a sweep's job"
    _, runs = _runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,), others = _split(runs)
    children = [run for run in others if run.data.tags.get(names.PARENT_RUN_ID) == parent.info.run_id]
    assert len(children) == 2 and len(others) == 3, "both jobs are the parent's children; the single run is not"
    assert parent.info.status == "FINISHED"
    assert re.fullmatch(r"sweep \d\d-\d\d \d\d:\d\d:\d\d neurons=2,3 measured_updates=3", parent.info.run_name)
    assert parent.data.tags[names.SWEEP_OVERRIDES] == " ".join(sweep[1:])
    assert sorted(child.info.run_name for child in children) == [
        "00 eager 2x12x4 neurons=2 measured_updates=3",
        "01 eager 3x12x4 neurons=3 measured_updates=3",
    ], "short, in sweep order"
    assert {run.data.tags[names.SOURCE_NAME] for run in runs} == {"python -m axoexp"}
    sweep_dir = Path(parent.data.tags[names.SWEEP_DIR])
    assert (sweep_dir / "mlflow_parent_run_id").read_text().strip() == parent.info.run_id
    assert all((sweep_dir / str(n) / "result.json").is_file() for n in (0, 1))

    again = run_cli(*sweep, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("reused population.neurons=") == 2
    client, runs = _runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parents, children = _split(runs)
    assert len(parents) == 2 and len(children) == 3, "the second sweep created no new job runs"
    first_parent, second = sorted(parents, key=lambda run: run.info.start_time)
    assert re.search(
        rf"^reused 2 of 2 jobs from '{re.escape(first_parent.info.run_name)}' "
        rf"\({first_parent.info.run_id}\) \(sweep.resume=false re-measures\)$",
        again.stdout,
        re.M,
    )
    reused = {key: value for key, value in second.data.tags.items() if key.startswith(names.REUSED_PREFIX)}
    assert sorted(reused.values()) == sorted(
        child.info.run_id for child in children if child.data.tags.get(names.PARENT_RUN_ID) == first_parent.info.run_id
    )

    forced = run_cli(*sweep, "sweep.resume=false", cwd=tmp_path)
    assert forced.returncode == 0 and "reused" not in forced.stdout
    assert len(_split(_runs(f"sqlite:///{tmp_path / 'mlflow.db'}")[1])[1]) == 5


@pytest.mark.usefixtures("migrated_store")
def test_joblib_launcher_runs_each_job_in_its_own_process(tmp_path: Path) -> None:
    result = run_cli(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "population.neurons=2,3",
        "run.measured_updates=3",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    _, runs = _runs(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (parent,), children = _split(runs)
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert {child.data.tags[names.PARENT_RUN_ID] for child in children} == {parent.info.run_id}
    launcher_pid = parent.data.tags[names.PROCESS_PID]
    assert all(child.data.tags[names.PROCESS_PID] != launcher_pid for child in children)


def test_each_jobs_process_phases_count_from_the_end_of_the_job_before(sweeps) -> None:
    """Jobs run in forked processes: a job's ``process_*`` phases start where the previous job ended,
    not where the sweep began (they once took in every earlier job, each job's more than the last)."""
    _, folder = sweeps["report"]
    _, runs = _runs(f"sqlite:///{folder / 'mlflow.db'}")
    _, children = _split(runs)
    children = sorted(children, key=lambda run: run.info.run_name)  # "01 ...", "02 ...": the jobs in order
    assert len(children) == 4
    for earlier, later in itertools.pairwise(children):
        since_earlier_ended_ms = later.info.end_time - earlier.info.end_time
        assert later.data.metrics[names.PROCESS_TOTAL] <= since_earlier_ended_ms + 100, (earlier, later)


def test_report_tabulates_a_sweep_next_to_its_outputs_and_logs_it_to_the_parent(sweeps) -> None:
    sweep, folder = sweeps["report"]
    assert sweep.returncode == 0, sweep.stderr
    report = subprocess.run(
        # every run a row with a speedup whatever the machine's load (contended runs would stand apart)
        [sys.executable, "-m", "axoexp.report", "--format", "json", "--include-contended"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    assert sorted((row["shape"], row["executor"], row["status"]) for row in rows) == [
        ("2x12x4", "eager", "FINISHED"),
        ("2x12x4", "sleepy", "FINISHED"),
        ("3x12x4", "eager", "FINISHED"),
        ("3x12x4", "sleepy", "FINISHED"),
    ]
    assert all(row["speedup_vs_eager"] == 1.0 for row in rows if row["executor"] == "eager")
    assert {json.dumps(row["settings"]) for row in rows} == {'{"neurons": "2"}', '{"neurons": "3"}'}
    client, runs = _runs(f"sqlite:///{folder / 'mlflow.db'}")
    (parent,), _ = _split(runs)
    sweep_dir = Path(parent.data.tags[names.SWEEP_DIR])
    assert (sweep_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((sweep_dir / "report.json").read_text()) == rows
    assert sorted(a.path for a in client.list_artifacts(parent.info.run_id)) == ["report.json", "report.png"]
    assert not list(folder.glob("*.png")), "nothing lands in the current directory"


def test_report_without_a_sweep_says_so_in_one_line(tmp_path: Path, make_config) -> None:
    """In a folder without a store and in one whose store holds a single run: the two reports run
    side by side."""
    missing, work = tmp_path / "missing", tmp_path / "work"  # not tmp_path: make_config's own store is there
    for folder in (missing, work):
        folder.mkdir()
    single = make_config(f"tracking.uri=sqlite:///{work / 'mlflow.db'}", "run.measured_updates=1")
    run_experiment(single, output_dir=work / "single")  # a store with one run, made in this process
    reported = [helpers.start_cli(cwd=folder, module="axoexp.report") for folder in (missing, work)]
    (_, missing_err), (_, no_sweep_err) = (process.communicate(timeout=120) for process in reported)
    assert reported[0].returncode == 2
    assert missing_err.strip() == (
        "axoexp.report: no MLflow store: sqlite:///mlflow.db does not exist; run a sweep first: python -m axoexp -m ..."
    )
    assert not (missing / "mlflow.db").exists(), "the report creates no store"
    assert reported[1].returncode == 2
    assert no_sweep_err.strip().splitlines()[-1] == (
        "axoexp.report: no sweep in experiment 'axoexp'; run one with python -m axoexp -m ..."
    )


def test_a_sweep_logs_to_an_http_tracking_server_and_a_dead_one_fails_fast_keeping_results_locally(
    tmp_path: Path, empty_store: Path
) -> None:
    """A sweep against a real ``mlflow server`` on 127.0.0.1 (its own sqlite store, a copy of the
    empty one) and a run against a port nothing listens on: the run starts first and goes on while
    the server starts and the sweep runs, each in a folder of its own."""
    (tmp_path / "dead").mkdir()
    dead_port, port = free_port(), free_port()
    while port == dead_port:
        port = free_port()
    dead = f"http://127.0.0.1:{dead_port}"
    start = time.monotonic()
    unreachable = start_cli(f"tracking.uri={dead}", "run.measured_updates=3", cwd=tmp_path / "dead")
    (tmp_path / "server").mkdir()
    shutil.copyfile(empty_store, tmp_path / "server" / "mlflow.db")
    server = start_mlflow("server", tmp_path / "server", port)
    live = f"http://127.0.0.1:{port}"
    try:
        (tmp_path / "sweep").mkdir()
        result = run_cli(
            "-m", "population.neurons=2,3", "run.measured_updates=3", f"tracking.uri={live}", cwd=tmp_path / "sweep"
        )
        assert result.returncode == 0, result.stderr
        client, runs = _runs(live)
        (parent,), children = _split(runs)
        assert parent.info.status == "FINISHED" and len(children) == 2
        child = children[0]
        assert child.data.metrics[names.update_metric("count")] == 3
        assert {a.path for a in client.list_artifacts(child.info.run_id)} == {
            ".hydra",
            "banks.safetensors",
            "config.yaml",
            "result.json",
        }
        assert {a.path for a in client.list_artifacts(child.info.run_id, ".hydra")} == {
            ".hydra/config.yaml",
            ".hydra/hydra.yaml",
            ".hydra/overrides.yaml",
        }
        assert len(child.inputs.dataset_inputs) == 1, "the workload, as a dataset input"
        assert not (tmp_path / "sweep" / "mlflow.db").exists()
        _, stderr = unreachable.communicate(timeout=300)
        elapsed = time.monotonic() - start  # an upper bound: it may have ended while the sweep ran
    finally:
        server.terminate()
        server.wait(timeout=30)
        if unreachable.poll() is None:
            unreachable.kill()
            unreachable.communicate()
    assert unreachable.returncode == 1
    assert elapsed < 150, f"took {elapsed:.0f} s: retries are not bounded (MLflow's default takes ~4 minutes)"
    assert f"axoexp: MLflow tracking at {dead} is unreachable" in stderr
    (result_file,) = (tmp_path / "dead" / "outputs").glob("*/*/result.json")
    assert f"python -m axoexp.sync {result_file.parent}" in stderr
    assert (result_file.parent / "config.yaml").is_file() and os.path.getsize(result_file) > 0
    records = read_journal_lines(result_file.parent / "journal.jsonl").records  # checksummed lines
    summary = [r["metrics"] for r in records if r["kind"] == "metrics" and names.update_metric("count") in r["metrics"]]
    assert summary[0][names.update_metric("count")] == 3.0 and records[-1]["status"] == "FINISHED"


COMPOSED_FIRST = "Hydra starts a sweep's jobs only once it has composed every job's config, and it cannot compose"
REFUSED_SWEEPS = {  # sweeps refused before any run: their overrides and the one line each prints
    "every_job_refused": (
        ("population.neurons=0,-1",),
        "axoexp: no job of the sweep can run, so it created no run: "
        "job 0 (population.neurons=0): invalid experiment config: population.neurons=0: must be at least 1; "
        "job 1 (population.neurons=-1): invalid experiment config: population.neurons=-1: must be at least 1",
    ),
    "every_job_misspelled": (  # a job's composition error reads as a single run's does
        ("optimizer.lrr=0.1,0.2",),
        f"axoexp: no job of the sweep can run, so it created no run: {COMPOSED_FIRST} "
        "job 0 (optimizer.lrr=0.1): optimizer.lrr: no such key in optimizer=adam (did you mean lr?); its keys: "
        "capturable, lr, beta1, beta2, eps, weight_decay; "
        "job 1 (optimizer.lrr=0.2): optimizer.lrr: no such key in optimizer=adam (did you mean lr?); its keys: "
        "capturable, lr, beta1, beta2, eps, weight_decay",
    ),
    "one_bad_value": (  # Hydra's sweeper would fail the batch at job 1 and run not even job 0
        ("optimizer.lr=0.1,abc", "run.measured_updates=3"),
        f"axoexp: no job of the sweep can run, so it created no run: {COMPOSED_FIRST} "
        "job 1 (optimizer.lr=abc run.measured_updates=3): optimizer.lr=abc: Value 'abc' of type 'str' could not be "
        "converted to Float",
    ),
    "one_unknown_option": (  # job 2 (loss=mse population.neurons=0), which planning would refuse, is not named
        ("loss=foo,mse", "population.neurons=0,2"),
        f"axoexp: no job of the sweep can run, so it created no run: {COMPOSED_FIRST} "
        "job 0 (loss=foo population.neurons=0): loss=foo: no such option; valid loss options: causal_mse, huber, mse; "
        "job 1 (loss=foo population.neurons=2): loss=foo: no such option; valid loss options: causal_mse, huber, mse",
    ),
    "a_bad_value_every_job_shares": (  # Hydra composes the sweep's base config first: exit 2, as a single run
        ("optimizer.lr=abc", "population.neurons=2,3"),
        "axoexp: optimizer.lr=abc: Value 'abc' of type 'str' could not be converted to Float",
    ),
    "slurm_without_slurm": (
        ("hydra/launcher=slurm", "population.neurons=2,3"),
        "axoexp: hydra/launcher=slurm needs SLURM, but 'srun' is not on PATH here; start the sweep on a "
        "machine that has it, or use hydra/launcher=parallel or the default launcher",
    ),
    "parallel_without_workers": (
        ("hydra/launcher=parallel", "hydra.launcher.n_jobs=0", "population.neurons=2,3"),
        "axoexp: hydra.launcher.n_jobs=0: must be at least 1 (the worker processes of the sweep)",
    ),
    "joblib_without_workers": (  # joblib's own ValueError once the parent run existed
        ("hydra/launcher=joblib", "hydra.launcher.n_jobs=0", "population.neurons=2,3"),
        "axoexp: hydra.launcher.n_jobs=0: joblib runs no job on 0 workers; choose 1 or more, or -1 for one per CPU "
        "(-2 for all but one, and so on)",
    ),
    "ray_without_an_instance_at_its_address": (  # Ray's own connection retried for minutes in silence
        ("hydra/launcher=ray_devices", "hydra.launcher.ray.init.address=127.0.0.1:1", "population.neurons=2,3"),
        "axoexp: hydra.launcher.ray.init.address=127.0.0.1:1: no Ray instance answers there (Connection refused); "
        "start one there (ray start --head --port=PORT) or drop hydra.launcher.ray.init.address to start a local one",
    ),
}


def test_a_sweep_that_cannot_run_creates_no_run_and_says_why_in_one_line(tmp_path: Path, empty_store: Path) -> None:
    """Every job refused (a value out of range, a misspelled key), a job Hydra cannot compose (a bad
    value, an unknown option) among others it can, the SLURM preset without SLURM, the parallel
    launcher without workers: the sweeps side by side, each in a folder of its own with a store."""
    cases = {
        name: case
        for name, case in REFUSED_SWEEPS.items()
        if not (name == "slurm_without_slurm" and shutil.which("srun") is not None)  # SLURM is installed here
        and not (name.startswith("ray_") and importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None)
    }
    started = {}
    for name, (overrides, _) in cases.items():
        (tmp_path / name).mkdir()
        shutil.copyfile(empty_store, tmp_path / name / "mlflow.db")
        started[name] = start_cli("-m", *overrides, cwd=tmp_path / name)
    outcomes, expected = {}, {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / name / 'mlflow.db'}")
        runs = client.search_runs([experiment.experiment_id for experiment in client.search_experiments()])
        outcomes[name] = {
            "exit": process.returncode,
            "stdout": stdout,
            "stderr": stderr,
            "runs": len(runs),  # no empty FAILED parent, no job's run
            "outputs": (tmp_path / name / "outputs").exists(),  # no job started
        }
        expected[name] = {"exit": 2, "stdout": "", "stderr": cases[name][1] + "\n", "runs": 0, "outputs": False}
    assert outcomes == expected
