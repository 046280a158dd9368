"""Fault injection: signals, kill -9, a server killed mid-run, a full disk, NaN, concurrent
fresh stores, a malicious pickle. Each asserts that nothing measured is lost and that the
final state in MLflow is truthful."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import helpers
import pytest
import torch
from helpers import REPO, TRACEBACK, fill, free_port, run_cli, sleepy_executor_plugin, start_mlflow
from mlflow.tracking import MlflowClient

from axoexp import lease, metadata, names, processes
from axoexp.errors import CheckpointError, ConfigError, NonFiniteResultError
from axoexp.experiment import run_experiment
from axoexp.journal import JOURNAL_FILE, NO_RUN_YET, journaled_run, read_journal
from axoexp.plan import plan_experiment
from axoexp.statistics import noise_spread, noise_verdict, rel_iqr
from axoexp.sync import main as sync_main
from axoexp.sync import sync_journal
from axoexp.tracking import Tracker
from axoexp.windows import MEASURED, UpdateTrace, log_traces

SLEEPY = sleepy_executor_plugin(20)
LOSS_PLUGIN = """from axoexp import component


@component("loss", "unrelated")
def unrelated():
    return lambda prediction, target: (prediction - target).abs().mean()
"""
LONG_RUN = ("executor=sleepy", "run.warmup_updates=2", "run.measured_updates=100000")
LENGTH_SLEEPY = """import time

from axoexp import component
from axoexp.executors.eager import EagerExecutor


@component("executor", "length_sleepy")
class LengthSleepy(EagerExecutor):
    \"\"\"Eager plus 0.5 ms of sleep per time step: updates of different lengths take clearly different times.\"\"\"

    update_includes = EagerExecutor.update_includes + ("sleep_per_step",)

    def step(self, inputs, targets):
        time.sleep(inputs.shape[-2] / 2000)
        return super().step(inputs, targets)
"""
TWO_LENGTHS = ("population.lengths=[16,64]", "population.batches=4")  # batches of 64, 16, 16 and 64 steps


def own_leases(folder: Path) -> dict[str, str]:
    """A lease folder of the run's own: runs of other tests side by side do not wait for its CPU lease."""
    return {lease.LEASE_DIR_ENV: str(folder / "leases")}


# --- helpers --------------------------------------------------------------------------------


def start_cli(
    *args: str, cwd: Path, module: str = "axoexp", env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """:func:`helpers.start_cli` in ``cwd`` with the ``sleepy`` executor among its plugins."""
    (cwd / "plugins").mkdir(exist_ok=True)
    (cwd / "plugins" / "sleepy.py").write_text(SLEEPY)
    return helpers.start_cli(*args, cwd=cwd, module=module, env=env)


def sync(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "axoexp.sync", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def journals(root: Path) -> list[Path]:
    return sorted(root.rglob(JOURNAL_FILE))


def updates_in(journal: Path) -> list[dict]:
    return [record for record in read_journal(journal) if record["kind"] == "update"]


def wait_for_updates(
    root: Path, count: int, process: subprocess.Popen[str], jobs: int = 1, timeout: float = 240
) -> list[Path]:
    """Wait until ``jobs`` journals under ``root`` each hold ``count`` measured updates."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = journals(root)
        if len(found) >= jobs and all(len(updates_in(path)) >= count for path in found):
            return found
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    pytest.fail(f"no {count} updates in {jobs} journals within {timeout} s")


def only_run(uri: str):
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    assert len(runs) == 1, [run.info.run_name for run in runs]
    return client, runs[0]


def assert_everything_measured_is_in(client: MlflowClient, run, journal: Path) -> None:
    updates = updates_in(journal)
    history = client.get_metric_history(run.info.run_id, names.UPDATE_SERIES)
    assert sorted(metric.step for metric in history) == [update["index"] for update in updates]
    assert {metric.step: metric.value for metric in history} == {u["index"]: u["ms"] for u in updates}
    measured = [u for u in updates if u["window"] == "measured"]
    assert run.data.metrics[names.MEASURED_COMPLETED] == len(measured)


# --- signals and kill -9 ----------------------------------------------------------------------


@pytest.mark.slow
def test_stop_signals_end_the_run_killed_with_what_was_measured(tmp_path: Path, empty_store: Path) -> None:
    """SIGTERM and SIGHUP, each to a run of its own; the two runs measure side by side, each with
    a lease folder of its own (else the second waits for the CPU lease the first holds)."""
    started = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        directory = tmp_path / signal.Signals(signum).name
        directory.mkdir()
        shutil.copyfile(empty_store, directory / "mlflow.db")
        leases = {lease.LEASE_DIR_ENV: str(directory / "leases")}
        started[signum] = directory, start_cli(*LONG_RUN, cwd=directory, env=leases)
    try:
        for signum, (directory, process) in started.items():
            (journal,) = wait_for_updates(directory / "outputs", 20, process)
            process.send_signal(signum)
            start = time.monotonic()
            _, stderr = process.communicate(timeout=60)
            assert time.monotonic() - start < 15, "a stop signal must end the run well within SLURM's 30 s grace"
            name = signal.Signals(signum).name
            assert process.returncode == 128 + signum
            assert f"axoexp: interrupted by {name}" in stderr
            client, run = only_run(f"sqlite:///{directory / 'mlflow.db'}")
            assert run.info.status == "KILLED" and run.data.tags[names.FAILURE] == f"interrupted by {name}"
            assert names.PARTIAL in run.data.tags
            assert_everything_measured_is_in(client, run, journal)
            assert "already complete" in sync(str(directory / "outputs"), cwd=directory).stdout
    finally:
        for _, process in started.values():
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=60)


def test_a_process_forked_during_a_run_dies_of_sigterm_rather_than_acting_for_the_run() -> None:
    """Inductor's compile workers are forked from the run's process (by the compiler start-up's
    thread), and SLURM signals every process of a job: a forked child must die of SIGTERM,
    not raise the run's Interrupted."""
    from axoexp.signals import interruptible

    statuses: list[int] = []

    def fork_and_signal_the_child() -> None:
        pid = os.fork()
        if pid == 0:  # the child: exit 3 if the run's handler raised here
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            finally:
                os._exit(3)
        statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))

    with interruptible():
        fork_and_signal_the_child()  # from the main thread
        thread = threading.Thread(target=fork_and_signal_the_child)  # and from another, as the start-up forks
        thread.start()
        thread.join(timeout=30)
        assert signal.getsignal(signal.SIGTERM).__module__ == "axoexp.signals"  # the run keeps its own
    assert statuses == [-signal.SIGTERM, -signal.SIGTERM]


