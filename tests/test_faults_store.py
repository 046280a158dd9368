"""Faults stay contained: the store, the output folders, the journals, one-line errors.

Signals during store creation, damaged and half-built stores, same-second runs, damaged
journals (first, middle and last line), journals of two processes in one file, a sweep's
KILLED run completed from its journal, full and read-only disks, over-long and unloadable
checkpoints, a plugin exiting at import. Each runs the real thing and reads the result back.
"""

from __future__ import annotations

import itertools
import logging
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import helpers
import optuna
import pytest
import torch
from helpers import TRACEBACK, fill, free_port, held_locked, run_cli
from mlflow.tracking import MlflowClient
from test_faults import (
    LONG_RUN,
    assert_everything_measured_is_in,
    journals,
    only_run,
    own_leases,
    start_cli,
    sync,
    updates_in,
    wait_for_updates,
)
from test_report import logged_run, report_sweep

from axoexp import lease, names, tracking
from axoexp.compare import main as compare_main
from axoexp.components.population import CheckpointError
from axoexp.databases import lasting_refusal
from axoexp.errors import MAX_REASON, ConfigError, StoreLockedError, TrackingUnavailableError, first_line
from axoexp.experiment import RESULT_FILE, run_experiment
from axoexp.journal import JOURNAL_FILE, Journal, first_record, journal_end, read_journal, read_journal_lines
from axoexp.plan import plan_experiment
from axoexp.report.__main__ import main as report_main
from axoexp.sync import end_dead_run, end_dead_runs, stored_updates, sync_journal
from axoexp.sync import main as sync_main
from axoexp.tracking import CREATING_SUFFIX, experiment_id, open_client, store_problem, store_reason


def assert_one_line(stderr: str, expected: str) -> None:
    """The error is one line starting with the program's name, and no traceback is shown."""
    assert TRACEBACK not in stderr, stderr
    lines = [line for line in stderr.splitlines() if expected in line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(("axoexp: ", "axoexp.sync: ", "axoexp.report: ", "axoexp.compare: ")), lines[0]


@pytest.fixture
def mount(tmp_path: Path) -> Iterator:
    """Mount a real tmpfs (``mount(name, "size=512k")``); skips where mounting is not permitted."""
    mounted: list[Path] = []

    def make(name: str, options: str) -> Path:
        point = tmp_path / name
        point.mkdir()
        if (
            shutil.which("mount") is None
            or subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], capture_output=True
            ).returncode
        ):
            pytest.skip("mounting a tmpfs is not permitted here (needs root)")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


# --- the store ------------------------------------------------------------------------------------


def _half_built(path: Path) -> None:
    """What an older axoexp left when a signal came between MLflow's first tables and its migrations."""
    from mlflow.store.db.base_sql_model import Base
    from mlflow.store.db.utils import create_sqlalchemy_engine

    engine = create_sqlalchemy_engine(f"sqlite:///{path}")
    Base.metadata.tables["experiments"].create(engine)
    engine.dispose()


@pytest.mark.slow  # it runs the printed mv and builds a store from scratch (a migration: seconds on a busy disk)
def test_a_half_built_store_is_named_with_the_command_that_moves_it_aside(make_config, tmp_path: Path) -> None:
    store = tmp_path / "old" / "mlflow.db"
    store.parent.mkdir()
    _half_built(store)
    uri = f"sqlite:///{store}"
    with pytest.raises(ConfigError, match=rf"half-built MLflow store .* mv {store} {store}.broken"):
        plan_experiment(make_config(f"tracking.uri={uri}"))
    subprocess.run(f"mv {store} {store}.broken", shell=True, check=True)  # the command, as printed
    assert store_problem(uri) is None
    open_client(uri).search_experiments()
    assert store_problem(uri) is None and store.stat().st_size > 0


def optuna_study(path: Path) -> Path:
    """An Optuna study's SQLite database at ``path``, as the README's search makes one (Alembic's
    ``alembic_version`` among its tables)."""
    optuna.create_study(storage=f"sqlite:///{path}", study_name="search")
    return path


