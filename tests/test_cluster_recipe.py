"""The README's cluster recipe, for real: an ``mlflow server --workers 4`` on PostgreSQL, and a
parallel sweep of 4 jobs against it in which one job is killed -9 and the server is restarted
once mid-sweep (the job beside the killed one, and the next, log across the restart).
PostgreSQL is Debian's (``apt-get install -y postgresql``; .ci/run installs it), started as the
``postgres`` user on a data directory of the test's own, never the system's."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import child_processes, free_port, leftovers, new_child_processes, start_mlflow
from mlflow.tracking import MlflowClient
from test_faults import assert_everything_measured_is_in, journals, start_cli, sync, updates_in
from test_job_deaths import LONG, _journal_of_long_job, _start_record
from test_launchers import _sweep_runs

from axoexp import lease, names

SHORT = (30, 31, 32)  # measured updates of the jobs that finish, beside the killed one and after its death


def _stop(server: subprocess.Popen[bytes]) -> None:
    os.killpg(server.pid, signal.SIGKILL)  # its own session: the server and its workers
    server.wait(timeout=60)


@pytest.mark.slow
def test_a_parallel_sweep_on_a_postgres_backed_server_survives_a_killed_job_and_a_server_restart(
    tmp_path: Path, postgres: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(lease.LEASE_DIR_ENV, str(tmp_path / "leases"))
    before = child_processes()  # the session's Ray instance, if a test before this one started it
    (tmp_path / "server").mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_mlflow("server", tmp_path / "server", port, own_session=True, backend=postgres, workers=4)
    process = None
    try:
        process = start_cli(
            "-m",
            "hydra/launcher=parallel",
            "hydra.launcher.n_jobs=2",
            "run.lease_cpus=1",
            "executor=sleepy",
            "run.warmup_updates=2",
            f"run.measured_updates={LONG},{','.join(map(str, SHORT))}",
            f"tracking.uri={uri}",
            "tracking.http_max_retries=8",  # rides out a server restart: 1+2+4+... s between tries
            cwd=tmp_path,
        )
        victim_journal = _journal_of_long_job(tmp_path / "outputs", process, 10)
        _stop(server)  # mid-sweep: the long job still runs
        server = start_mlflow("server", tmp_path / "server", port, own_session=True, backend=postgres, workers=4)
        victim = int(_start_record(victim_journal)["tags"][names.PROCESS_PID])
        os.kill(victim, signal.SIGKILL)
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 1, stderr[-3000:]
        assert f"axoexp: the job's process {victim} was killed by SIGKILL; synced to run" in stderr, stderr[-3000:]

        client = MlflowClient(tracking_uri=uri)
        (parent,), children = _sweep_runs(uri)
        assert len(children) == 1 + len(SHORT)
        assert parent.info.status == "FAILED" and "job0 died: " in parent.data.tags[names.FAILURE]
        by_journal = {path.parent: path for path in journals(tmp_path / "outputs")}
        for child in children:
            journal = by_journal[Path(child.data.tags[names.OUTPUT_DIR])]
            measured = int(child.data.params["run.measured_updates"])
            history = client.get_metric_history(child.info.run_id, names.UPDATE_SERIES)
            assert len(history) == len({metric.step for metric in history}), "a metric was logged twice"
            assert_everything_measured_is_in(client, child, journal)
            if measured == LONG:
                assert child.info.status == "KILLED" and len(updates_in(journal)) >= 10
                assert f"the job's process {victim} was killed by SIGKILL" in child.data.tags[names.FAILURE]
            else:
                assert child.info.status == "FINISHED", child.data.tags.get(names.FAILURE)
                assert len(history) == 2 + measured and child.data.metrics[names.update_metric("count")] == measured

        again = sync(str(tmp_path / "outputs"), "--tracking-uri", uri, cwd=tmp_path)
        assert again.returncode == 0 and "synced to run" not in again.stdout.replace("already synced", ""), again.stdout
        for child in _sweep_runs(uri)[1]:  # a second sync changed nothing
            history = client.get_metric_history(child.info.run_id, names.UPDATE_SERIES)
            assert len(history) == len(updates_in(by_journal[Path(child.data.tags[names.OUTPUT_DIR])]))
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        _stop(server)
    assert new_child_processes(before) == []
    assert leftovers(str(tmp_path)) == []
