"""axoexp's pool of worker processes (``hydra/launcher=parallel``), with real processes and
signals: calls come back in order from reused workers, and a worker killed mid-call loses that
call alone, ends what it forked for it and is replaced. The launcher on it passes Hydra's own
contract for launchers."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import psutil
import pytest
from helpers import child_processes, new_child_processes
from hydra import version as hydra_version
from hydra.test_utils.launcher_common_tests import LauncherTestSuite
from hydra.version import VersionBase

from axoexp.parallel_launcher import close_pool
from axoexp.worker_pool import WorkerDeath, WorkerPool

pytestmark = pytest.mark.slow  # every test here starts processes


def worker_pid(seconds: float = 0.0) -> int:
    time.sleep(seconds)
    return os.getpid()


def fail() -> None:
    raise ZeroDivisionError("on purpose")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def fork_then_die() -> None:
    """What a sweep's job does in its worker: fork the job's process; then the worker is killed."""
    if os.fork() == 0:  # the job's process, without a parent-death signal: only the pool ends it
        time.sleep(600)
        os._exit(0)
    time.sleep(0.5)
    die()


def test_calls_come_back_in_order_from_reused_workers() -> None:
    pool = WorkerPool(2)
    try:
        pids = pool.run([(worker_pid, (0.2,)) for _ in range(6)], on_death=_no_death)
        assert len(set(pids)) == 2 and os.getpid() not in pids, "two workers, each reused"
        assert pool.run([(worker_pid, ())], on_death=_no_death)[0] in pids, "kept between batches"
        with pytest.raises(ZeroDivisionError, match="on purpose"):
            pool.run([(fail, ()), (worker_pid, ())], on_death=_no_death)
        assert set(pool.run([(worker_pid, ()), (worker_pid, ())], on_death=_no_death)) <= set(pids), (
            "a call that raised leaves its worker alive"
        )
    finally:
        pool.close()
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def test_a_worker_killed_mid_call_loses_that_call_alone() -> None:
    deaths: list[tuple[int, WorkerDeath]] = []

    def on_death(index: int, death: WorkerDeath) -> str:
        deaths.append((index, death))
        return "dead"

    pool = WorkerPool(1)
    try:
        first = pool.run([(worker_pid, ())], on_death=on_death)[0]
        results = pool.run([(worker_pid, ()), (fork_then_die, ()), (worker_pid, ())], on_death=on_death)
    finally:
        pool.close()
    assert results[0] == first and results[1] == "dead" and results[2] not in (first, None), (
        "the call before ran on the old worker, the one after on a fresh one"
    )
    ((index, death),) = deaths
    assert index == 1 and death.pid == first and death.how == "was killed by SIGKILL"
    ((forked, _),) = death.forked
    assert not psutil.pid_exists(forked) or psutil.Process(forked).status() == "zombie", "its forked process ended"


def _no_death(index: int, death: WorkerDeath) -> None:
    raise AssertionError(f"call {index}: {death}")


@pytest.mark.parametrize("launcher_name, overrides", [("axoexp_parallel", ["hydra.launcher.n_jobs=2"])])
class TestParallelLauncher(LauncherTestSuite):
    """Hydra's contract for launchers, as Hydra's own launcher plugins are tested."""

    @pytest.fixture(autouse=True, scope="class")
    @classmethod
    def _pool_closed_after(cls) -> Iterator[None]:
        # Hydra's suite expects a fresh process's defaults (version_base unset: jobs chdir into their
        # folders); a test before it in this process may have composed with version_base="1.3"
        base = VersionBase.instance()
        before, base.version_base = base.version_base, hydra_version._UNSPECIFIED_
        processes = child_processes()  # the session's Ray instance, if a test before these started it
        yield
        base.version_base = before
        close_pool()  # its workers would wait for the next sweep in this process
        assert new_child_processes(processes) == []