DEFERRED_STOP = """
import os, signal
from axoexp.signals import Interrupted, deferred, interruptible
seen = []
try:
    with interruptible(), deferred():
        with deferred():  # nested: the stop waits for the outermost block
            os.kill(os.getpid(), signal.SIGTERM)
            seen.append("inner block went on")
        seen.append("outer block went on")
    seen.append("not reached")
except Interrupted as stopped:
    seen.append(f"then {stopped}")
print(seen)
"""


def test_a_stop_signal_inside_a_deferred_block_acts_as_the_block_ends() -> None:
    """What run_updates records together (the trace MLflow logs from, and the journal) is recorded
    whole: a SIGTERM between the two once left MLflow one update ahead of the journal (CI, 2026-12-04).
    In a process of its own: a signal leaves its mark on the process (the signal noted, HTTP timeouts cut)."""
    done = subprocess.run(
        [sys.executable, "-c", DEFERRED_STOP], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )
    assert done.stdout.strip() == str(["inner block went on", "outer block went on", "then interrupted by SIGTERM"])


@pytest.mark.slow
def test_a_stop_signal_during_the_last_upload_waits_for_it(tmp_path: Path, migrated_store: Path) -> None:
    """The run holds its params, tags and metrics for one upload as it ends; a SIGTERM while that
    upload waited for the store (here a sqlite lock that another process holds) once broke it off,
    leaving the run RUNNING and empty in MLflow under a line saying what was measured is logged.
    The signal now acts once the upload is done: the run, which had finished measuring, ends FINISHED."""
    process = start_cli(
        "executor=sleepy", "run.warmup_updates=2", "run.measured_updates=60", cwd=tmp_path, env=own_leases(tmp_path)
    )
    (journal,) = wait_for_updates(tmp_path / "outputs", 5, process)
    store = sqlite3.connect(migrated_store, isolation_level=None)
    try:
        store.execute("BEGIN EXCLUSIVE")  # the run's last upload waits for it (MLflow's busy timeout: 20 s)
        deadline = time.monotonic() + 120
        while read_journal(journal)[-1]["kind"] != "end":
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
    finally:
        store.close()  # the lock goes with it
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.splitlines() == [
        "axoexp: interrupted by SIGTERM; it came after the run had finished measuring: "
        "the run ended FINISHED in MLflow with all it measured"
    ]
    client, run = only_run(f"sqlite:///{migrated_store}")
    assert run.info.status == "FINISHED" and names.FAILURE not in run.data.tags
    assert run.data.params["run.measured_updates"] == "60"
    assert_everything_measured_is_in(client, run, journal)


