"""Sweeps: one MLflow parent run per Hydra multirun, each job a child of it, and resume.

The parent run id reaches every job as part of the job's own config: the callback appends
the override ``sweep.parent_run_id=<id>`` to the sweep's overrides before the sweeper reads
them, so it survives any launcher (other processes, remote Ray workers, containers).
Hydra calls ``on_multirun_end`` only when every job succeeded; when a job fails, the
process exits through ``sys.exit(1)`` instead, so the parent is also ended from an
``atexit`` hook, FAILED, with the count of children that did not finish.

A stop signal (SIGTERM, SIGHUP, Ctrl-C) to the sweep is passed on to the launcher's worker
processes; the sweep waits a few seconds for their runs to end KILLED, ends any left RUNNING
itself, removes the workers and ends the parent KILLED. Each sweep claims its own output
directory, also when two start in the same second.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, cast

import torch
from hydra.experimental.callback import Callback
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from axoexp import metadata, names, processes, signals
from axoexp.describe import sweep_run_name
from axoexp.errors import StoreError
from axoexp.journal import process_tags
from axoexp.outputs import claim_directory
from axoexp.plan import resume_mode
from axoexp.sync import end_dead_run, process_gone
from axoexp.tracking import (
    UNREACHABLE,
    child_runs,
    configure_tracking,
    experiment_id,
    open_client,
    store_lock,
    store_problem,
    with_mlflow_context,
)

PARENT_FILE = "mlflow_parent_run_id"
PARENT_OVERRIDE_KEY = "sweep.parent_run_id"
REPEAT_OVERRIDE_KEY = "sweep.repeat"
RESUME_CANDIDATES = 200  # newest FINISHED runs of a job's result key looked at for reuse
WORKER_GRACE_S = 10.0
"""How long a stopped sweep waits for its workers to end their runs (SLURM's grace is 30 s)."""

log = logging.getLogger(__name__)


def sweep_definition(overrides: list[str]) -> str:
    """What a sweep measures: SHA-256 of its overrides in any order, without those that say
    where results go or how runs are watched (``tracking.*``, ``sweep.*``, ``run.progress``)."""
    measured = sorted(o for o in overrides if not o.lstrip("+~").startswith(names.NOT_MEASUREMENT_PARAM_PREFIXES))
    return hashlib.sha256("\n".join(measured).encode()).hexdigest()


class MlflowSweepCallback(Callback):
    """Opens the sweep's parent run on multirun start and ends it honestly."""

    def __init__(self) -> None:
        self.client: MlflowClient | None = None
        self.parent_run_id: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        uri = configure_tracking(config.tracking)
        overrides = list(config.hydra.overrides.task)
        sweep_dir = claim_sweep_dir(config)
        with read_write(config.hydra.overrides), open_dict(config.hydra.overrides):
            add_repeats(config)  # also without a parent run
        problem = store_problem(uri)
        if problem:  # each job then refuses to run, naming it too
            log.error("the sweep has no parent run: %s", problem)
            return
        try:
            client = open_client(uri)
            with store_lock(uri):
                run = client.create_run(
                    experiment_id(client, config.tracking.experiment),
                    run_name=sweep_run_name(overrides),
                    tags=with_mlflow_context(
                        {
                            names.SWEEP_ROLE: "parent",
                            names.SWEEP_DIR: str(sweep_dir.resolve()),
                            names.SWEEP_OVERRIDES: " ".join(overrides),
                            names.SWEEP_DEFINITION: sweep_definition(overrides),
                            names.COMMAND: " ".join(sys.argv),
                            **process_tags(),
                            **metadata.source_tags(metadata.HYDRA_APP_SOURCE),
                        }
                    ),
                )
        except StoreError as error:  # e.g. a fresh store on a full disk; each job then says so too
            log.error("the sweep has no parent run: %s", error)
            return
        except UNREACHABLE as error:
            log.error("MLflow tracking at %s is unreachable, so the sweep has no parent run: %s", uri, error)
            return
        self.client, self.parent_run_id = client, run.info.run_id
        with read_write(config.hydra.overrides), open_dict(config.hydra.overrides):
            config.hydra.overrides.task.append(f"{PARENT_OVERRIDE_KEY}={self.parent_run_id}")
        (sweep_dir / PARENT_FILE).write_text(self.parent_run_id + "\n")
        atexit.register(self.end_parent, all_jobs_returned=False)
        signals.install(before_raising=self.stop_workers)

    def stop_workers(self, signal_name: str) -> None:
        """Pass the stop on to the launcher's workers and give their runs time to end KILLED;
        then end what is left and remove the workers (a launcher would kill them outright)."""
        workers = _workers()
        if not workers or self.client is None or self.parent_run_id is None:
            return
        print(
            f"axoexp: {signal_name}: stopping {len(workers)} worker processes, "
            f"waiting up to {WORKER_GRACE_S:.0f} s for their runs to end",
            file=sys.stderr,
            flush=True,
        )
        _signal_all(workers, signal.SIGTERM)
        deadline = time.monotonic() + WORKER_GRACE_S
        while time.monotonic() < deadline and self._running_children():
            time.sleep(0.2)
        _signal_all(_workers(), signal.SIGKILL)

    def _running_children(self) -> list[Run]:
        """Children still RUNNING whose process may yet end them; those whose process is gone are ended."""
        assert self.client is not None and self.parent_run_id is not None
        running = []
        for child in child_runs(self.client, self.client.get_run(self.parent_run_id)):
            if child.info.status != "RUNNING":
                continue
            if process_gone(child.data.tags):
                end_dead_run(
                    self.client,
                    child.info.run_id,
                    f"its worker process ended before the run did (the sweep was stopped by {signals.received()})",
                )
            else:
                running.append(child)
        return running

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.end_parent(all_jobs_returned=True)

    def end_parent(self, *, all_jobs_returned: bool) -> None:
        """FINISHED if every job returned and every child run finished, else FAILED."""
        if self.client is None or self.parent_run_id is None:
            return
        client, parent = self.client, self.parent_run_id
        self.parent_run_id = None
        parent_run = client.get_run(parent)
        stopped_by = signals.received()
        for child in child_runs(client, parent_run):
            if child.info.status == "RUNNING" and (stopped_by or process_gone(child.data.tags)):
                end_dead_run(
                    client,
                    child.info.run_id,
                    f"the sweep was stopped ({stopped_by or 'its job failed'}) before this run ended",
                )
        children = child_runs(client, parent_run)
        print_reuse(client, parent_run, len(children))
        unfinished = [child for child in children if child.info.status != "FINISHED"]
        refused = [key for key in parent_run.data.tags if key.startswith(names.REFUSED_PREFIX)]
        if all_jobs_returned and not unfinished and not refused and not stopped_by:
            client.set_terminated(parent, status="FINISHED")
            return
        reason = f"{len(unfinished)} of {len(children)} child runs did not finish"
        if refused:
            reason += f"; {len(refused)} jobs were refused before creating a run (tags {names.REFUSED_PREFIX}*)"
        if stopped_by:
            reason = f"interrupted by {stopped_by}; {reason}"
        elif not all_jobs_returned and not refused:
            reason += "; a job failed or the sweep was interrupted"
        client.set_tag(parent, names.FAILURE, reason)
        client.set_terminated(parent, status="KILLED" if stopped_by else "FAILED")


def claim_sweep_dir(config: DictConfig) -> Path:
    """Create the sweep's directory, or a ``-2``, ``-3``... sibling if another sweep has it
    (two sweeps started in one second would otherwise overwrite each other's files)."""
    base = Path(str(config.hydra.sweep.dir))
    candidate = claim_directory(base)
    if candidate != base:  # the launcher composes each job from these overrides
        with read_write(config.hydra), open_dict(config.hydra):
            config.hydra.sweep.dir = str(candidate)
            config.hydra.overrides.hydra.append(f"hydra.sweep.dir='{candidate}'")
    return candidate


def _workers() -> list[int]:
    """This process's descendants but a launcher's resource tracker, which ends by itself
    with this process (killing it only makes the launcher start another)."""
    return [pid for pid in processes.descendants() if "resource_tracker" not in processes.command_line(pid)]


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def add_repeats(config: DictConfig) -> None:
    """``sweep.repeats=N``: the sweep gets the override ``sweep.repeat=0,...,N-1``, first, so the
    sweeper varies it slowest: every job runs once, then every job again, and drift during the
    sweep hits every job alike. Each repetition is a child run of its own (param ``sweep.repeat``)."""
    repeats = int(config.sweep.repeats)
    task = config.hydra.overrides.task
    if repeats > 1 and not any(str(item).lstrip("+~").startswith(f"{REPEAT_OVERRIDE_KEY}=") for item in task):
        task.insert(0, f"{REPEAT_OVERRIDE_KEY}={','.join(map(str, range(repeats)))}")


def note_refused_job(config: DictConfig, job_number: int, job_name: str, error: Exception) -> None:
    """Record on the parent a job that failed before creating its run (e.g. a bad value)."""
    if not config.sweep.parent_run_id:
        return
    try:
        open_client(configure_tracking(config.tracking)).set_tag(
            config.sweep.parent_run_id, f"{names.REFUSED_PREFIX}job{job_number}", f"{job_name}: {error}"[:5000]
        )
    except UNREACHABLE as unreachable:
        log.error("could not record the refused job %s on the parent run: %s", job_name, unreachable)


def result_key(config: DictConfig) -> str:
    """What determines this job's result (:func:`axoexp.metadata.result_key`): config, code,
    plugins, package versions, device."""
    container = cast(dict[str, Any], OmegaConf.to_container(config, resolve=True))
    return metadata.result_key(torch.device(str(config.device)), container)


def reused_run(config: DictConfig, job_number: int) -> Run | None:
    """Resume: the earlier run this job can reuse, recorded on the sweep's parent.

    A run qualifies if it FINISHED with every metric finite, has this job's :func:`result_key`
    (tag ``axoexp.result_key``: config, code, plugins, package versions, device) and this
    ``sweep.repeat``, and, with ``sweep.resume=same_sweep`` (the default), is a job of an
    earlier sweep with the same definition (:func:`sweep_definition`): a single run or another
    sweep's job is reused only with ``sweep.resume=any``. ``None`` with ``sweep.resume=false``,
    outside a sweep, or when nothing qualifies; the job then runs.
    """
    mode = resume_mode(config.sweep.resume)
    parent_id = config.sweep.parent_run_id
    if mode in (None, "false") or not parent_id:
        return None
    try:
        client = open_client(configure_tracking(config.tracking))
        run = _newest_reusable(
            client, config.tracking.experiment, result_key(config), parent_id, mode, config.sweep.repeat
        )
        if run is not None:
            client.set_tag(parent_id, f"{names.REUSED_PREFIX}job{job_number}", run.info.run_id)
    except UNREACHABLE:
        return None
    return run


def _newest_reusable(
    client: MlflowClient, experiment: str, key: str, parent_id: str, mode: str, repeat: int
) -> Run | None:
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    finished = (
        f"tags.`{names.RESULT_KEY}` = '{key}' and attributes.status = 'FINISHED' "
        f"and params.`{names.SWEEP_REPEAT_PARAM}` = '{repeat}'"
    )
    candidates = [
        run
        for run in client.search_runs(
            [found.experiment_id],
            filter_string=finished,
            order_by=["attributes.start_time DESC"],
            max_results=RESUME_CANDIDATES,
        )
        if all(math.isfinite(value) for value in run.data.metrics.values())
    ]
    if mode == "any":
        return next(iter(candidates), None)
    definition = client.get_run(parent_id).data.tags.get(names.SWEEP_DEFINITION)
    if definition is None:
        return None
    same_sweeps = {
        run.info.run_id
        for run in client.search_runs(
            [found.experiment_id], filter_string=f"tags.`{names.SWEEP_DEFINITION}` = '{definition}'"
        )
    } - {parent_id}
    return next((run for run in candidates if run.data.tags.get(names.PARENT_RUN_ID) in same_sweeps), None)


def print_reuse(client: MlflowClient, parent: Run, children: int) -> None:
    """Say how many jobs reused earlier runs, and from which sweeps: ``reused k of n jobs from ...``."""
    reused = [value for key, value in parent.data.tags.items() if key.startswith(names.REUSED_PREFIX)]
    if not reused:
        return
    refused = sum(key.startswith(names.REFUSED_PREFIX) for key in parent.data.tags)
    sources = []
    for run_id in dict.fromkeys(client.get_run(run_id).data.tags.get(names.PARENT_RUN_ID) for run_id in reused):
        sources.append(f"'{client.get_run(run_id).info.run_name}' ({run_id})" if run_id else "single runs")
    print(
        f"reused {len(reused)} of {len(reused) + children + refused} jobs from {', '.join(sources)} "
        "(sweep.resume=false re-measures)",
        flush=True,
    )
