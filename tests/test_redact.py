"""A password in a URI is never shown: in axoexp's lines, its log and Hydra's own log lines."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import free_port, start_mlflow
from mlflow.entities import Param, RunTag
from mlflow.tracking import MlflowClient
from safetensors.torch import save_file

from axoexp import names
from axoexp.redact import hide_passwords_in_logs, redacted
from axoexp.tracking import open_client


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("at postgresql+psycopg2://u:p%40ss@h:5432/db is", "at postgresql+psycopg2://u:***@h:5432/db is"),
        ("http://a:b@127.0.0.1:5000 and mysql://:pw@h/db", "http://a:***@127.0.0.1:5000 and mysql://:***@h/db"),
        ("#0 : tracking.uri=postgresql\\://u\\:s3cret@h\\:1/db", "#0 : tracking.uri=postgresql\\://u\\:***@h\\:1/db"),
        ("['tracking.uri=postgresql\\\\://u\\\\:s3cret@h/db']", "['tracking.uri=postgresql\\\\://u\\\\:***@h/db']"),
        ("postgresql://u:p/ss@h/db", "postgresql://u:***@h/db"),  # SQLAlchemy reads the password p/ss
        (
            "postgresql://h/db?user=u&password=s3cret&sslmode=require",
            "postgresql://h/db?user=u&password=***&sslmode=require",
        ),
    ],
)
def test_a_uris_password_is_hidden(text: str, shown: str) -> None:
    assert redacted(text) == shown


@pytest.mark.parametrize(
    "text", ["sqlite:////tmp/a:b@c.db", "sqlite:///mlflow.db", "postgresql://u@h/db", "http://h:5000/x", "a@b: c:d@e"]
)
def test_text_without_a_password_is_left_as_it_is(text: str) -> None:
    assert redacted(text) == text


def test_log_records_hide_a_password_whatever_handles_them_and_leave_a_malformed_one_to_its_handler() -> None:
    """The record factory, not a handler's filter: a user's own logging config (or Hydra's
    ``hydra/job_logging=disabled`` and a handler of one's own) gets the hidden text too."""
    before = logging.getLogRecordFactory()  # a run in this process may have installed it already
    logging.setLogRecordFactory(logging.LogRecord)
    try:
        hide_passwords_in_logs()
        hide_passwords_in_logs()  # once only: not wrapped twice
        made = logging.getLogRecordFactory()
        assert getattr(made, "hides_passwords", False) and made is not logging.LogRecord
        record = made("hydra", logging.INFO, __file__, 1, "#%d : %s", (0, "uri=http://u:s3cret@h"), None)
        assert record.getMessage() == "#0 : uri=http://u:***@h"
        try:  # a traceback's error may quote a URI: logger.exception(...) wrote it to the job's log as it was
            raise ConnectionError("no store at postgresql://u:s3cret@h/db")
        except ConnectionError:
            failed = made("x", logging.ERROR, __file__, 1, "store %s", ("gone",), sys.exc_info())
        written = logging.Formatter().format(failed)
        assert "s3cret" not in written and "ConnectionError: no store at postgresql://u:***@h/db" in written
        assert made("x", logging.ERROR, __file__, 1, "no uri", (), (None, None, None)).exc_text is None
        assert made("x", logging.ERROR, __file__, 1, "m", (), ValueError("not a tuple")).exc_text is None, (
            "to its handler"
        )
        malformed = made("x", logging.INFO, __file__, 1, "bad %d", ("str",), None)
        with pytest.raises(TypeError):  # the handler reports it, as it would
            malformed.getMessage()
    finally:
        logging.setLogRecordFactory(before)


def test_every_value_axoexps_mlflow_client_writes_hides_a_password(tracking_uri: str, tmp_path: Path) -> None:
    """One place on the way to MLflow (RedactingClient): a run's name and tags as created, a tag, a
    param, a batch, a text and files, whoever writes them (a run, a sweep, a search, the sync); a
    value is cut to MLflow's limit only once hidden (a cut first left a password without its ``@``)."""
    secret = "postgresql://u:s3cret@h/db"
    client = open_client(tracking_uri)
    experiment = client.create_experiment("redacted")
    run = client.create_run(experiment, tags={"made": secret}, run_name=f"run on {secret}")
    run_id = run.info.run_id
    client.set_tag(run_id, "tag", secret)
    client.set_tag(run_id, "long", "x" * 7980 + secret)
    client.log_param(run_id, "param", secret)
    client.log_batch(run_id, params=[Param("batched", secret)], tags=[RunTag("batched_tag", secret)])
    client.log_text(run_id, f"uri: {secret}\n", "config.yaml")
    record = tmp_path / ".hydra"
    record.mkdir()
    (record / "overrides.yaml").write_text(f"- tracking.uri={secret}\n")
    (record / "tensor.bin").write_bytes(bytes(range(256)))  # no text: uploaded as it is
    save_file({"bank": torch.arange(4.0)}, record / "banks.safetensors")  # told by its header, not read on
    banks = (record / "banks.safetensors").read_bytes()
    (record / "cut.log").write_bytes(f"\0\0 tracking.uri={secret}\n".encode())  # a log a crash cut short: text
    client.log_artifact(run_id, str(record))
    stored = MlflowClient(tracking_uri).get_run(run_id)
    values = [stored.info.run_name, *stored.data.tags.values(), *stored.data.params.values()]
    downloaded = Path(client.download_artifacts(run_id, "", str(tmp_path / "down")))
    texts = [
        (downloaded / "config.yaml").read_text(),
        (downloaded / ".hydra" / "overrides.yaml").read_text(),
        (downloaded / ".hydra" / "cut.log").read_text(),
    ]
    assert not [value for value in [*values, *texts] if "s3cr" in value], values
    assert stored.data.params["param"] == stored.data.tags["tag"] == "postgresql://u:***@h/db"
    assert texts[1] == "- tracking.uri=postgresql://u:***@h/db\n"
    assert (downloaded / ".hydra" / "tensor.bin").read_bytes() == bytes(range(256))
    assert (downloaded / ".hydra" / "banks.safetensors").read_bytes() == banks
    assert (record / "overrides.yaml").read_text() == f"- tracking.uri={secret}\n", "the local file kept as typed"


@pytest.mark.slow
def test_a_run_and_a_sweep_on_a_database_that_does_not_answer_never_show_its_password(tmp_path: Path) -> None:
    """The run's log line, its line saying where the journal is and the sync command to upload it,
    Hydra's job line and the run's log file: all with ``***`` for the password; also through the
    console script ``axoexp``, which does not start as ``python -m axoexp`` does."""
    pytest.importorskip("psycopg2")
    uri = f"tracking.uri=postgresql+psycopg2://axo:s3cret@127.0.0.1:{free_port()}/db"
    script = Path(sys.executable).with_name("axoexp")
    commands = [[sys.executable, "-m", "axoexp"], [sys.executable, "-m", "axoexp", "-m"], [str(script), "-m"]]
    for command in commands if script.is_file() else commands[:2]:
        ended = subprocess.run(
            [*command, uri, "run.measured_updates=3"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HYDRA_FULL_ERROR": "1" if command == commands[0] else "0"},  # a traceback, too
        )
        assert ended.returncode == 1, ended.stderr
        assert "--tracking-uri postgresql+psycopg2://axo:***@127.0.0.1:" in ended.stderr, ended.stderr
        shown = ended.stdout + ended.stderr  # Hydra's failed-job line, which quoted the overrides as typed, left out
        assert "s3cret" not in shown and "axo:***@" in ended.stdout and "Error executing job" not in shown, shown
    logs = list((tmp_path / "outputs").rglob("*.log"))
    assert logs and not [log for log in logs if "s3cret" in log.read_text()]


@pytest.mark.slow
def test_a_sweep_on_a_server_whose_uri_holds_a_password_stores_it_nowhere(tmp_path: Path) -> None:
    """``tracking.uri=http://u:s3cret@HOST:PORT`` (requests sends it as basic auth): the run's params,
    its tags (the command), its config.yaml and the sweep parent's tags held the password, and so did
    result.json; Hydra's record (.hydra/, the overrides as typed) was not uploaded then. Every file
    is uploaded with it hidden."""
    port = free_port()
    (tmp_path / "server").mkdir()
    server = start_mlflow("server", tmp_path / "server", port)
    try:
        uri = f"tracking.uri=http://u:s3cret@127.0.0.1:{port}"
        ended = subprocess.run(
            [sys.executable, "-m", "axoexp", "-m", uri, "run.measured_updates=1"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ended.returncode == 0, ended.stderr
        assert "s3cret" not in ended.stdout + ended.stderr
        client = MlflowClient(f"http://127.0.0.1:{port}")
        runs = client.search_runs([client.get_experiment_by_name("axoexp").experiment_id])
        assert len(runs) == 2 and {run.data.tags.get(names.SWEEP_ROLE) for run in runs} >= {"parent"}
        for run in runs:
            stored = [*run.data.params.values(), *run.data.tags.values()]
            assert not [value for value in stored if "s3cret" in value], run.info.run_name
        child = next(run for run in runs if run.data.tags.get(names.SWEEP_ROLE) != "parent")
        assert child.data.params["tracking.uri"] == f"http://u:***@127.0.0.1:{port}"
        artifacts = {artifact.path for artifact in client.list_artifacts(child.info.run_id)}
        assert {"config.yaml", "result.json", ".hydra"} <= artifacts, artifacts
        downloaded = Path(client.download_artifacts(child.info.run_id, "", str(tmp_path / "artifacts")))
        texts = {
            str(path.relative_to(downloaded)): path.read_text()
            for path in downloaded.rglob("*")
            if path.suffix in (".yaml", ".json")
        }
        assert {"config.yaml", "result.json", ".hydra/overrides.yaml"} <= set(texts), sorted(texts)
        assert not [name for name, text in texts.items() if "s3cret" in text], sorted(texts)
        assert "u:***@127.0.0.1" in texts["config.yaml"] and "***@127.0.0.1" in texts[".hydra/overrides.yaml"]
    finally:
        server.terminate()
        server.wait(timeout=60)