@pytest.mark.slow
def test_ctrl_c_while_the_store_opens_says_no_run_was_created(tmp_path: Path, migrated_store: Path) -> None:
    """Ctrl-C while the run waits for its store (here for the lock file that serializes store creation,
    which this test holds) once said 'what was measured is logged' though no run and no measurement existed."""
    with open(migrated_store.with_name("mlflow.db.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        process = start_cli("run.measured_updates=5", "hydra.run.dir=run", cwd=tmp_path, env=own_leases(tmp_path))
        deadline = time.monotonic() + 120
        while not (tmp_path / "run" / JOURNAL_FILE).exists():  # created just before the run waits for its store
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.1)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGINT, stderr
    assert stderr.splitlines()[-1] == f"axoexp: interrupted by SIGINT; {NO_RUN_YET}" and "Traceback" not in stderr
    client = MlflowClient(tracking_uri=f"sqlite:///{migrated_store}")
    assert not client.search_runs([experiment.experiment_id for experiment in client.search_experiments()])


@pytest.mark.slow
def test_kill_9_then_sync_completes_the_run_from_its_journal(killed_runs) -> None:
    _, journal, folder = killed_runs[30]  # conftest.py: killed -9 after 30 updates
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client, run = only_run(uri)
    assert run.info.status == "RUNNING" and not client.get_metric_history(run.info.run_id, names.UPDATE_SERIES)

    synced = sync(str(folder / "outputs"), cwd=folder)
    assert synced.returncode == 0, synced.stderr
    assert f"synced to run {run.info.run_id} (KILLED" in synced.stdout
    client, run = only_run(uri)
    assert run.info.status == "KILLED" and "ended without ending its run" in run.data.tags[names.FAILURE]
    assert_everything_measured_is_in(client, run, journal)
    assert run.info.end_time == read_journal(journal)[-1]["time"]

    again = sync(str(folder / "outputs"), cwd=folder)
    assert f"already synced to run {run.info.run_id}" in again.stdout
    assert_everything_measured_is_in(client, only_run(uri)[1], journal)  # nothing logged twice


@pytest.mark.slow
def test_sync_ends_running_runs_whose_process_is_gone(killed_runs) -> None:
    pid, journal, folder = killed_runs[5]
    journal.unlink()  # a run without its journal is still ended, with the reason
    synced = sync(cwd=folder)
    assert synced.returncode == 0 and "its process is gone; ended KILLED" in synced.stdout
    _, run = only_run(f"sqlite:///{folder / 'mlflow.db'}")
    assert run.info.status == "KILLED"
    assert f"process {pid} on " in run.data.tags[names.FAILURE]


@pytest.mark.slow
def test_kill_9_then_sync_judges_the_noise_within_length_buckets(tmp_path: Path, make_config) -> None:
    """A run of 16- and 64-step batches (8 and 32 ms of sleep) killed -9 mid-measurement: sync judges
    its noise within the length buckets its journal's updates name, as the run would have, not across
    all updates (IQR / median about 1: noise high, for updates that only differ in length)."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "length_sleepy.py").write_text(LENGTH_SLEEPY)
    process = start_cli(
        "executor=length_sleepy",
        *TWO_LENGTHS,
        "run.warmup_updates=2",
        "run.measured_updates=100000",
        cwd=tmp_path,
        env=own_leases(tmp_path),
    )
    try:
        (journal,) = wait_for_updates(tmp_path / "outputs", 40, process)
    finally:
        process.kill()
        process.communicate(timeout=60)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert only_run(uri)[1].info.status == "RUNNING"
    synced = sync(str(tmp_path / "outputs"), cwd=tmp_path)
    assert synced.returncode == 0 and "(KILLED" in synced.stdout, synced.stdout + synced.stderr
    client, run = only_run(uri)
    assert_everything_measured_is_in(client, run, journal)
    measured = [update for update in updates_in(journal) if update["window"] == MEASURED]
    latencies = [update["ms"] for update in measured]
    spread = run.data.metrics[names.NOISE_SPREAD]
    assert spread != pytest.approx(rel_iqr(latencies)), "judged across all updates, as if of one length"
    batches = plan_experiment(make_config(*TWO_LENGTHS)).build_population().batches
    lengths = [int(batches[update["index"] % len(batches)][0].shape[-2]) for update in measured]
    assert set(lengths) == {16, 64} and [update.get("bucket") for update in measured] == lengths  # eager's buckets
    assert spread == pytest.approx(noise_spread(latencies, lengths))
    assert run.data.tags[names.TIMING_NOISE] == noise_verdict(spread)


@pytest.mark.parametrize("buckets", [[16, 16, 64, 64, 16, 64, 16, 64], None], ids=["buckets", "none"])
def test_sync_judges_noise_within_the_buckets_the_update_records_name(
    tmp_path: Path, tracking_uri: str, client: MlflowClient, buckets: list[int] | None
) -> None:
    """Updates journaled with their length buckets are judged within them when replayed; records that name
    none (a run of one length, or an older journal's) across all updates, as before."""
    latencies = [8.0, 8.2, 32.0, 32.5, 8.1, 31.8, 8.3, 32.2]  # 16 and 64 steps
    with pytest.raises(RuntimeError), journaled_run(tracking_uri, "axoexp", None, {}, output_dir=tmp_path) as log:
        log.window_started(MEASURED, len(latencies))
        for index, latency in enumerate(latencies):
            log.update_finished(MEASURED, index, latency, 0.5, None if buckets is None else buckets[index])
        raise RuntimeError("the run failed before it logged its updates")
    assert "(FAILED, 8 updates: 0 warm-up, 8 measured)" in sync_journal(client, tmp_path / JOURNAL_FILE)
    run = client.get_run(log.run_id)
    spread = noise_spread(latencies, buckets)
    assert run.data.metrics[names.NOISE_SPREAD] == pytest.approx(spread)
    assert run.data.tags[names.TIMING_NOISE] == noise_verdict(spread) == ("low" if buckets else "high")


def test_a_trace_whose_buckets_do_not_match_its_updates_is_judged_across_all_of_them(client: MlflowClient) -> None:
    """Update records of which only some name a bucket (a journal written by two versions): the noise is
    judged as of one length, not a polyfit of mismatched lists raising where the run is logged."""
    run = client.create_run(client.create_experiment("mixed records"))
    latencies = [8.0, 8.2, 32.0, 32.5, 8.1]
    measured = UpdateTrace(latencies_ms=latencies, losses=[0.5] * len(latencies), buckets=[16, 16, 64])
    spread = log_traces(Tracker(client, run.info.run_id), UpdateTrace(), measured, len(latencies))
    assert spread == pytest.approx(rel_iqr(latencies))
    assert client.get_run(run.info.run_id).data.metrics[names.NOISE_SPREAD] == pytest.approx(spread)


@pytest.mark.slow
def test_stopping_a_parallel_sweep_ends_every_run_and_leaves_no_workers(tmp_path: Path, empty_store: Path) -> None:
    """Hydra's joblib launcher and axoexp's pool: a sweep through each, the two side by side, each
    with a lease folder of its own; one CPU per job, so both jobs of a sweep measure at once."""
    started = {}
    for launcher in ("joblib", "parallel"):
        directory = tmp_path / launcher
        directory.mkdir()
        shutil.copyfile(empty_store, directory / "mlflow.db")
        process = start_cli(
            "-m",
            f"hydra/launcher={launcher}",
            "hydra.launcher.n_jobs=2",
            "population.neurons=2,3",
            "run.lease_cpus=1",
            *LONG_RUN,
            cwd=directory,
            env={lease.LEASE_DIR_ENV: str(directory / "leases")},
        )
        started[launcher] = directory, process
    found, workers, stderr = {}, {}, {}
    try:
        for launcher, (directory, process) in started.items():
            found[launcher] = wait_for_updates(directory / "outputs", 10, process, jobs=2)
            workers[launcher] = processes.descendants(process.pid)
    finally:
        for _, process in started.values():
            process.send_signal(signal.SIGTERM)
        for launcher, (_, process) in started.items():
            stderr[launcher] = process.communicate(timeout=60)[1]
    time.sleep(1)
    for launcher, (directory, process) in started.items():
        assert process.returncode == 128 + signal.SIGTERM, launcher
        assert "axoexp: SIGTERM: stopping 2 workers, waiting up to 10 s" in stderr[launcher], stderr[launcher]
        assert not [
            pid
            for pid in workers[launcher]
            if processes.alive(pid) and "resource_tracker" not in processes.command_line(pid)
        ], f"{launcher}: worker processes were left behind"
        client = MlflowClient(f"sqlite:///{directory / 'mlflow.db'}")
        runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
        parent = next(run for run in runs if run.data.tags.get(names.SWEEP_ROLE) == "parent")
        children = [run for run in runs if run is not parent]
        assert parent.info.status == "KILLED" and parent.data.tags[names.FAILURE].startswith("interrupted by SIGTERM")
        assert len(children) == 2 and {child.info.status for child in children} == {"KILLED"}, launcher
        for child in children:
            (journal,) = [path for path in found[launcher] if path.parent == Path(child.data.tags[names.OUTPUT_DIR])]
            assert_everything_measured_is_in(client, child, journal)


# --- the tracking server dies -----------------------------------------------------------------


def _kill_server(server: subprocess.Popen[bytes]) -> None:
    os.killpg(server.pid, signal.SIGKILL)  # its own session: the server and its workers
    server.wait(timeout=30)


@pytest.fixture(scope="module")
def hung_server_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], tuple[str, float, Path]]]:
    """A short run against a server that accepts connections and never answers, started when the
    first test that asks for it starts (it mostly waits, so the killed server's test runs beside
    it); a function that waits for it: what it printed on stderr, the seconds it took, its folder."""
    folder = tmp_path_factory.mktemp("hung")
    ended: list[tuple[str, float]] = []  # what it printed on stderr, the seconds it took
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        start = time.monotonic()
        process = start_cli(
            f"tracking.uri=http://127.0.0.1:{hung.getsockname()[1]}",
            "tracking.http_timeout_s=2",
            "tracking.http_max_retries=1",
            "run.measured_updates=3",
            cwd=folder,
        )

        def collect() -> None:  # the only reader of its pipes; notes when it ended
            stderr = process.communicate(timeout=300)[1]
            ended.append((stderr, time.monotonic() - start))

        collector = threading.Thread(target=collect)
        collector.start()

        def finished() -> tuple[str, float, Path]:
            collector.join(timeout=300)
            ((stderr, elapsed),) = ended
            assert process.returncode == 1, stderr
            return stderr, elapsed, folder

        try:
            yield finished
        finally:
            if process.poll() is None:
                process.kill()
            collector.join(timeout=60)


