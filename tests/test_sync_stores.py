"""``python -m axoexp.sync``: each journal's run goes to the store its journal records, with two real
sqlite stores and real runs; ``--tracking-uri`` overrides, saying so, and never copies a run that its
own store has."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TRACEBACK, free_port, gone_reader, interrupted, start_cli
from mlflow.tracking import MlflowClient
from mlflow.utils.time import get_current_time_millis

from axoexp import names
from axoexp.experiment import run_experiment
from axoexp.journal import JOURNAL_FILE, START, Journal
from axoexp.sync import INTERRUPTED
from axoexp.sync import main as sync_main

SHORT = ("run.warmup_updates=1", "run.measured_updates=2")


def _runs(database: Path) -> list:
    client = MlflowClient(tracking_uri=f"sqlite:///{database}")
    experiment = client.get_experiment_by_name("axoexp")
    return client.search_runs([experiment.experiment_id]) if experiment else []


@pytest.fixture
def finished_run(make_config, tmp_path: Path, empty_store: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A run FINISHED in ``ro/m.db``, named by a relative URI from ``tmp_path``: its run id and outputs."""
    (tmp_path / "ro").mkdir()
    shutil.copyfile(empty_store, tmp_path / "ro" / "m.db")
    monkeypatch.chdir(tmp_path)
    outputs = tmp_path / "outputs" / "run"
    outputs.mkdir(parents=True)
    # MLflow keeps one store per URI in a process: the URI names this test's folder, relatively
    uri = f"sqlite:///../{tmp_path.name}/ro/m.db"
    result = run_experiment(make_config(f"tracking.uri={uri}", *SHORT), output_dir=outputs)
    assert [run.info.status for run in _runs(tmp_path / "ro" / "m.db")] == ["FINISHED"]
    return result.run_id, outputs


