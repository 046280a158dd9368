"""A job's death is its own: kill -9 of one job of a sweep, in every launcher, ends that job's
run KILLED with everything it journaled, lets its siblings and later jobs finish, fails the
parent naming the dead job, and leaves nothing running; a sweep's main process killed -9 takes
its workers with it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import RAY_PORT_ENV, child_processes, leftovers, new_child_processes
from mlflow.tracking import MlflowClient
from test_faults import SLEEPY, assert_everything_measured_is_in, journals, start_cli, sync, updates_in
from test_launchers import _sweep_runs

from axoexp import lease, names
from axoexp.journal import read_journal

JOBS = ("executor=sleepy", "run.warmup_updates=2", "run.lease_cpus=1")
LONG, SHORT = 100000, 30  # measured updates of the job that is killed, and of its siblings
MID = 40  # a sibling still measuring when its neighbour's worker is killed
GATED = """
import time
from pathlib import Path
from axoexp import component
from axoexp.executors.eager import EagerExecutor

HOLD = Path(__file__).with_name("hold")


@component("executor", "gated")
class Gated(EagerExecutor):
    \"\"\"Eager plus 20 ms of sleep per update; from its 6th update on it waits while plugins/hold exists.\"\"\"
    update_includes = EagerExecutor.update_includes + ("sleep_20ms",)

    def step(self, inputs, targets):
        self.updates = getattr(self, "updates", 0) + 1
        while self.updates > 5 and HOLD.exists():
            time.sleep(0.05)
        time.sleep(0.02)
        return super().step(inputs, targets)
"""
LAUNCHERS = {
    "basic": (),  # jobs one after another in the sweep's own process: the killed job is the first
    "parallel": ("hydra/launcher=parallel", "hydra.launcher.n_jobs=2"),  # the third job waits for a worker
    "submitit_local": ("hydra/launcher=submitit_local",),
}


def _start_record(journal: Path) -> dict:
    return next(record for record in read_journal(journal) if record["kind"] == "start")


def _journal_of_long_job(root: Path, process: subprocess.Popen[str], updates: int, timeout: float = 300) -> Path:
    """The journal of the job with LONG measured updates, once it holds ``updates`` updates."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for journal in journals(root):
            planned = [r for r in read_journal(journal) if r["kind"] == "window" and r["window"] == "measured"]
            if planned and planned[0]["planned"] == LONG and len(updates_in(journal)) >= updates:
                return journal
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    pytest.fail(f"the long job journaled no {updates} updates within {timeout} s")


def _gone(pids: list[int], timeout: float = 60) -> list[int]:
    """Those of ``pids`` still alive after waiting up to ``timeout`` seconds for them to exit."""
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
        time.sleep(0.2)
    return alive


@pytest.mark.slow
def test_kill_9_of_one_job_is_its_own_death(tmp_path: Path, empty_store: Path) -> None:
    """In each local launcher (basic, parallel, submitit_local): the three sweeps run side by side,
    each in a folder with a store and a lease folder of its own."""
    before = child_processes()
    started = {}
    try:
        for launcher in sorted(LAUNCHERS):
            directory = tmp_path / launcher
            directory.mkdir()
            shutil.copyfile(empty_store, directory / "mlflow.db")
            env = {lease.LEASE_DIR_ENV: str(directory / "leases")}
            started[launcher] = directory, start_one_job_killed(directory, *LAUNCHERS[launcher], env=env)
        for directory, process in started.values():
            check_one_job_killed(directory, process)
    finally:
        for _, process in started.values():
            if process.poll() is None:
                process.kill()
                process.communicate()
    check_nothing_left(before, tmp_path)