@pytest.mark.slow
@pytest.mark.usefixtures("hung_server_run")  # it runs beside this test
def test_server_killed_mid_run_switches_to_the_journal_then_sync(tmp_path: Path, empty_store: Path) -> None:
    """A run and a sweep of one job measure side by side until the server is killed: each goes on in
    its journal and names the sync. The sweep cannot read its runs as it ends, so it keeps FAILED,
    saying so, in its folder; once the server is back, one sync completes every run and ends the
    parent so, not KILLED (its process ended by itself)."""
    (tmp_path / "server").mkdir()
    shutil.copyfile(empty_store, tmp_path / "server" / "mlflow.db")  # the server need not create its store
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_mlflow("server", tmp_path / "server", port, own_session=True)
    overrides = (
        "executor=sleepy",
        "run.warmup_updates=2",
        "run.measured_updates=300",
        f"tracking.uri={uri}",
        "tracking.http_timeout_s=2",
        "tracking.http_max_retries=0",
    )
    sweep_dir = tmp_path / "sweep" / "sweep"
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "sweep").mkdir()
        process = start_cli(*overrides, cwd=tmp_path / "run", env=own_leases(tmp_path / "run"))
        sweep = start_cli(  # a lease folder each: neither waits for the other's CPU lease
            "-m", *overrides, f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path / "sweep", env=own_leases(tmp_path / "sweep")
        )
        wait_for_updates(tmp_path / "run" / "outputs", 20, process)
        wait_for_updates(sweep_dir, 20, sweep)
        _kill_server(server)
        printed, stderr = process.communicate(timeout=300)
        assert process.returncode == 1, stderr
        (journal,) = journals(tmp_path / "run" / "outputs")
        assert f"axoexp: MLflow tracking at {uri} is unreachable" in stderr
        assert f"python -m axoexp.sync {journal.parent}" in stderr
        assert len(updates_in(journal)) == 302 and read_journal(journal)[-1]["status"] == "FINISHED"
        _, stderr = sweep.communicate(timeout=300)
        assert sweep.returncode == 1 and TRACEBACK not in stderr, stderr
        assert stderr.splitlines()[-1].startswith(
            f"axoexp: the sweep could not end its MLflow runs: MLflow tracking at {uri} is unreachable"
        ), stderr
        assert stderr.splitlines()[-1].endswith(
            "; it ended FAILED: its runs could not be read as it ended, so whether they finished is not known; a "
            f"job failed or the sweep was interrupted (kept in {sweep_dir / JOURNAL_FILE} for the sync); once the "
            f"store is back, end them with: python -m axoexp.sync {sweep_dir} --tracking-uri {uri}"
        ), stderr

        server = start_mlflow("server", tmp_path / "server", port, own_session=True)
        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
        assert [run.info.status for run in runs] == ["RUNNING"] * 3, "the server died before the runs could end"
        synced = sync(str(tmp_path / "run" / "outputs"), str(sweep_dir), "--tracking-uri", uri, cwd=tmp_path)
        assert synced.returncode == 0, synced.stderr
        roles = {run.data.tags.get(names.SWEEP_ROLE, names.PARENT_RUN_ID in run.data.tags): run for run in runs}
        assert set(roles) == {"parent", True, False}, "the sweep's parent, its child and the single run"
        run = roles[False]
        summary = f"mlflow run    {run.info.run_id}  not ended: {uri} could not be written ("  # its id, not "none"
        assert summary in printed and f"population.init_from={run.info.run_id}, once synced, starts" in printed, printed
        said = f"synced to run {run.info.run_id} (FINISHED, 302 updates: 2 warm-up, 300 measured)"
        assert said in synced.stdout, synced.stdout + synced.stderr
        run = client.get_run(run.info.run_id)
        assert run.info.status == "FINISHED" and run.data.metrics[names.update_metric("count")] == 300
        assert_everything_measured_is_in(client, run, journal)
        assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
            ".hydra",
            "banks.safetensors",
            "config.yaml",
            "result.json",
        }
        parent, child = (client.get_run(roles[role].info.run_id) for role in ("parent", True))
        assert child.info.status == "FINISHED" and parent.info.status == "FAILED", parent.data.tags
        reason = parent.data.tags[names.FAILURE]
        assert reason.startswith(
            "its runs could not be read as it ended, so whether they finished is not known; a job failed or the "
            f"sweep was interrupted; the store failed as the sweep ended (MLflow tracking at {uri} is unreachable"
        ), reason
        assert parent.data.tags[names.SYNCED].startswith(f"from {sweep_dir / JOURNAL_FILE} at ")
    finally:
        _kill_server(server)


