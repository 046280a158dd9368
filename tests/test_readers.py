"""The report and compare on a store they cannot read (axoexp.readers): one line each, the same
after the command's name, and the exit status of one rule: 2 for a store that is no usable store,
1 for one that does not answer, but 2 in compare, whose 1 is a regression (a locked store:
test_faults_store). Ctrl-C is one line too, while they (and sync) import as while they read."""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from helpers import DRIVERLESS, TRACEBACK, free_port, interrupted, start_cli, start_python, wait_for
from mlflow.tracking import MlflowClient

from axoexp import names
from axoexp.compare import main as compare_main
from axoexp.report.__main__ import main as report_main
from axoexp.signals import CTRL_C
from axoexp.sync import main as sync_main
from axoexp.versions import versions_line

COMMANDS = {"axoexp.report": (report_main, []), "axoexp.compare": (compare_main, ["--latest", "2"])}


@pytest.mark.slow  # a dead server's bounded retries: 2 s each
@pytest.mark.parametrize(("command", "unanswered"), [("axoexp.report", 1), ("axoexp.compare", 2)])
def test_a_store_that_cannot_be_read_is_one_line(
    command: str, unanswered: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that is no database (no mv offered for it), a file store and a database whose driver is
    not installed are refused (exit 2), naming the option that set the URI (it said tracking.uri=, a
    run's key), or $MLFLOW_TRACKING_URI; a dead server answers nothing after the retries bounded as
    tracking.* bounds a run's (exit 1, compare's 2)."""
    for variable in (names.HTTP_MAX_RETRIES_ENV, names.HTTP_TIMEOUT_ENV, names.HTTP_BACKOFF_FACTOR_ENV):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "mlflow.db").write_text("garbage\n")
    garbage = f"sqlite:///{tmp_path / 'mlflow.db'}"
    why = f"{tmp_path / 'mlflow.db'} is not an SQLite database, so not an MLflow store; choose another path\n"
    main, args = COMMANDS[command]
    server, database = free_port(), free_port()
    refused = [
        (garbage, 2, f"--tracking-uri={garbage}: {why}"),
        (str(tmp_path / "mlruns"), 2, f"--tracking-uri={tmp_path / 'mlruns'}: a file store, which MLflow"),
        (
            f"http://u:s3cret@127.0.0.1:{server}",
            unanswered,
            f"the MLflow store at http://u:***@127.0.0.1:{server} could not be read: Connection refused",
        ),
        (  # a database whose server does not answer: at once, not after MLflow's ~100 s of retries
            f"postgresql+psycopg2://u:s3cret@127.0.0.1:{database}/db",
            unanswered,
            f"the MLflow store at postgresql+psycopg2://u:***@127.0.0.1:{database}/db could not be read: no database "
            "answers at 127.0.0.1:",
        ),
    ]
    if DRIVERLESS is not None:  # a traceback of SQLAlchemy's ModuleNotFoundError
        uri, module = DRIVERLESS
        needs = f"{uri.partition('://')[0]}:// needs the Python driver {module}"
        refused.append((uri, 2, f"--tracking-uri={uri.replace(':p@', ':***@')}: {needs}"))  # a password never shown
    for uri, status, line in refused:
        with pytest.raises(SystemExit) as ended:
            main(["--tracking-uri", uri, *args])
        err = capsys.readouterr().err
        assert ended.value.code == status and err.startswith(f"{command}: {line}") and err.count("\n") == 1, err
        assert "s3cret" not in err and ":p@" not in err, err
    monkeypatch.setenv("MLFLOW_TRACKING_URI", garbage)
    with pytest.raises(SystemExit) as ended:
        main(args)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.startswith(f"{command}: $MLFLOW_TRACKING_URI={garbage}: {why}"), err
    assert os.environ[names.HTTP_MAX_RETRIES_ENV] == "2" and os.environ[names.HTTP_TIMEOUT_ENV] == "10"


def damaged_beyond_its_schema(folder: Path) -> tuple[Path, list[str]]:
    """``folder/mlflow.db`` holding two RUNNING runs, its tags' first page overwritten (with
    :func:`damage_table`), and the runs' ids."""
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'made.db'}")
    experiment = client.create_experiment("axoexp")
    run_ids = [client.create_run(experiment, tags={names.SWEEP_ROLE: "parent"}).info.run_id for _ in range(2)]
    store = Path(shutil.copy(folder / "made.db", folder / "mlflow.db"))  # no connection of this process holds it
    damage_table(store, "tags")
    return store, run_ids


