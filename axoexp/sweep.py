"""Sweeps: one MLflow parent run per Hydra multirun, each job a child of it, and resume.

Hydra calls ``on_multirun_end`` only when every job succeeded; when a job fails, the
process exits through ``sys.exit(1)`` instead, so the parent is also ended from an
``atexit`` hook, FAILED, with the count of children that did not finish.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf

from axoexp.experiment import configure_tracking
from axoexp.tracking import (
    CONFIG_HASH_TAG, FAILURE_TAG, PARENT_TAG, UNREACHABLE, config_digest, experiment_id, newest_run,
)

PARENT_ENV = "AXOEXP_PARENT_RUN_ID"
"""Carries the parent run id to the jobs (inherited by launcher worker processes)."""
PARENT_FILE = "mlflow_parent_run_id"
SWEEP_TAG = "axoexp.sweep"
REUSED_PREFIX = "axoexp.reused."

log = logging.getLogger(__name__)


def child_runs(client: MlflowClient, parent: Run) -> list[Run]:
    """The runs whose ``mlflow.parentRunId`` is ``parent``."""
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")


class MlflowSweepCallback(Callback):
    """Opens the sweep's parent run on multirun start and ends it honestly."""

    def __init__(self) -> None:
        self.client: MlflowClient | None = None
        self.parent_run_id: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        uri = configure_tracking(config)
        overrides = list(config.hydra.overrides.task)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        client = MlflowClient(tracking_uri=uri)
        try:
            run = client.create_run(
                experiment_id(client, config.tracking.experiment),
                run_name="sweep " + (" ".join(overrides) or "(no overrides)"),
                tags={SWEEP_TAG: "parent", "sweep.dir": str(sweep_dir.resolve()),
                      "sweep.overrides": " ".join(overrides), "command": " ".join(sys.argv),
                      "process.pid": str(os.getpid())},
            )
        except UNREACHABLE as error:
            log.error("MLflow tracking at %s is unreachable, so the sweep has no parent run: %s", uri, error)
            return
        self.client, self.parent_run_id = client, run.info.run_id
        os.environ[PARENT_ENV] = self.parent_run_id
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(self.parent_run_id + "\n")
        atexit.register(self.end_parent, all_jobs_returned=False)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.end_parent(all_jobs_returned=True)

    def end_parent(self, *, all_jobs_returned: bool) -> None:
        """FINISHED if every job returned and every child run finished, else FAILED."""
        if self.client is None or self.parent_run_id is None:
            return
        client, parent = self.client, self.parent_run_id
        self.parent_run_id = None
        children = child_runs(client, client.get_run(parent))
        unfinished = [child for child in children if child.info.status != "FINISHED"]
        if all_jobs_returned and not unfinished:
            client.set_terminated(parent, status="FINISHED")
            return
        reason = f"{len(unfinished)} of {len(children)} child runs did not finish"
        if not all_jobs_returned:
            reason += "; a job failed (perhaps before creating its run) or the sweep was interrupted"
        client.set_tag(parent, FAILURE_TAG, reason)
        client.set_terminated(parent, status="FAILED")


def reusable_run(config: DictConfig, tracking_uri: str) -> str | None:
    """The newest FINISHED run with this resolved config's digest, if the store has one."""
    container = OmegaConf.to_container(config, resolve=True)
    assert isinstance(container, dict)
    try:
        run = newest_run(MlflowClient(tracking_uri=tracking_uri), config.tracking.experiment,
                         f"tags.`{CONFIG_HASH_TAG}` = '{config_digest(container)}' "
                         "and attributes.status = 'FINISHED'")
    except UNREACHABLE:
        return None
    return run.info.run_id if run else None


def note_reuse(tracking_uri: str, parent_run_id: str | None, job_number: int, run_id: str) -> None:
    """Record on the parent that job ``job_number``'s result is an earlier run (the report uses it)."""
    if parent_run_id is not None:
        MlflowClient(tracking_uri=tracking_uri).set_tag(parent_run_id, f"{REUSED_PREFIX}job{job_number}", run_id)