def test_only_an_mlflow_store_is_named_with_the_command_that_moves_it_aside(tmp_path: Path) -> None:
    """A file that is no SQLite database (a text file, /etc/passwd as tracking.uri), another
    application's database (an Optuna study) and one too damaged to read its tables were all called
    a damaged or half-built MLflow store, with advice to move them aside (as root, mv /etc/passwd).
    Each is now named for what it is, without a mv, and left as it was; an empty file is where a
    new store is made, and a half-built MLflow store, its alembic_version the only sign, still gets
    the mv."""
    text = tmp_path / "README.md"
    shutil.copyfile(helpers.REPO / "README.md", text)
    (tmp_path / "short.db").write_bytes(b"SQLite")
    tableless = tmp_path / "tableless.db"
    with closing(sqlite3.connect(tableless)) as database:
        database.execute("PRAGMA user_version = 3")  # written to the header: a database of no tables
    damaged = Path(shutil.copy(optuna_study(tmp_path / "made.db"), tmp_path / "damaged.db"))
    with damaged.open("r+b") as file:
        file.seek(100)  # past the 100-byte header: the schema's first page
        file.write(b"\xff" * 1000)
    study = optuna_study(tmp_path / "optuna.db")
    not_sqlite = "is not an SQLite database, so not an MLflow store; choose another path"
    expected = {
        text: not_sqlite,
        tmp_path / "short.db": not_sqlite,
        tableless: "is an SQLite database of another application (tables: none), not an MLflow store; "
        "choose another path",
        damaged: "is a damaged SQLite database (database disk image is malformed): its tables cannot be read, so "
        "whether it is an MLflow store is not known; choose another path",
        study: "is an SQLite database of another application (tables: alembic_version, studies, study_directions, "
        "study_system_attributes, study_user_attributes, trial_heartbeats, ... (13 in all)), not an MLflow store; "
        "choose another path",
    }
    for path, line in expected.items():
        before = path.read_bytes()
        uri = f"sqlite:///{path}"
        assert store_problem(uri) == f"tracking.uri={uri}: {path} {line}"
        assert path.read_bytes() == before, "the file was changed"
    assert optuna.load_study(study_name="search", storage=f"sqlite:///{study}").trials == []

    (tmp_path / "empty.db").touch()
    assert store_problem(f"sqlite:///{tmp_path / 'empty.db'}") is None  # open_client makes a new store there
    stamped = tmp_path / "stamped.db"
    with closing(sqlite3.connect(stamped)) as database:  # a creation cut off after Alembic's first stamp
        database.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        database.execute("INSERT INTO alembic_version VALUES (?)", (tracking.latest_schema_revision(),))
        database.commit()
    problem = store_problem(f"sqlite:///{stamped}")
    assert problem is not None and "is a half-built MLflow store" in problem, problem
    assert problem.endswith(f"mv {stamped} {stamped}.broken"), problem


def test_a_store_another_process_holds_locked_is_called_locked_not_damaged(
    make_config, tmp_path: Path, empty_store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A healthy store locked by another process was once called damaged, with advice to move it
    aside (which would hide every run in it), exit 2. It is a passing state, not a config error:
    exit 1, with the advice to retry; in compare too, but exit 2, as its 1 is a regression."""
    store = tmp_path / "mlflow.db"
    shutil.copyfile(empty_store, store)
    uri = f"sqlite:///{store}"
    monkeypatch.setattr(tracking, "STORE_LOCK_WAIT_S", 0.2)  # MLflow's 20 s, shortened for the test
    with held_locked(store):
        with pytest.raises(StoreLockedError) as raised:
            plan_experiment(make_config("run.measured_updates=5", f"tracking.uri={uri}"))
        assert raised.value.exit_code == 1 and "is damaged" not in str(raised.value) and "mv " not in str(raised.value)
        assert str(raised.value).startswith(
            f"tracking.uri={uri}: {store} is locked by another process (database is locked"
        )
        assert str(raised.value).endswith("the store is not damaged: retry once that process is done with it")
        assert sync_main(["--tracking-uri", uri]) == 1
        assert_one_line(capsys.readouterr().err, f"{store} is locked by another process")
        for command, main, status in (("report", report_main, 1), ("compare", compare_main, 2)):
            with pytest.raises(SystemExit) as ended:
                main(["--tracking-uri", uri, *(["--latest", "2"] if command == "compare" else [])])
            assert ended.value.code == status
            locked = str(raised.value).replace("tracking.uri=", "--tracking-uri=")  # the option given
            assert capsys.readouterr().err == f"axoexp.{command}: {locked}\n"
    assert store_problem(uri) is None  # the lock gone, the same store is fine


def _signalled_during_store_creation(directories: list[Path], delays: list[float], signums: list[int]) -> list[str]:
    """A short run started in each directory at once, each sent its signal ``delay`` seconds after
    its temporary store appeared; what each printed on stderr. Each has a lease folder of its own:
    none waits for another's CPU lease."""
    started = [
        start_cli(
            "run.warmup_updates=0",
            "run.measured_updates=1",
            cwd=directory,
            env={lease.LEASE_DIR_ENV: str(directory / "leases")},
        )
        for directory in directories
    ]
    due: list[float | None] = [None] * len(started)
    waiting = set(range(len(started)))
    deadline = time.monotonic() + 240
    while waiting:
        for index in sorted(waiting):
            process, directory = started[index], directories[index]
            if due[index] is None:
                if any(path.name.startswith(f"mlflow.db{CREATING_SUFFIX}") for path in directory.iterdir()):
                    due[index] = time.monotonic() + delays[index]
                else:
                    assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            if due[index] is not None and time.monotonic() >= due[index]:
                process.send_signal(signums[index])
                waiting.discard(index)
        time.sleep(0.01)
    return [process.communicate(timeout=120)[1] for process in started]


@pytest.mark.slow
def test_signals_during_store_creation_never_leave_a_half_built_store(tmp_path: Path, make_config) -> None:
    """SIGTERM and SIGINT at random points while a run creates its store: every later run succeeds.
    Two runs at a time, each creating a store of its own (the signal's moment is each run's own)."""
    chance = random.Random(24)
    delays = [chance.uniform(0, 1.5) for _ in range(8)]  # into the ~1 s of migrations, or just past them
    signums = [signal.SIGTERM if attempt % 2 else signal.SIGINT for attempt in range(8)]
    for pair in ((0, 1), (2, 3), (4, 5), (6, 7)):
        directories = [tmp_path / f"attempt{attempt}" for attempt in pair]
        for directory in directories:
            directory.mkdir()
        stderrs = _signalled_during_store_creation(
            directories, [delays[attempt] for attempt in pair], [signums[attempt] for attempt in pair]
        )
        for attempt, directory, stderr in zip(pair, directories, stderrs, strict=True):
            assert TRACEBACK not in stderr, stderr
            assert not [path for path in directory.iterdir() if CREATING_SUFFIX in path.name], (
                "the signalled process left its temporary store (the next run removed it)"
            )
            uri = f"sqlite:///{directory / 'mlflow.db'}"
            assert store_problem(uri) is None, "a half-built store was left"
            if attempt < 2:  # a whole later run after either signal; after the others, the store opens and migrates
                config = make_config(f"tracking.uri={uri}", "run.warmup_updates=0", "run.measured_updates=1")
                later = run_experiment(config, output_dir=directory / "later")
                assert MlflowClient(uri).get_run(later.run_id).info.status == "FINISHED"
            else:
                open_client(uri).search_experiments()
                assert store_problem(uri) is None
            assert not [path for path in directory.iterdir() if CREATING_SUFFIX in path.name], (
                "a temporary store was left"
            )


@pytest.mark.slow
def test_a_file_that_is_no_mlflow_store_is_one_line_without_a_mv_and_exit_2_in_every_command(
    tmp_path: Path, empty_store: Path
) -> None:
    """An MLflow store whose header and first pages were overwritten is no SQLite database any more,
    and an Optuna study's database is another application's: a run, a sweep, the report, compare and
    sync each say so in the same line, exit 2, where they said damaged or half-built and gave the mv
    that moves the file aside (the study's would have been lost to its search)."""
    corrupted, other = tmp_path / "corrupted", tmp_path / "other"
    corrupted.mkdir()
    other.mkdir()
    store = Path(shutil.copyfile(empty_store, corrupted / "mlflow.db"))
    with store.open("r+b") as stream:
        stream.write(b"\x13" * 8192)  # the header and the first pages
    optuna_study(other / "mlflow.db")
    expected = {
        corrupted: "mlflow.db is not an SQLite database, so not an MLflow store; choose another path",
        other: "mlflow.db is an SQLite database of another application (tables: alembic_version, studies, ",
    }
    refused = (  # each refused before it writes anything, so all start together
        ("axoexp", "run.measured_updates=1"),
        ("axoexp", "-m", "run.measured_updates=1", "population.neurons=2"),  # every job refused: no run
        ("axoexp.report",),
        ("axoexp.compare", "--latest", "2"),
        ("axoexp.sync",),
    )
    started = {
        (folder, command): helpers.start_cli(*command[1:], cwd=folder, module=command[0])
        for folder in expected
        for command in refused
    }
    for (folder, command), process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 2, (command, stderr)
        assert TRACEBACK not in stdout and "mv " not in stderr, (command, stderr)
        assert_one_line(stderr, expected[folder])


@pytest.mark.slow
def test_a_fresh_store_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path: Path, mount) -> None:
    full = mount("full", "size=256k")  # smaller than a fresh store
    result = run_cli("run.measured_updates=1", f"tracking.uri=sqlite:///{full / 'mlflow.db'}", cwd=tmp_path)
    assert result.returncode == 1
    assert_one_line(
        result.stderr, f"the MLflow store {full / 'mlflow.db'} could not be created: database or disk is full"
    )
    assert not [path for path in full.iterdir() if path.name.startswith("mlflow.db") and path.stat().st_size > 0]