def test_sync_writes_to_the_journal_s_own_store_and_makes_no_second_copy(
    finished_run: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id, outputs = finished_run
    elsewhere = tmp_path / "elsewhere"  # the relative sqlite:///ro/m.db is the run's, not this directory's
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert sync_main([str(tmp_path / "outputs")]) == 0
    assert capsys.readouterr().out == (
        f"{outputs / JOURNAL_FILE}: already complete in the store: run {run_id} "
        f"(FINISHED, 3 updates: 1 warm-up, 2 measured) in sqlite:///{tmp_path / 'ro' / 'm.db'}\n"
    )
    assert not (elsewhere / "mlflow.db").exists()
    assert len(_runs(tmp_path / "ro" / "m.db")) == 1

    other = tmp_path / "other.db"
    assert sync_main([str(tmp_path / "outputs"), "--tracking-uri", f"sqlite:///{other}"]) == 0
    assert capsys.readouterr().out == (
        f"{outputs / JOURNAL_FILE}: skipped: its run {run_id} is in its own store "
        f"sqlite:///{tmp_path / 'ro' / 'm.db'} (FINISHED); --tracking-uri sqlite:///{other} would make a second "
        "copy (without --tracking-uri, sync completes it there)\n"
    )
    assert not other.exists() and len(_runs(tmp_path / "ro" / "m.db")) == 1


def test_a_journal_that_cannot_be_read_is_skipped_in_one_line_and_the_others_synced(
    finished_run: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A journal whose reads fail (EIO: /proc/self/mem, which even root cannot read from its start)
    and a file none of whose lines is a record are one line each and exit 2; a folder named
    journal.jsonl (where a sweep could not keep its end) is no journal; the readable journal is synced."""
    run_id, outputs = finished_run
    (tmp_path / "outputs" / "eio").mkdir()
    (tmp_path / "outputs" / "eio" / JOURNAL_FILE).symlink_to("/proc/self/mem")
    (tmp_path / "outputs" / "sweep" / JOURNAL_FILE).mkdir(parents=True)
    (tmp_path / "outputs" / "notes").mkdir()
    (tmp_path / "outputs" / "notes" / JOURNAL_FILE).write_text("# my notes\nrun 3 was odd\n")
    assert sync_main([str(tmp_path / "outputs")]) == 2
    assert capsys.readouterr().out == (
        f"{tmp_path / 'outputs' / 'eio' / JOURNAL_FILE}: skipped: it cannot be read (Input/output error)\n"
        f"{tmp_path / 'outputs' / 'notes' / JOURNAL_FILE}: skipped: none of its 2 lines is a journal record: it is "
        "no axoexp journal\n"
        f"{outputs / JOURNAL_FILE}: already complete in the store: run {run_id} "
        f"(FINISHED, 3 updates: 1 warm-up, 2 measured) in sqlite:///{tmp_path / 'ro' / 'm.db'}\n"
    )


@pytest.mark.parametrize("own_store", ["lost", "emptied"])
def test_tracking_uri_overrides_a_store_that_lacks_the_run_and_says_so(
    finished_run: tuple[str, Path],
    tmp_path: Path,
    empty_store: Path,
    capsys: pytest.CaptureFixture[str],
    own_store: str,
) -> None:
    """The run's own store is gone, or an empty file (which is no store: MLflow would create its tables in it)."""
    run_id, outputs = finished_run
    own = tmp_path / "ro" / "m.db"
    if own_store == "lost":
        own.unlink()
    else:
        own.write_bytes(b"")
    other = tmp_path / "other.db"
    shutil.copyfile(empty_store, other)
    assert sync_main([str(outputs), "--tracking-uri", f"sqlite:///{other}"]) == 0
    (copied,) = _runs(other)
    assert capsys.readouterr().out == (
        f"{outputs / JOURNAL_FILE}: synced to run {copied.info.run_id} (FINISHED, 3 updates: 1 warm-up, 2 measured) "
        f"in sqlite:///{other} "
        f"(--tracking-uri overrides its own store sqlite:///{tmp_path / 'ro' / 'm.db'}, which does not have the run)\n"
    )
    assert copied.info.status == "FINISHED" and copied.info.run_id != run_id
    assert (own.stat().st_size == 0) if own_store == "emptied" else not own.exists(), "nothing is created in it"


ELSEWHERE = {names.PROCESS_PID: "1", names.HOSTNAME: "elsewhere"}  # a process sync cannot check
GONE = {names.PROCESS_PID: "1", names.HOSTNAME: socket.gethostname(), names.PROCESS_START: "0.00"}
"""A process of this host that is gone: its pid 1 did not start in 1970."""


def _unsynced_journal(folder: Path, uri: str, tags: dict[str, str] = ELSEWHERE) -> Path:
    """A journal of a run whose store never answered: its start record (its process's ``tags``), nothing more."""
    folder.mkdir(parents=True)
    journal = Journal(folder / JOURNAL_FILE)
    tags = {**tags, names.JOURNAL_ID: journal.id, names.JOURNAL: str(journal.path.resolve())}
    now = get_current_time_millis()
    journal.append(
        START, journal_id=journal.id, run_id=None, experiment="axoexp", tracking_uri=uri, tags=tags, start_time=now
    )
    journal.close()
    return folder


@pytest.mark.slow
def test_sync_gives_up_on_a_dead_server_in_seconds_and_ctrl_c_is_one_line(tmp_path: Path) -> None:
    """MLflow's own HTTP retries took ~8 minutes against a server that is down, and Ctrl-C then
    printed urllib3's traceback: sync bounds them as a run does and says Ctrl-C in one line."""
    dead = f"http://127.0.0.1:{free_port()}"
    folder = _unsynced_journal(tmp_path / "outputs" / "dead", dead)
    command = [sys.executable, "-m", "axoexp.sync", str(folder), "--tracking-uri", dead]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert done.returncode == 1 and TRACEBACK not in done.stderr, done.stderr
    assert f"axoexp.sync: {folder / JOURNAL_FILE}: MLflow tracking at {dead} is unreachable" in done.stderr

    with socket.socket() as hung:  # accepts connections, never answers: each request waits its timeout
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        hung.settimeout(60)
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        folder = _unsynced_journal(tmp_path / "outputs" / "hung", uri)
        process = start_cli(str(folder), "--tracking-uri", uri, cwd=tmp_path, module="axoexp.sync")
        stderr = interrupted(process, hung.accept)  # at the sync's first request
    assert process.returncode == 130 and TRACEBACK not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == f"axoexp.sync: {INTERRUPTED}"


@pytest.mark.slow
def test_a_reader_that_stops_early_leaves_every_journal_synced(tmp_path: Path, migrated_store: Path) -> None:
    """``sync outputs/ | head -0``: the reader is gone before the first journal's line, which is no
    fault of the store (it was called unreachable, exit 1, for every journal): all are synced, exit 0."""
    uri = f"sqlite:///{migrated_store}"
    journals = [_unsynced_journal(tmp_path / "outputs" / name, uri, GONE) / JOURNAL_FILE for name in "abc"]
    with gone_reader() as stdout:
        process = start_cli(str(tmp_path / "outputs"), cwd=tmp_path, module="axoexp.sync", stdout=stdout)
        stderr = process.communicate(timeout=300)[1]
    assert (process.returncode, stderr) == (0, "")
    runs = _runs(migrated_store)
    assert sorted(run.data.tags[names.JOURNAL] for run in runs) == list(map(str, journals))
    assert all(run.info.status == "KILLED" and names.SYNCED in run.data.tags for run in runs)


def test_an_unusable_store_is_named_by_where_it_was_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """sync's line names the option the user gave (--tracking-uri=), or $MLFLOW_TRACKING_URI, not
    a run's Hydra key tracking.uri=: what to change is then on the line."""
    (tmp_path / "store").mkdir()
    directory = f"sqlite:///{tmp_path / 'store'}"  # a directory, not a database file
    monkeypatch.chdir(tmp_path)
    assert sync_main(["--tracking-uri", directory]) == 2
    assert capsys.readouterr().err.startswith(f"axoexp.sync: --tracking-uri={directory}: ")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", directory)
    assert sync_main([]) == 2
    assert capsys.readouterr().err.startswith(f"axoexp.sync: $MLFLOW_TRACKING_URI={directory}: ")
