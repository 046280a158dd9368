"""Refused early, for real: a store that cannot be written and a checkpoint that cannot be
read or fails its pin are found while planning, before any MLflow run exists."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from axoexp.components.population import sha256_of
from axoexp.errors import ConfigError
from axoexp.experiment import run_experiment
from axoexp.plan import plan_experiment


def _no_runs(client: MlflowClient) -> bool:
    experiment = client.get_experiment_by_name("axoexp")
    return experiment is None or client.search_runs([experiment.experiment_id]) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_store_in_a_pseudo_file_system_is_refused_while_planning(make_config: Callable) -> None:
    with pytest.raises(
        ConfigError, match=r"tracking.uri=sqlite:////proc/x.db: no file can be created in /proc; choose a writable"
    ):
        plan_experiment(make_config("tracking.uri=sqlite:////proc/x.db"))


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "lite.pt"
    path.write_bytes(b"planning reads and hashes the file, it does not unpickle it")
    return path


@pytest.mark.parametrize(
    "override, message",
    [
        ("population.checkpoint_sha256=00ff", r"has SHA-256 [0-9a-f]{64}, but population.checkpoint_sha256 pins 00ff"),
        ("population.checkpoint=/nonexistent/lite.pt", r"population.checkpoint='/nonexistent/lite.pt' is not a file"),
        ("population.checkpoint=/" + "x" * 100000, r"\(100001 characters\)' cannot be read: File name too long"),
    ],
)
def test_a_checkpoint_that_cannot_be_used_makes_no_run(
    make_config: Callable, client: MlflowClient, checkpoint: Path, override: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run_experiment(make_config(f"population.checkpoint={checkpoint}", override, "run.measured_updates=1"))
    assert _no_runs(client), "the refusal left a run behind"


def test_a_pinned_readable_checkpoint_passes_planning(make_config: Callable, checkpoint: Path) -> None:
    plan = plan_experiment(
        make_config(f"population.checkpoint={checkpoint}", f"population.checkpoint_sha256={sha256_of(checkpoint)}")
    )
    assert plan.device == torch.device("cpu")