def test_a_run_that_loses_its_store_and_its_journal_says_it_is_kept_in_neither(
    make_config, tmp_path: Path, mount, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead server and a full disk under the run's folder: the run measures anyway and says it is
    kept in no store, not "in its journal" (it has none); what it measured is in what it returns."""
    full = mount("full", "size=256k")
    fill(full)
    caplog.set_level(logging.INFO, logger="axoexp")
    with socket.socket() as held:  # bound, not listening: every connection is refused
        held.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(TrackingUnavailableError) as lost:
            run_experiment(
                make_config(f"tracking.uri={uri}", "tracking.http_max_retries=0", "run.measured_updates=3"),
                output_dir=full,
            )
    said = [record.getMessage() for record in caplog.records if record.name == "axoexp.experiment"]
    assert any(
        line.startswith("run ")
        and line.endswith(
            f" is kept in no store, only in what it returns: MLflow tracking at {uri} is unreachable "
            "(Connection refused), and it has no journal"
        )
        for line in said
    ), said
    assert not any("kept in its journal" in line for line in said), said
    result = lost.value.result
    assert result is not None and result.update.count == 3 and not result.in_mlflow


SWEEP_LAUNCHERS = {  # the parallel one forks its workers from the sweep; Hydra's joblib one spawns them
    "basic": (),
    "parallel": ("hydra/launcher=parallel",),
    "joblib": ("hydra/launcher=joblib",),
    "unkept": (),  # the basic launcher, whose sweep folder cannot keep the parent's end either
}


@pytest.mark.slow
def test_a_sweep_whose_store_fills_up_says_so_in_lines_and_names_the_sync_that_ends_its_runs(
    tmp_path: Path, mount
) -> None:
    """A sweep per launcher, side by side, each with its store on a small disk that fills while its
    job measures: the job says so in one line, the sweep that it could not end its runs and the
    command that does; no traceback. Once there is room, that command ends every run: the job's
    FINISHED from its journal, the parent as the sweep decided, FAILED (its job failed) naming the
    store's fault, from the end the sweep kept in its folder: its process was not killed. A sweep
    whose folder cannot keep that end says so, and the sync ends its parent KILLED."""
    started = {}
    for name, launcher in SWEEP_LAUNCHERS.items():
        folder, store = tmp_path / name, mount(f"{name}-store", "size=4m")
        folder.mkdir()
        uri = f"sqlite:///{store / 'mlflow.db'}"
        overrides = ("executor=sleepy", "run.warmup_updates=0", "run.measured_updates=300", f"tracking.uri={uri}")
        process = start_cli("-m", *launcher, *overrides, "hydra.sweep.dir=sweep", cwd=folder, env=own_leases(folder))
        started[name] = (folder, store, uri, process)
    waiting, deadline = set(started), time.monotonic() + 240
    while waiting:  # each store fills once its job has measured an update, seconds before it has measured all
        assert time.monotonic() < deadline, f"no update measured within 240 s in {sorted(waiting)}"
        for name in sorted(waiting):
            folder, store, _, process = started[name]
            assert process.poll() is None, process.communicate()
            if any(updates_in(journal) for journal in journals(folder / "sweep")):
                fill(store)
                if name == "unkept":  # where the sweep's journal would be
                    (folder / "sweep" / JOURNAL_FILE).mkdir()
                waiting.remove(name)
        time.sleep(0.2)
    for name, (folder, store, uri, process) in started.items():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 1 and TRACEBACK not in stderr, (name, stderr)
        assert f"axoexp: MLflow tracking at {uri} is on a full disk (" in stderr, (name, stderr)
        command = f"python -m axoexp.sync {folder / 'sweep'} --tracking-uri {uri}"
        last = stderr.splitlines()[-1]
        assert last.startswith(
            f"axoexp: the sweep could not end its MLflow runs: MLflow tracking at {uri} is on a full disk: "
            "(sqlite3.OperationalError) database or disk is full; it ended FAILED: 1 of 1 job did not finish ("
        ), (name, last)
        kept = (
            f" (kept in {folder / 'sweep' / JOURNAL_FILE} for the sync); "
            if name != "unkept"
            else f", which its folder could not keep (cannot open {folder / 'sweep' / JOURNAL_FILE}: "
        )
        assert f"; a job failed or the sweep was interrupted{kept}" in last, (name, last)
        assert last.endswith(f"once the store is back, end them with: {command}"), (name, last)
        (store / "filler").unlink()
        synced = sync(*command.split()[3:], cwd=folder)
        assert synced.returncode == 0, synced.stderr
        client = MlflowClient(tracking_uri=uri)
        runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
        parent_ended = "FAILED" if name != "unkept" else "KILLED"
        assert sorted((run.data.tags.get(names.SWEEP_ROLE, "child"), run.info.status) for run in runs) == [
            ("child", "FINISHED"),
            ("parent", parent_ended),
        ], name
        parent, child = sorted(runs, key=lambda run: names.SWEEP_ROLE not in run.data.tags)
        if name == "unkept":
            assert "is gone and never ended this run" in parent.data.tags[names.FAILURE], name
            continue
        assert parent.data.tags[names.FAILURE] == (
            f"1 of 1 job did not finish ({child.info.run_name}); a job failed or the sweep was interrupted; "
            f"the store failed as the sweep ended (MLflow tracking at {uri} is on a full disk: "
            "(sqlite3.OperationalError) database or disk is full)"
        ), name
        assert parent.data.tags[names.SYNCED].startswith(f"from {folder / 'sweep' / JOURNAL_FILE} at "), name


def test_a_sweeps_parent_ends_as_the_sweep_kept_it_else_killed(client, tracking_uri: str, tmp_path: Path) -> None:
    """A plain sync (no path) finds a sweep's kept end through the parent's ``sweep.dir``: that
    parent ends as the sweep decided, its reason completed where the sweep wrote only its start
    before the store failed; one whose sweep kept no end (it was killed) ends KILLED."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    parents = {}
    for name in ("decided", "killed"):
        (tmp_path / name).mkdir()
        tags = {
            names.SWEEP_ROLE: "parent",
            names.SWEEP_DIR: str(tmp_path / name),
            names.PROCESS_PID: str(gone.pid),
            names.HOSTNAME: socket.gethostname(),
        }
        parents[name] = client.create_run(experiment_id(client, "axoexp"), run_name=name, tags=tags)
    client.set_tag(parents["decided"].info.run_id, names.FAILURE, "1 of 1 child runs ...")  # then the store failed
    reason = "1 of 1 child runs ...; the store failed as the sweep ended (...)"
    end = {"experiment": "axoexp", "tracking_uri": tracking_uri, "status": "FAILED", "reason": reason}
    assert journal_end(tmp_path / "decided", parents["decided"], **end) is None
    (tmp_path / "unkept" / JOURNAL_FILE).mkdir(parents=True)  # a folder where the journal's file would be
    assert journal_end(tmp_path / "unkept", parents["decided"], **end).startswith("cannot open ")
    other = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'other.db'}")
    assert sync_journal(other, tmp_path / "decided" / JOURNAL_FILE) == (
        f"skipped: the sweep's parent run {parents['decided'].info.run_id} is not in this store"
    )
    assert other.search_runs([experiment_id(other, "axoexp")]) == [], "no parent of none of the sweep's runs"
    said = f"{JOURNAL_FILE}: synced to run {parents['decided'].info.run_id} (FAILED, the end its sweep decided)"
    assert any(line.endswith(said) for line in end_dead_runs(client))
    decided, killed = (client.get_run(parents[name].info.run_id) for name in ("decided", "killed"))
    assert decided.info.status == "FAILED" and decided.data.tags[names.FAILURE] == reason
    assert decided.data.tags[names.SYNCED].startswith(f"from {tmp_path / 'decided' / JOURNAL_FILE} at ")
    assert killed.info.status == "KILLED" and "is gone and never ended this run" in killed.data.tags[names.FAILURE]