@pytest.mark.slow
@pytest.mark.usefixtures("migrated_store")
def test_kill_9_of_one_ray_job_is_its_own_death(
    ray_cluster: tuple[str, Path, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address, plugins, private = ray_cluster  # the session's local Ray instance (conftest.py)
    (plugins / "sleepy.py").write_text(SLEEPY)  # the cluster's workers load their plugins from there
    for key, value in {**RAY_PORT_ENV, **private, "AXOEXP_PLUGINS_DIR": str(plugins)}.items():
        monkeypatch.setenv(key, value)
    before = child_processes()  # a Ray instance, its workers
    process = start_one_job_killed(tmp_path, "hydra/launcher=ray_devices", f"hydra.launcher.ray.init.address={address}")
    try:
        check_one_job_killed(tmp_path, process)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    check_nothing_left(before, tmp_path)


def start_one_job_killed(root: Path, *launcher: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A sweep in ``root`` of three jobs, the first long: it is to be killed -9 once it measured."""
    return start_cli(
        "-m",
        *launcher,
        *JOBS,
        f"run.measured_updates={LONG},{SHORT},{SHORT}",
        f"hydra.sweep.dir={root / 'outputs' / 'sweep'}",  # absolute: Ray's workers run elsewhere
        f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
        cwd=root,
        env=env,
    )


def check_one_job_killed(root: Path, process: subprocess.Popen[str]) -> None:
    """The sweep's long job is killed -9 once it measured 10 updates; the others finish."""
    victim_journal = _journal_of_long_job(root / "outputs", process, 10)
    victim = int(_start_record(victim_journal)["tags"][names.PROCESS_PID])
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = process.communicate(timeout=400)
    assert process.returncode == 1, stderr[-3000:]
    died = f"the job's process {victim} was killed by SIGKILL"
    last = stderr.splitlines()[-1]  # the job's death said with its run and with the sweep's end
    assert f": KILLED: killed: {died}; " in stderr and last.startswith("axoexp: the sweep ended FAILED: "), stderr[
        -3000:
    ]
    assert "was killed by SIGKILL; synced to run" in last, stderr[-3000:]
    assert "Traceback" not in stderr and "TerminatedWorkerError" not in stderr

    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    (parent,), children = _sweep_runs(uri)
    by_length = sorted(children, key=lambda run: -int(run.data.params["run.measured_updates"]))
    dead, siblings = by_length[0], by_length[1:]
    assert dead.info.status == "KILLED", dead.data.tags.get(names.FAILURE)
    assert f"the job's process {victim} was killed by SIGKILL" in dead.data.tags[names.FAILURE]
    assert_everything_measured_is_in(client, dead, victim_journal)
    assert len(updates_in(victim_journal)) >= 10
    assert [(run.info.status, run.data.metrics[names.update_metric("count")]) for run in siblings] == [
        ("FINISHED", SHORT),
        ("FINISHED", SHORT),
    ], "the siblings and the later job finished, every update kept"
    assert parent.info.status == "FAILED"
    assert re.search(r"^1 of 3 jobs did not finish \(00 [^)]*\); job0 died: ", parent.data.tags[names.FAILURE])
    assert f"run.measured_updates={LONG}" in parent.data.tags[names.FAILURE]
    assert "was killed by SIGKILL" in parent.data.tags[names.FAILURE]


def check_nothing_left(before: set[int], root: Path) -> None:
    """No process of the sweeps is left: none below this test's process, except below what ran
    before them (a Ray instance starts workers), and none that names ``root``."""
    assert new_child_processes(before) == [] and leftovers(str(root)) == [], "a process of the sweep was left behind"


@pytest.mark.slow
def test_kill_9_of_a_parallel_worker_or_of_the_sweeps_main_process(tmp_path: Path, empty_store: Path) -> None:
    """Two parallel sweeps side by side, each in a folder with a store and a lease folder of its
    own: in one a worker process is killed -9, in the other the sweep's main process."""
    started = {}
    leases = {}
    for name in ("worker", "main"):
        (tmp_path / name).mkdir()
        shutil.copyfile(empty_store, tmp_path / name / "mlflow.db")
        leases[name] = {lease.LEASE_DIR_ENV: str(tmp_path / name / "leases")}
    (tmp_path / "worker" / "plugins").mkdir()
    (tmp_path / "worker" / "plugins" / "gated.py").write_text(GATED)
    hold = tmp_path / "worker" / "plugins" / "hold"
    hold.touch()  # both jobs wait at their 6th update, so both are measuring at the kill
    try:
        started["worker"] = start_cli(
            "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", "executor=gated", *JOBS[1:],
            f"run.measured_updates={LONG},{MID},{SHORT}", cwd=tmp_path / "worker", env=leases["worker"],
        )  # fmt: skip
        started["main"] = start_cli(
            "-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", *JOBS, f"run.measured_updates={LONG}",
            "population.neurons=2,3", cwd=tmp_path / "main", env=leases["main"],
        )  # fmt: skip
        check_a_killed_worker(tmp_path / "worker", started["worker"])
        check_a_killed_main_process(tmp_path / "main", started["main"])
    finally:
        for process in started.values():
            if process.poll() is None:
                process.kill()
                process.communicate()


def check_a_killed_worker(root: Path, process: subprocess.Popen[str]) -> None:
    """kill -9 of the parallel launcher's worker process itself (what ran the job's process) while
    its job and a sibling measure: the pool replaces it; only its job is lost, with everything it
    measured kept."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    victim_journal = _journal_of_long_job(root / "outputs", process, 5)
    sibling_journal = _journal_in_flight(root / "outputs", process, MID)
    job = psutil.Process(int(_start_record(victim_journal)["tags"][names.PROCESS_PID]))
    worker = job.parent()
    assert worker is not None and worker.ppid() == process.pid, "the job's parent is a worker of the sweep"
    family = [member.pid for member in psutil.Process(process.pid).children(recursive=True)]
    worker.kill()
    (root / "plugins" / "hold").unlink()
    stdout, stderr = process.communicate(timeout=400)
    assert process.returncode == 1, stderr[-3000:]
    assert f"axoexp: job 0's worker process {worker.pid} was killed by SIGKILL; " in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "TerminatedWorkerError" not in stderr, stderr[-3000:]

    client = MlflowClient(tracking_uri=uri)
    (parent,), children = _sweep_runs(uri)
    dead, sibling, later = sorted(children, key=lambda run: -int(run.data.params["run.measured_updates"]))
    assert dead.info.status == "KILLED", dead.data.tags.get(names.FAILURE)
    assert_everything_measured_is_in(client, dead, victim_journal)
    assert len(updates_in(victim_journal)) >= 5
    assert [(run.info.status, run.data.metrics[names.update_metric("count")]) for run in (sibling, later)] == [
        ("FINISHED", MID),
        ("FINISHED", SHORT),
    ], "the sibling in flight and the later job finished, every update kept"
    assert Path(sibling.data.tags[names.JOURNAL]) == sibling_journal.resolve()
    assert parent.info.status == "FAILED"
    failure = parent.data.tags[names.FAILURE]
    assert re.search(r"^1 of 3 jobs did not finish \(00 [^)]*\); job0 died: ", failure)
    assert f"run.measured_updates={LONG}" in failure
    assert f"was stopped when its worker process {worker.pid} was killed by SIGKILL" in failure
    assert _gone(family) == [], "a worker or a job's process outlived the sweep"
    assert [line for line in leftovers("axoexp.worker_pool") if line.endswith(f" {process.pid}")] == [], (
        "a worker started after the kill outlived the sweep"
    )


def _journal_in_flight(root: Path, process: subprocess.Popen[str], planned: int) -> Path:
    """The journal of the job with ``planned`` measured updates once it holds 5 updates (and,
    gated, waits), asserted to be still measuring."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for journal in journals(root):
            records = read_journal(journal)
            windows = [r for r in records if r["kind"] == "window" and r["window"] == "measured"]
            if windows and windows[0]["planned"] == planned and len(updates_in(journal)) >= 5:
                assert not [r for r in records if r["kind"] == "end"], "the sibling ended before the kill"
                return journal
        assert process.poll() is None, process.communicate()
        time.sleep(0.2)
    pytest.fail(f"no job of {planned} measured updates journaled 5 updates within 300 s")


def check_a_killed_main_process(root: Path, process: subprocess.Popen[str]) -> None:
    """kill -9 of a parallel sweep's main process while its two jobs measure takes its workers with
    it; each job's process gets SIGTERM as its worker goes, and ends its run KILLED. The sweep kept
    no end of its own, so a sync of its folder ends the parent KILLED: its process is gone."""
    deadline = time.monotonic() + 300
    while len(found := journals(root / "outputs")) < 2 or not all(len(updates_in(j)) >= 5 for j in found):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)
    family = psutil.Process(process.pid).children(recursive=True)
    process.kill()
    process.communicate(timeout=60)
    assert _gone([member.pid for member in family]) == [], "workers outlived the sweep's main process"
    assert leftovers(str(root)) == []
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    (parent,), children = _sweep_runs(f"sqlite:///{root / 'mlflow.db'}")
    assert len(children) == 2
    for child in children:
        assert child.info.status == "KILLED" and child.data.tags[names.FAILURE] == "interrupted by SIGTERM"
        assert_everything_measured_is_in(client, child, Path(child.data.tags[names.JOURNAL]))
    assert parent.info.status == "RUNNING"
    synced = sync(parent.data.tags[names.SWEEP_DIR], cwd=root)
    assert synced.returncode == 0 and f"run {parent.info.run_id} (" in synced.stdout, synced
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "KILLED" and "is gone and never ended this run" in parent.data.tags[names.FAILURE]


# --- the fork itself, in this process


@pytest.mark.slow
def test_an_isolated_job_hands_back_what_it_returned_or_raised() -> None:
    from axoexp.errors import ConfigError, JobExitedError
    from axoexp.job_process import run_isolated

    def never(pid: int, how: str) -> str:
        raise AssertionError(f"{pid} {how}")

    assert run_isolated(lambda: 1.5, never) == 1.5
    assert run_isolated(lambda: None, never) is None

    def refuse() -> None:
        raise ConfigError("population.neurons=0: must be at least 1")

    with pytest.raises(ConfigError, match=r"^population.neurons=0: must be at least 1$"):
        run_isolated(refuse, never)
    with pytest.raises(ZeroDivisionError) as raised:
        run_isolated(lambda: 1 / 0, never)
    assert "in the job's process" in raised.value.__notes__[0], "the child's traceback comes along"
    for code in ("giving up", 0):  # a job's sys.exit is its failure: as SystemExit it would end the sweep
        with pytest.raises(JobExitedError, match=rf"^the job called sys.exit\({code!r}\) in process \d+$"):
            run_isolated(lambda code=code: sys.exit(code), never)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGUSR1])
def test_an_isolated_job_killed_by_a_signal_is_reported_as_such(signum: int) -> None:
    from axoexp.errors import JobKilledError
    from axoexp.job_process import run_isolated

    seen: list[tuple[int, str]] = []

    def on_killed(pid: int, how: str) -> str:
        seen.append((pid, how))
        return "its run was completed"

    name = signal.Signals(signum).name
    with pytest.raises(JobKilledError, match=rf"^the job's process (\d+) was killed by {name}; its run was completed$"):
        run_isolated(lambda: os.kill(os.getpid(), signum), on_killed)
    ((pid, how),) = seen
    assert how == f"was killed by {name}" and not psutil.pid_exists(pid), "the child was reaped"