@pytest.mark.slow
def test_a_sweep_against_a_dead_server_names_every_journal_to_sync(tmp_path: Path, empty_store: Path) -> None:
    """Both jobs of a sweep whose server is down measure into their journals; the sweep's last line
    names its folder, which holds both, and the one sync that uploads them all (it once named only
    the first failed job's folder, the one whose error Hydra raised). That sync loses nothing."""
    uri = f"http://127.0.0.1:{free_port()}/"
    sweep_dir = tmp_path / "sweep"
    result = run_cli(
        "-m",
        "population.neurons=3,4",
        "run.measured_updates=5",
        f"tracking.uri={uri}",
        "tracking.http_max_retries=0",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert result.returncode == 1 and TRACEBACK not in result.stderr, result.stderr
    (last,) = [line for line in result.stderr.splitlines() if line.startswith("axoexp: ")]
    assert last.startswith(f"axoexp: MLflow tracking at {uri} is unreachable ("), last
    assert last.endswith(
        f"; the results of 2 of 2 jobs are only in their journals under {sweep_dir}; "
        f"upload them all with: python -m axoexp.sync {sweep_dir} --tracking-uri {uri}"
    ), last
    found = journals(sweep_dir)
    assert [journal.parent.name for journal in found] == ["0", "1"]
    shutil.copyfile(empty_store, tmp_path / "up.db")
    store = f"sqlite:///{tmp_path / 'up.db'}"
    synced = sync(str(sweep_dir), "--tracking-uri", store, cwd=tmp_path)
    assert synced.returncode == 0, synced.stderr
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    assert sorted((run.info.status, run.data.metrics[names.update_metric("count")]) for run in runs) == [
        ("FINISHED", 5),
        ("FINISHED", 5),
    ]


@pytest.mark.slow
def test_a_hung_server_is_given_up_on_within_the_configured_timeouts(hung_server_run) -> None:
    stderr, elapsed, folder = hung_server_run()
    assert "is unreachable" in stderr
    assert elapsed < 40, f"gave up after {elapsed:.0f} s"
    (journal,) = journals(folder / "outputs")
    assert len(updates_in(journal)) == 8


@pytest.mark.slow
def test_a_run_against_a_dead_server_says_where_it_is_kept_and_prints_its_summary(tmp_path: Path) -> None:
    """A run whose server refuses connections logged "MLflow run journal-... at URI" (no such run exists),
    printed no summary of what it measured, and ended in a line cut mid-token at 300 characters of
    urllib3's repr; it says the run is kept in its journal only, prints the summary, and names the
    refused connection whole, without urllib3's warning of each retry. The port is held, bound but
    not listening: every connection is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{held.getsockname()[1]}"
        done = run_cli(
            f"tracking.uri={uri}",
            "tracking.http_max_retries=1",  # urllib3 waits before a second retry, not before the first
            "run.measured_updates=5",
            cwd=tmp_path,
            env=own_leases(tmp_path),
        )
    (journal,) = journals(tmp_path / "outputs")
    assert done.returncode == 1 and TRACEBACK not in done.stderr, done.stderr
    refused = f"{uri} is unreachable (Connection refused)"
    assert f"is kept in its journal {journal} only: MLflow tracking at {refused}\n" in done.stdout
    assert "MLflow run journal-" not in done.stdout + done.stderr
    assert "Retrying" not in done.stdout + done.stderr
    assert "median of 5" in done.stdout
    assert f"mlflow run    none: {uri} could not be written (Connection refused); its journal has it all\n" in (
        done.stdout
    )
    assert "population.init_from=RUN_ID, once synced, starts from them" in done.stdout
    assert done.stderr.splitlines()[-1] == (
        f"axoexp: MLflow tracking at {refused}; the run's results are in {journal}; "
        f"upload them with: python -m axoexp.sync {journal.parent} --tracking-uri {uri}"
    )


# --- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def small_filesystem(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB filesystem (tmpfs), where mounting is permitted."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    if (
        shutil.which("mount") is None
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], capture_output=True
        ).returncode
    ):
        pytest.skip(
            "mounting a size-limited tmpfs is not permitted here "
            "(test_journal_on_a_full_disk covers the full-disk path with /dev/full)"
        )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


@pytest.mark.slow
def test_a_store_on_a_full_disk_loses_nothing(tmp_path: Path, small_filesystem: Path) -> None:
    uri = f"sqlite:///{small_filesystem / 'mlflow.db'}"
    process = start_cli(
        "run.warmup_updates=0",
        "run.measured_updates=3000",  # seconds of eager updates
        f"tracking.uri={uri}",
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
    (journal,) = wait_for_updates(tmp_path / "run", 1, process, timeout=120)
    filler = fill(small_filesystem)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1 and f"python -m axoexp.sync {journal.parent}" in stderr, stderr
    assert "Traceback" not in stderr and f"axoexp: MLflow tracking at {uri} is on a full disk (" in stderr, stderr
    assert len(updates_in(journal)) == 3000
    full = sync(str(journal), "--tracking-uri", uri, cwd=tmp_path)
    assert full.returncode == 1 and "Traceback" not in full.stderr, full.stderr
    assert f"MLflow tracking at {uri} is on a full disk: " in full.stderr
    filler.unlink()
    synced = sync(str(journal), "--tracking-uri", uri, cwd=tmp_path)
    assert "(FINISHED, 3000 updates: 0 warm-up, 3000 measured)" in synced.stdout, synced.stdout + synced.stderr
    client, run = only_run(uri)
    assert run.info.status == "FINISHED"
    assert_everything_measured_is_in(client, run, journal)


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_journal_on_a_full_disk_keeps_the_run_in_mlflow(tmp_path: Path) -> None:
    """The output directory's disk is full: every write there fails with ENOSPC (/dev/full)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in (JOURNAL_FILE, "result.json", "config.yaml"):
        (run_dir / name).symlink_to("/dev/full")
    result = run_cli("run.measured_updates=50", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    client, run = only_run(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert run.info.status == "FINISHED" and run.data.metrics[names.update_metric("count")] == 50
    assert "No space left on device" in run.data.tags[names.JOURNAL_LOST]
    assert len(client.get_metric_history(run.info.run_id, names.UPDATE_SERIES)) == 55
    (said,) = [line for line in result.stdout.splitlines() if line.startswith("outputs ")]
    assert "not all kept (" in said and "No space left on device" in said and names.JOURNAL_LOST in said


# --- wrong results --------------------------------------------------------------------------------


@pytest.mark.parametrize("lr", ["1e12", "1e30"])
def test_a_non_finite_loss_ends_the_run_failed_naming_the_update(make_config, client, tmp_path: Path, lr: str) -> None:
    with pytest.raises(NonFiniteResultError, match=r"update \d+ \((warmup|measured)\) produced a non-finite"):
        run_experiment(make_config(f"optimizer.lr={lr}", "verify.enabled=true"), output_dir=tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    assert run.info.status == "FAILED" and "NonFiniteResultError" in run.data.tags[names.FAILURE]
    bad = int(run.data.tags[names.NON_FINITE_UPDATE].split()[0])
    losses = client.get_metric_history(run.info.run_id, names.LOSS_SERIES)
    assert len(losses) == bad + 1, "every update up to the bad one is kept"
    assert len(updates_in(tmp_path / JOURNAL_FILE)) == bad + 1


def test_float16_is_refused_while_planning_with_the_reason(make_config) -> None:
    with pytest.raises(ConfigError, match="dtype=float16 is refused: .* use bfloat16"):
        plan_experiment(make_config("dtype=float16"))


def test_a_shape_that_cannot_fit_is_refused_before_allocating(make_config) -> None:
    with pytest.raises(ConfigError, match=r"population lite needs about \d+\.\d GiB"):
        plan_experiment(make_config("population.neurons=1000000000"))


def test_an_unwritable_store_is_refused_at_once(make_config, tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(ConfigError, match="directory .*absent does not exist"):
        plan_experiment(make_config(f"tracking.uri=sqlite:///{tmp_path / 'absent' / 'mlflow.db'}"))
    assert time.monotonic() - start < 5


# --- resume ---------------------------------------------------------------------------------------


def test_the_result_key_covers_config_code_the_used_plugins_and_device(tmp_path: Path) -> None:
    from axoexp import plugins
    from axoexp.registry import BUILTIN, Component

    config = {"seed": 0, "population": {"neurons": 3}}
    cpu = torch.device("cpu")
    builtin = [Component("loss", "mse", lambda: None, BUILTIN)]
    key = metadata.result_key(cpu, config, builtin)
    assert metadata.result_key(cpu, {**config, "tracking": {"uri": "elsewhere"}}, builtin) == key
    assert metadata.result_key(cpu, {**config, "seed": 1}, builtin) != key
    plugin = tmp_path / "plugin.py"
    plugin.write_text("LOSS_SCALE = 1\n")
    plugins._plugin_files.append(plugin)
    try:
        assert metadata.result_key(cpu, config, builtin) == key, "a loaded plugin file the run does not use"
        used = [*builtin, Component("loss", "scaled", lambda: None, str(plugin))]
        with_plugin = metadata.result_key(cpu, config, used)
        assert metadata.code_state(used)[names.CODE_FILES].endswith(
            f" {plugin}={metadata._file_digests([plugin])[-12:]}"
        )
        plugin.write_text("LOSS_SCALE = 1000\n")
        assert len({key, with_plugin, metadata.result_key(cpu, config, used)}) == 3
        assert metadata.result_key(cpu, config, builtin) == key
        assert set(metadata.code_state(used)) == set(metadata.CODE_STATE_TAGS), "the key takes all of the code state"
        run_tags = metadata.collect(cpu, used)  # a run reads its code state once, for its tags and its key
        assert metadata.result_key(cpu, config, used, collected=run_tags) == metadata.result_key(cpu, config, used)
    finally:
        plugins._plugin_files.remove(plugin)


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_resume_does_not_reuse_a_run_whose_plugin_code_changed(tmp_path: Path) -> None:
    sweep = ("-m", "executor=sleepy", "population.neurons=2,3", "run.measured_updates=2", "sweep.resume_contended=true")
    first = start_cli(*sweep, cwd=tmp_path)
    assert first.wait(timeout=300) == 0
    same = run_cli(*sweep, cwd=tmp_path)
    assert same.stdout.count(": FINISHED as MLflow run") == 2, same.stdout  # both jobs reused
    (tmp_path / "plugins" / "unrelated.py").write_text(LOSS_PLUGIN)  # a plugin no job uses
    unrelated = run_cli(*sweep, cwd=tmp_path)
    assert unrelated.stdout.count(": FINISHED as MLflow run") == 2, unrelated.stdout  # still reused
    plugin = tmp_path / "plugins" / "sleepy.py"
    plugin.write_text(plugin.read_text().replace("0.02", "0.03"))
    changed = run_cli(*sweep, cwd=tmp_path)
    assert changed.returncode == 0 and "FINISHED as MLflow run" not in changed.stdout
    assert changed.stdout.count(f": code changed: {plugin} since the earlier run ") == 2, changed.stdout
    assert "re-measured 2 jobs: 2 code changed (each job's line says which run or file)" in changed.stdout


# --- concurrency ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_concurrent_starts_on_a_fresh_store(tmp_path: Path) -> None:
    started = [start_cli("run.measured_updates=2", cwd=tmp_path) for _ in range(2)]
    started += [start_cli("-m", "population.neurons=2", "run.measured_updates=2", cwd=tmp_path) for _ in range(2)]
    for process in started:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    parents = [run for run in runs if run.data.tags.get(names.SWEEP_ROLE) == "parent"]
    assert len(parents) == 2 and {run.info.status for run in runs} == {"FINISHED"}
    assert len({parent.data.tags[names.SWEEP_DIR] for parent in parents}) == 2, "each sweep has its own directory"
    assert len(runs) >= 4  # 2 single runs, 2 parents, and the one sweep job (the other may reuse it)


# --- a malicious checkpoint --------------------------------------------------------------------------


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused_unless_pinned(registry, tmp_path: Path) -> None:
    marker, evil = tmp_path / "code-ran", tmp_path / "evil.pt"
    torch.save({"model_kind": "adaptive-support-p4-surrogate", "config": _RunsCode(marker), "state_dict": {}}, evil)
    lite = registry.get("population", "lite")
    with pytest.raises(
        CheckpointError,
        match=r"evil.pt' is not a weights-only checkpoint: loading it would run "
        r"code .* pin it: population.checkpoint_sha256=[0-9a-f]{64}",
    ):
        lite.build({"checkpoint": str(evil)}, device=torch.device("cpu"), dtype=torch.float32, seed=0)
    assert not marker.exists(), "the pickle's code ran"
    plain = tmp_path / "plain.pt"
    torch.save({"config": 1}, plain)
    with pytest.raises(CheckpointError, match="is not an axosim checkpoint"):
        lite.build({"checkpoint": str(plain)}, device=torch.device("cpu"), dtype=torch.float32, seed=0)


def test_sync_names_a_path_that_does_not_exist_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sync_main([str(tmp_path / "nope"), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 2
    assert capsys.readouterr().err == f"axoexp.sync: no such journal or directory: {tmp_path / 'nope'}\n"
    assert not (tmp_path / "mlflow.db").exists(), "nothing created"


def test_sync_without_a_journal_or_a_store_creates_nothing_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plain sync in an empty folder printed only MLflow's "Creating initial MLflow database tables",
    and left mlflow.db and its lock file: with no journal to upload and no store whose runs to end,
    it creates nothing and says so in one line, exit 0; a folder without journals likewise."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "empty").mkdir()
    assert sync_main([]) == 0
    assert sync_main(["empty"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "no journal given, and the MLflow store sqlite:///mlflow.db does not exist: nothing to sync; "
        "name journals or the folders that hold them (python -m axoexp.sync outputs/)",
        "no journal.jsonl below empty: nothing to upload",
    ]
    assert [path.name for path in tmp_path.iterdir()] == ["empty"]