def test_a_database_that_does_not_answer_is_unreachable_at_once_and_the_journal_keeps_the_run(
    make_config, tmp_path: Path
) -> None:
    """A PostgreSQL store whose server is down (nothing listens on its port): unreachable within the
    HTTP timeout, as a dead tracking server, and the run measures on into its journal; MLflow's own
    engine retried for about 100 s, then raised SQLAlchemy's OperationalError, a traceback."""
    pytest.importorskip("psycopg2")
    uri = f"postgresql+psycopg2://axoexp:secret@127.0.0.1:{free_port()}/axoexp"
    with pytest.raises(
        TrackingUnavailableError, match=r"no database answers at 127\.0\.0\.1:\d+ \(Connection refused\)"
    ) as unreachable:
        run_experiment(make_config(f"tracking.uri={uri}", "run.measured_updates=3"), output_dir=tmp_path)
    assert "secret" not in str(unreachable.value) and "axoexp:***@127.0.0.1" in str(unreachable.value)
    assert len([record for record in read_journal(tmp_path / JOURNAL_FILE) if record["kind"] == "update"]) == 8


@pytest.mark.parametrize(
    ("error", "lasting"),
    [  # the drivers' own first lines
        ('connection to server at "h", port 5432 failed: FATAL:  password authentication failed for user "u"\n', True),
        ("(1045, \"Access denied for user 'u'@'h' (using password: YES)\")", True),
        ('connection to server at "h", port 5432 failed: FATAL:  the database system is starting up\n', False),
        ('connection to server at "h", port 5432 failed: FATAL:  sorry, too many clients already\n', False),
        ("FATAL:  remaining connection slots are reserved for non-replication superuser connections", False),
    ],
)
def test_a_refusal_that_may_soon_pass_is_left_to_mlflows_retries(error: str, lasting: bool) -> None:
    assert lasting_refusal(error) == (error.splitlines()[0] if lasting else None)