@pytest.mark.parametrize("command", COMMANDS)
def test_an_empty_store_file_is_no_store_and_stays_empty(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty ``mlflow.db`` (``touch``ed, or left by a tool): the readers had MLflow create its
    tables there, so a reader wrote, then said there was no sweep."""
    empty = tmp_path / "mlflow.db"
    empty.touch()
    main, args = COMMANDS[command]
    with pytest.raises(SystemExit) as ended:
        main(["--tracking-uri", f"sqlite:///{empty}", *args])
    err = capsys.readouterr().err
    assert ended.value.code == 2, err
    assert err.startswith(f"{command}: no MLflow store: sqlite:///{empty} is an empty file; ")
    assert empty.stat().st_size == 0, "a reader writes nothing"


def test_sync_names_a_store_damaged_beyond_its_schema_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sync's look for RUNNING runs whose process is gone reads the damaged tags: the file named
    damaged with the command that moves it aside, exit 2, where it said unreachable, exit 1 (retry)."""
    store, _ = damaged_beyond_its_schema(tmp_path)
    capsys.readouterr()
    uri = f"sqlite:///{store}"
    assert sync_main(["--tracking-uri", uri]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"axoexp.sync: MLflow tracking at {uri}: {store} is damaged, not a readable MLflow store "
        f"((sqlite3.DatabaseError) database disk image is malformed); move it aside: mv {store} {store}.broken"
    ]


def damage_table(path: Path, table: str) -> None:
    """Overwrite the first page of ``table`` in the sqlite file ``path``: the schema and the other
    tables still read, so only reading that table finds the damage."""
    with closing(sqlite3.connect(path)) as database:
        page_size = database.execute("PRAGMA page_size").fetchone()[0]
        (root,) = database.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    with path.open("r+b") as file:
        file.seek((root - 1) * page_size)
        file.write(b"\xff" * page_size)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_store_damaged_beyond_its_schema_or_a_dead_server_is_named_never_a_missing_run(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store whose damage the opening check cannot see (its run tags) is named as damaged, exit 2,
    where the report exited 1 ("retry") and compare said the run ids were no runs; a dead server
    given run ids is named as a store that could not be read, not as a missing run."""
    monkeypatch.setenv(names.HTTP_MAX_RETRIES_ENV, "0")
    monkeypatch.chdir(tmp_path)  # where a report that read the store would write its figure
    store, run_ids = damaged_beyond_its_schema(tmp_path)
    capsys.readouterr()  # MLflow's lines as it made the store
    main, args = COMMANDS[command]
    given = ["--parent", run_ids[1]] if command == "axoexp.report" else run_ids
    server = f"http://127.0.0.1:{free_port()}"
    for uri, line in (
        (f"sqlite:///{store}", f"{store} is damaged, not a readable MLflow store ((sqlite3.DatabaseError) "),
        (server, f"the MLflow store at {server} could not be read: Connection refused"),
    ):
        for arguments in (args, given):
            with pytest.raises(SystemExit) as ended:
                main(["--tracking-uri", uri, *arguments])
            err = capsys.readouterr().err
            assert err.startswith(f"{command}: {line}") and err.count("\n") == 1, (arguments, err)
            assert ended.value.code == (2 if uri.startswith("sqlite") or command == "axoexp.compare" else 1), err
        if uri.startswith("sqlite"):
            assert err.rstrip().endswith(f"move it aside: mv {store} {store}.broken"), err


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_ctrl_c_while_the_store_is_read_is_one_line_and_exit_130(command: str, tmp_path: Path) -> None:
    """SIGINT while the command waits on its first request, to a server that accepts and never
    answers: one line, exit 130, as sync's, where it printed urllib3's traceback."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        hung.settimeout(60)
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        process = start_cli("--tracking-uri", uri, *COMMANDS[command][1], cwd=tmp_path, module=command)
        stderr = interrupted(process, hung.accept)  # at the command's first request
    assert process.returncode == 130 and TRACEBACK not in stderr, stderr
    assert stderr.strip().splitlines() == [f"{command}: {CTRL_C}"], stderr


SLOW_MLFLOW = """
import pathlib, sys, time

class SlowMlflow:
    def find_spec(self, name, path=None, target=None):
        if name == "mlflow":
            sys.meta_path.remove(self)
            pathlib.Path("importing").touch()
            time.sleep(120)
        return None

sys.meta_path.insert(0, SlowMlflow())
"""
"""A sitecustomize whose first import of mlflow says so in a file, then takes two minutes."""


@pytest.mark.parametrize("command", [*COMMANDS, "axoexp.sync"])
def test_ctrl_c_while_the_command_imports_is_one_line_and_exit_130(command: str, tmp_path: Path) -> None:
    """SIGINT while the command imports MLflow (seconds of every start; the report's matplotlib too):
    one line, exit 130, where it printed the import's traceback. SIGINT's default is restored in
    the child and the signal waits for the import to begin, as test_cli's before a run does."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SLOW_MLFLOW)
    path = os.pathsep.join(filter(None, [str(tmp_path / "site"), os.environ.get("PYTHONPATH")]))
    process = start_python(["-m", command], tmp_path, env={**os.environ, "PYTHONPATH": path})
    stderr = interrupted(process, lambda: wait_for(tmp_path / "importing"))
    assert process.returncode == 130 and TRACEBACK not in stderr, stderr
    assert stderr.strip().splitlines() == [f"{command}: {CTRL_C}"], stderr


@pytest.mark.parametrize("main", [report_main, compare_main, sync_main])
def test_every_reader_prints_the_version_line_the_command_line_does(
    main, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--version`` was argparse's 'unrecognized arguments' in the report, compare and sync."""
    monkeypatch.chdir(tmp_path)  # nothing is read or created: no store here
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0 and capsys.readouterr().out == f"{versions_line()}\n"
    assert not list(tmp_path.iterdir())