def test_an_error_is_one_short_line_and_a_stores_names_the_operating_systems_words() -> None:
    """One home for an error as a line (errors.first_line): the store's lines, planning's and the CLI's
    cut a long message at a word, hide a URI's password and name a message-less error by its type;
    a store's reason is the OS error at the root of MLflow's wrapping where there is one."""
    long = RuntimeError("postgresql://u:s3cret@h/db failed " + "word " * 100)
    line = first_line(long)
    assert line.startswith("RuntimeError: postgresql://u:***@h/db failed word") and line.endswith("word ...")
    assert len(line) <= len("RuntimeError: ") + MAX_REASON + len(" ...") and "\n" not in line
    assert first_line(ValueError("first\nsecond"), typed=False) == "first"
    assert first_line(KeyError()) == store_reason(KeyError()) == "KeyError"
    assert store_reason(long) == first_line(long, typed=False)
    refused = ConnectionRefusedError(111, "Connection refused")
    wrapped = RuntimeError("Max retries exceeded with url: /api/2.0/mlflow/runs/create (" + "x" * 400 + ")")
    wrapped.__cause__ = OSError("HTTPConnectionPool(...)")
    wrapped.__cause__.__context__ = refused
    assert store_reason(wrapped) == "Connection refused"


@pytest.mark.slow
def test_a_database_that_refuses_the_connection_is_named_at_once(
    postgres: str, make_config, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PostgreSQL server that answers but refuses the connection (a database or user it does not
    have, as a wrong password would): MLflow's engine retried it 10 times over about 100 s, then
    raised a traceback. The run says so in its line and keeps its journal; the report exits 1, each
    within seconds."""
    missing_database = postgres.replace("/mlflow", "/nosuch")
    missing_user = postgres.replace("postgres@", "nobody:s3cret@")
    refusals = {missing_database: 'database "nosuch" does not exist', missing_user: 'role "nobody" does not exist'}
    for uri, why in refusals.items():
        started, folder = time.monotonic(), tmp_path / why.split()[0]
        folder.mkdir()
        with pytest.raises(TrackingUnavailableError) as refused:
            run_experiment(make_config(f"tracking.uri={uri}", "run.measured_updates=3"), output_dir=folder)
        host = uri.rpartition("@")[2].partition("/")[0]
        assert f"the database at {host} refused the connection: " in str(refused.value) and why in str(refused.value)
        assert "s3cret" not in str(refused.value)
        with pytest.raises(SystemExit) as ended:
            report_main(["--tracking-uri", uri])
        assert ended.value.code == 1 and why in capsys.readouterr().err
        assert time.monotonic() - started < 60, "not MLflow's ~100 s of retries"
    assert [path.name for path in tmp_path.rglob(JOURNAL_FILE)] == [JOURNAL_FILE] * 2
    (tmp_path / "ok").mkdir()
    run_experiment(make_config(f"tracking.uri={postgres}", "run.measured_updates=1"), output_dir=tmp_path / "ok")


def test_a_report_whose_disk_fills_as_it_writes_is_one_line_and_exit_1(
    client: MlflowClient, tracking_uri: str, tmp_path: Path, mount, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out on a disk with room for an empty file (the check before anything is read) but not the
    figure: the table is printed, then one line naming the file, exit 1 (the same command may work
    later), where 2 would say that nothing was done."""
    parent = report_sweep(client, tmp_path)
    small = mount("small", "size=8k")
    with pytest.raises(SystemExit) as ended:
        report_main(["--tracking-uri", tracking_uri, "--parent", parent, "--out", str(small)])
    printed, err = capsys.readouterr()
    assert ended.value.code == 1 and "executor" in printed, printed
    assert err == (
        f"axoexp.report: could not write {small / 'report.png'}: No space left on device; --out chooses another place\n"
    )


def test_a_read_only_store_serves_the_report_and_compare_and_a_run_and_sync_refuse_it(
    make_config, client: MlflowClient, tmp_path: Path, mount, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy of a store on a read-only mount: the report and compare said it was not writable, exit 2,
    though they only read it. compare compares; the report prints its table, writes its files and
    says in its line that they were not logged to the parent run, exit 0. A run and sync, which write,
    refuse it before anything runs. sqlite reads such a file as it is in MLflow's rollback-journal
    mode; one in WAL mode it cannot read without its -shm file, which is named, not called damaged."""
    parent = report_sweep(client, tmp_path)
    later = client.create_run(client.get_experiment_by_name("axoexp").experiment_id, tags={names.SWEEP_ROLE: "parent"})
    logged_run(client, later.info.experiment_id, "eager", "2x12x4", 11.0, parent=later.info.run_id, contention="none")
    client.set_terminated(later.info.run_id)
    shelf = mount("shelf", "size=8m")
    store = Path(shutil.copyfile(tmp_path / "mlflow.db", shelf / "existing.db"))
    wal = Path(shutil.copyfile(store, shelf / "wal.db"))
    with closing(sqlite3.connect(wal)) as database:
        database.execute("PRAGMA journal_mode = WAL")  # kept in the header; closing removes -wal and -shm
    subprocess.run(["mount", "-o", "remount,ro", str(shelf)], check=True)
    uri = f"sqlite:///{store}"
    out = tmp_path / "out"
    out.mkdir()
    report_main(["--tracking-uri", uri, "--parent", parent, "--out", str(out)])
    printed, err = capsys.readouterr()
    assert "sweep (FINISHED" in printed and "3x12x4" in printed, printed
    logged = f"not logged to the parent run: the store is read-only, {store} is not writable"
    assert err == f"report: {out / 'report.png'} ({logged})\n"
    assert (out / "report.png").stat().st_size > 0 and MlflowClient(uri).list_artifacts(parent) == []
    with pytest.raises(SystemExit) as ended:
        compare_main(["--tracking-uri", uri, parent, later.info.run_id])
    printed, err = capsys.readouterr()
    assert ended.value.code == 0 and "2x12x4" in printed and err == "", err

    refused = f"{uri}: {store} is not writable; choose a writable path"
    with pytest.raises(ConfigError) as raised:
        plan_experiment(make_config(f"tracking.uri={uri}"))
    assert str(raised.value) == f"invalid experiment config: tracking.uri={refused}"
    assert sync_main(["--tracking-uri", uri]) == 2
    assert capsys.readouterr().err == f"axoexp.sync: --tracking-uri={refused}\n"

    uri = f"sqlite:///{wal}"
    with pytest.raises(SystemExit) as ended:
        compare_main(["--tracking-uri", uri, parent, later.info.run_id])
    assert ended.value.code == 2 and capsys.readouterr().err == (
        f"axoexp.compare: --tracking-uri={uri}: {wal} is in WAL mode on a read-only file system, where sqlite "
        "cannot read it without its wal.db-shm file; copy it, and its wal.db-wal file if there is one, to a "
        "writable place\n"
    )


# --- output folders ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_runs_started_together_get_a_folder_and_a_journal_each(tmp_path: Path, empty_store: Path) -> None:
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    started = [start_cli("run.measured_updates=2", f"population.neurons={n}", cwd=tmp_path) for n in (2, 3, 4)]
    for process in started:
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    assert len(runs) == 3 and {run.info.status for run in runs} == {"FINISHED"}
    folders = {run.data.tags[names.OUTPUT_DIR] for run in runs}
    assert len(folders) == 3, "each run has a folder of its own"
    for run in runs:
        folder = Path(run.data.tags[names.OUTPUT_DIR])
        neurons = run.data.params["population.neurons"]
        assert f"population.neurons={neurons}" in (folder / ".hydra" / "overrides.yaml").read_text()
        journal = read_journal_lines(folder / JOURNAL_FILE)
        assert not journal.damaged and {record["journal"] for record in journal.records} == {
            run.data.tags[names.JOURNAL_ID]
        }
        local = client.download_artifacts(run.info.run_id, ".hydra/overrides.yaml", str(tmp_path / run.info.run_id))
        assert f"population.neurons={neurons}" in Path(local).read_text()


@pytest.mark.slow
def test_an_unwritable_output_folder_is_one_line(tmp_path: Path, mount) -> None:
    read_only = mount("read_only", "ro,size=64k")
    result = run_cli("run.measured_updates=1", f"hydra.run.dir={read_only / 'run'}", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line(result.stderr, "Read-only file system; choose a writable output folder (hydra.run.dir=DIR")


def test_result_json_is_never_left_empty_and_the_first_loss_is_kept(make_config, client, tmp_path: Path, mount) -> None:
    full = mount("full", "size=64k")
    fill(full)
    result = run_experiment(make_config("run.measured_updates=3"), output_dir=full)
    (run,) = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_id == result.run_id
    lost = run.data.tags[names.JOURNAL_LOST]
    assert JOURNAL_FILE in lost and "No space left on device" in lost, "the first failure (the journal's) is kept"
    assert not (full / RESULT_FILE).exists()
    assert not [path for path in full.iterdir() if path.name.endswith(".tmp")]


# --- journals ------------------------------------------------------------------------------------------


def _copy(killed: Path, journal: Path, into: Path) -> tuple[MlflowClient, Path]:
    """The killed run's store and journal, copied to ``into``: each damage is tried on its own copy."""
    into.mkdir()
    shutil.copyfile(killed / "mlflow.db", into / "mlflow.db")
    shutil.copyfile(journal, into / JOURNAL_FILE)
    return MlflowClient(f"sqlite:///{into / 'mlflow.db'}"), into / JOURNAL_FILE


def _damage_line(journal: Path, number: int) -> None:
    lines = journal.read_bytes().split(b"\n")
    lines[number - 1] = lines[number - 1].replace(b'"', b"'", 3)
    journal.write_bytes(b"\n".join(lines))


def test_a_journals_first_record_of_a_kind_skips_damaged_lines_and_others_kinds(tmp_path: Path) -> None:
    """first_record (a failed sweep's unsynced journals, a dead job's run id) reads a journal line by
    line: the first good record of the kind, past a damaged one and a record naming the kind in a field."""
    journal = Journal(tmp_path / JOURNAL_FILE)
    journal.append("start", run_id="r1")
    for index in range(3):
        journal.append("update", index=index, note='"kind": "tracking_lost"')
    journal.append("tracking_lost", reason="first")
    journal.append("tracking_lost", reason="second")
    journal.close()
    assert (first_record(journal.path, "start") or {}).get("run_id") == "r1"
    assert (first_record(journal.path, "tracking_lost") or {}).get("reason") == "first"
    _damage_line(journal.path, 5)
    assert (first_record(journal.path, "tracking_lost") or {}).get("reason") == "second"
    assert first_record(journal.path, "end") is None


@pytest.mark.slow
def test_damaged_journals_are_synced_by_record_and_reported_by_line(tmp_path: Path, killed_runs) -> None:
    _, journal, killed = killed_runs[20]  # conftest.py: killed -9 after 20 updates
    _, run = only_run(f"sqlite:///{killed / 'mlflow.db'}")
    assert run.info.status == "RUNNING"
    records = read_journal_lines(journal).records
    updates = [record for record in records if record["kind"] == "update"]

    # the first line, the start record: the run is found in the store by the journal id of the other lines
    client, copy = _copy(killed, journal, tmp_path / "first")
    _damage_line(copy, 1)
    said = sync_journal(client, copy)
    assert f"synced to run {run.info.run_id} (KILLED, {len(updates)} updates: " in said
    assert "damaged journal lines skipped: 1" in said
    assert_everything_measured_is_in(client, client.get_run(run.info.run_id), copy)

    # a middle line, an update: the others keep their own indices
    client, copy = _copy(killed, journal, tmp_path / "middle")
    middle = updates[len(updates) // 2]
    _damage_line(copy, middle["line"])
    said = sync_journal(client, copy)
    assert f"damaged journal lines skipped: {middle['line']}" in said
    history = client.get_metric_history(run.info.run_id, names.UPDATE_SERIES)
    assert {metric.step: metric.value for metric in history} == {
        update["index"]: update["ms"] for update in updates if update is not middle
    }

    # the last line cut off mid-write (a full disk): the run may have finished, so it is not called killed
    client, copy = _copy(killed, journal, tmp_path / "last")
    copy.write_bytes(copy.read_bytes()[:-20])
    said = sync_journal(client, copy)
    last = records[-1]["line"]
    assert f"damaged journal lines skipped: {last} (the last one cut off mid-write)" in said
    ended = client.get_run(run.info.run_id)
    assert ended.info.status == "FAILED" and "how the run ended is not known" in ended.data.tags[names.FAILURE]
    assert "killed" not in ended.data.tags[names.FAILURE]
    assert stored_updates(client, run.info.run_id) == len([u for u in updates if u["line"] != last])


@pytest.mark.slow
def test_a_run_a_sweep_ended_killed_is_completed_from_its_journal_once(killed_runs) -> None:
    """What a sweep does to a job killed -9: ends its run KILLED with no updates. Sync still
    uploads every journaled update (the entry point another process calls: sync_journal),
    keeps the sweep's reason and status, uploads .hydra/ as a folder, and counts nothing twice."""
    _, journal, folder = killed_runs[15]  # conftest.py: killed -9 after 15 updates
    client, run = only_run(f"sqlite:///{folder / 'mlflow.db'}")
    end_dead_run(client, run.info.run_id, "the sweep was stopped (its job failed) before this run ended")
    assert stored_updates(client, run.info.run_id) == 0

    synced = sync(str(folder / "outputs"), cwd=folder)
    assert f"synced to run {run.info.run_id} (KILLED, {len(updates_in(journal))} updates: " in synced.stdout
    client, run = only_run(f"sqlite:///{folder / 'mlflow.db'}")
    assert run.info.status == "KILLED"
    assert run.data.tags[names.FAILURE] == "the sweep was stopped (its job failed) before this run ended"
    assert_everything_measured_is_in(client, run, journal)
    assert {artifact.path for artifact in client.list_artifacts(run.info.run_id, ".hydra")} >= {
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
    }
    again = sync(str(folder / "outputs"), cwd=folder)
    assert f"already synced to run {run.info.run_id}" in again.stdout
    history = client.get_metric_history(run.info.run_id, names.UPDATE_SERIES)
    assert len(history) == len({metric.step for metric in history}) == len(updates_in(journal))


@pytest.mark.slow
def test_journals_of_two_processes_in_one_file_are_synced_run_by_run(tmp_path: Path, empty_store: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    started = []
    for directory in (first, second):  # side by side, a lease folder each (else the second waits for the first)
        directory.mkdir()
        shutil.copyfile(empty_store, directory / "mlflow.db")
        leases = {lease.LEASE_DIR_ENV: str(directory / "leases")}
        started.append(start_cli(*LONG_RUN, cwd=directory, env=leases))
    try:
        (one,), (other,) = (
            wait_for_updates(d / "outputs", 5, process) for d, process in zip((first, second), started, strict=True)
        )
    finally:
        for process in started:
            process.kill()
            process.communicate(timeout=60)
    counts = [len(updates_in(one)), len(updates_in(other))]
    lines = [one.read_text().splitlines(), other.read_text().splitlines()]
    interleaved = [line for pair in itertools.zip_longest(*lines) for line in pair if line is not None]
    one.write_text("\n".join(interleaved) + "\n")  # what two runs given one folder would write
    client, run = only_run(f"sqlite:///{first / 'mlflow.db'}")
    said = sync_journal(client, one)
    assert said.startswith("it holds the records of 2 runs that shared one output folder, each synced apart: ")
    assert f"synced to run {run.info.run_id} (KILLED, {counts[0]} updates" in said, said
    runs = {found.info.run_id: found for found in client.search_runs([run.info.experiment_id])}
    (created,) = set(runs) - {run.info.run_id}  # the other run was in another store: made here from its journal
    assert f"synced to run {created} (KILLED, {counts[1]} updates" in said, said
    assert [stored_updates(client, run_id) for run_id in (run.info.run_id, created)] == counts
    assert {found.info.status for found in runs.values()} == {"KILLED"} and end_dead_runs(client) == []


# --- one line, never a traceback ---------------------------------------------------------------------------


def test_checkpoint_paths_too_long_or_pinned_files_that_are_no_population_are_refused(registry, tmp_path: Path) -> None:
    import argparse
    import hashlib

    lite = registry.get("population", "lite")
    build = {"device": torch.device("cpu"), "dtype": torch.float32, "seed": 0}
    long_path = "/" + "a" * 100_000
    with pytest.raises(
        CheckpointError, match=r"\.\.\. \(100001 characters\)' cannot be read: File name too long"
    ) as raised:
        lite.build({"checkpoint": long_path}, **build)
    assert len(str(raised.value)) < 400
    other = tmp_path / "namespace.pt"
    torch.save(argparse.Namespace(model="not a population"), other)
    pin = hashlib.sha256(other.read_bytes()).hexdigest()
    with pytest.raises(CheckpointError, match="is pinned, but loading it as an axosim checkpoint failed: "):
        lite.build({"checkpoint": str(other), "checkpoint_sha256": pin}, **build)


@pytest.mark.slow
def test_a_long_checkpoint_path_is_one_line_in_a_run(tmp_path: Path, empty_store: Path) -> None:
    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    result = run_cli("run.measured_updates=1", "population.checkpoint=/" + "a" * 100_000, cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line(result.stderr, "(100001 characters)' cannot be read: File name too long")
    assert len(result.stderr) < 2000


@pytest.mark.slow
def test_a_plugin_calling_sys_exit_at_import_is_named_also_in_help(tmp_path: Path) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "leaves.py").write_text("import sys\nsys.exit(3)\n")
    result = run_cli("run.measured_updates=1", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line(result.stderr, "leaves.py called sys.exit(3) while importing")
    shown = run_cli("--help", cwd=tmp_path)
    assert shown.returncode == 0 and "loss: " in shown.stdout
    assert_one_line(shown.stderr, "leaves.py called sys.exit(3) while importing (its options are missing below)")
