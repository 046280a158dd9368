"""Sweeps: one MLflow parent run per Hydra multirun, each job a child of it, and resume.

Before the parent exists, every job of the basic sweeper is composed and planned: a sweep with
a job whose config cannot be composed (Hydra would start none of its jobs), whose every job is
refused, or whose launcher cannot run here, ends with one line and exit 2, creating no run.

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
import re
import shutil
import signal
import socket
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from hydra.experimental.callback import Callback
from hydra.plugins.launcher import Launcher
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from axoexp import collector, metadata, names, processes, signals
from axoexp.describe import sweep_run_name
from axoexp.errors import (
    AxoexpError,
    ConfigError,
    StoreError,
    SweepRefusedError,
    TrackingUnavailableError,
    first_line,
)
from axoexp.job_process import SWEEP_PROCESS_ENV, sweep_process_marker
from axoexp.journal import JOURNAL_FILE, START, TRACKING_LOST, first_record, journal_end, process_tags
from axoexp.outputs import claim_directory
from axoexp.plan import resume_mode
from axoexp.redact import redacted
from axoexp.registry import GROUPS, REGISTRY, Component
from axoexp.statistics import doubts
from axoexp.stdout import plural, print_out, say
from axoexp.sweep_plan import RAY_ADDRESS_KEY, launcher_target, plan_jobs, ray_address
from axoexp.sync import end_dead_run, find_journals, process_gone, sync_journal
from axoexp.tracking import (
    UNREACHABLE,
    child_runs,
    config_digest,
    configure_tracking,
    experiment_id,
    open_client,
    store_failure,
    store_lock,
    store_problem,
    store_unreachable,
    tracking_uri_key,
    with_mlflow_context,
)
from axoexp.versions import version_tags

PARENT_FILE = "mlflow_parent_run_id"
PARENT_OVERRIDE_KEY = "sweep.parent_run_id"
REPEAT_OVERRIDE_KEY = "sweep.repeat"
JOB_FAILED_OR_STOPPED = "a job failed or the sweep was interrupted"  # Hydra's multirun says no more
NEW = "new"  # resume's reason for a job with no earlier run of its config
SAME_SWEEPS = "in an earlier sweep of the same jobs"  # where sweep.resume=same_sweep looks
RESUME_CANDIDATES = 200  # newest runs of a job's result key looked at for reuse
RAY_NOT_FOUND = "Could not find any running Ray instance"  # how ray.init says no instance is at its address
WORKER_GRACE_S = 10.0
"""How long a stopped sweep waits for its workers to end their runs (SLURM's grace is 30 s)."""

log = logging.getLogger(__name__)
_running: list[MlflowSweepCallback] = []
"""The sweep this process runs, once started: the command's last line is its (:func:`failed`)."""


def sweep_definition(overrides: list[str], job_configs: list[str] | None = None) -> str:
    """What a sweep measures: SHA-256 of its jobs' resolved configs (``job_configs``: each job's
    :func:`~axoexp.tracking.config_digest`, in any order, each once), where the sweeper's jobs are
    known up front (the basic sweeper), so ``+experiment=sweep_cpu`` and the same overrides
    spelled out are one sweep; else of its overrides in any order, without those that say where
    results go or how runs are watched (``tracking.*``, ``sweep.*``, ``run.progress``)."""
    if job_configs:
        return hashlib.sha256("\n".join(sorted(set(job_configs))).encode()).hexdigest()
    measured = sorted(o for o in overrides if not names.is_bookkeeping(o))
    return hashlib.sha256("\n".join(measured).encode()).hexdigest()


class MlflowSweepCallback(Callback):
    """Opens the sweep's parent run on multirun start and ends it honestly."""

    def __init__(self) -> None:
        self.client: MlflowClient | None = None
        self.parent_run_id: str | None = None
        self.parent_created: Run | None = None  # as created: the start of a kept end when the store fails
        self.refused: dict[int, str] = {}  # the jobs planning refused, by number
        self.uri = self.sweep_dir = self.experiment = ""
        self.decided = False  # the parent's end was decided: written, or kept in the sweep's folder
        self.kept_end = ""  # the end the sweep decided but could not write, as its last line says it
        self.jobs = 0  # how many jobs the sweep has, where known up front (the basic sweeper); else 0
        self.ray_address: str | None = None  # a Ray launcher's hydra.launcher.ray.init.address, if it is one
        self.launcher = ""  # hydra/launcher=NAME, as the sweep's lines name it
        self.launcher_target = ""  # its class (launcher_target)
        self.failure = ""  # why the launcher failed (:func:`failed`): the parent's reason, which no run gives

    def _say_refused(self, tags: Mapping[str, str] | None = None) -> None:
        """Each refused job, a line each, in job order: those planning refused (said as the sweep starts
        and again at its end) and, from the parent's ``tags`` at the end, those refused only as they ran
        (on a cluster's node, which judged what it has)."""
        lines = {number: f"refused {line}" for number, line in self.refused.items()}
        for key, value in (tags or {}).items():
            number = key.rpartition(".job")[2]
            if key.startswith(names.REFUSED_PREFIX) and number.isdigit():
                job, _, why = value.partition(": ")
                lines.setdefault(int(number), f"refused job {number} ({job}): {why}")
        for _, line in sorted(lines.items()):
            say("axoexp", line)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        collector.release()  # the command line's start-up done: the sweep's process may live for hours
        os.environ[SWEEP_PROCESS_ENV] = sweep_process_marker()  # job processes elsewhere die with this one
        uri = configure_tracking(config.tracking)
        overrides = list(config.hydra.overrides.task)
        try:  # before any run exists: no empty parent. Hydra turns a callback's exception into a warning
            check_launcher(config)
            if str(config.hydra.sweeper.get("_target_", "")).endswith("OptunaSweeper"):
                from axoexp.search import check_sweeper  # Optuna is an extra: imported for its sweeper only

                check_sweeper(config)
            self.refused, job_configs = plan_jobs(config)
        except SweepRefusedError as error:
            say("axoexp", error)
            raise SystemExit(error.exit_code) from None
        if self.refused:  # said now, while the user can still stop the sweep, and again at its end
            say(
                "axoexp",
                f"{len(self.refused)} of {len(job_configs)} jobs cannot run and will create no run; "
                "the others run, and the sweep will end FAILED:",
            )
            self._say_refused()
        if signals.interrupted_outside_a_run():  # caught by a library as modules imported: no sweep starts
            raise KeyboardInterrupt
        sweep_dir = claim_sweep_dir(config)
        with read_write(config.hydra.overrides), open_dict(config.hydra.overrides):
            runs_each = add_repeats(config)  # also without a parent run
        _running[:] = [self]
        self.uri, self.sweep_dir, self.experiment = uri, str(sweep_dir.resolve()), str(config.tracking.experiment)
        self.jobs = len(job_configs) * runs_each
        self.ray_address = ray_address(config)
        self.launcher = f"hydra/launcher={config.hydra.runtime.choices.get('hydra/launcher', 'basic')}"
        self.launcher_target = launcher_target(config)
        problem = store_problem(uri, tracking_uri_key(config.tracking.uri))
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
                            names.SWEEP_DEFINITION: sweep_definition(overrides, job_configs),
                            names.COMMAND: metadata.command_line(),
                            **process_tags(),
                            **metadata.source_tags(metadata.HYDRA_APP_SOURCE),
                        }
                    ),
                )
        except StoreError as error:  # e.g. a fresh store on a full disk; each job then says so too
            log.error("the sweep has no parent run: %s", error)
            return
        except UNREACHABLE as error:
            log.error("the sweep has no parent run: %s", store_unreachable(uri, error))
            return
        self.client, self.parent_run_id, self.parent_created = client, run.info.run_id, run
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
        own = [pid for pid in processes.descendants(recursive=False) if pid in workers]  # theirs are not workers
        say(
            "axoexp",
            f"{signal_name}: stopping {plural(len(own), 'worker')}, "
            f"waiting up to {WORKER_GRACE_S:.0f} s for their runs to end",
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
                _end_dead_child(
                    self.client,
                    child,
                    f"its worker process ended before the run did (the sweep was stopped by {signals.received()})",
                )
            else:
                running.append(child)
        return running

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.end_parent(all_jobs_returned=True)

    def end_parent(self, *, all_jobs_returned: bool) -> None:
        """FINISHED if every job returned and every child run finished, else FAILED. If the store
        fails meanwhile (a full disk, a lock), one line says so and how to end the runs later: the
        sync it names ends the children from their journals and the parent with the end the sweep kept
        in its folder (:meth:`_keep_end`): the one it decided, or, where the store failed before the
        sweep could read its runs, FAILED (KILLED if it was stopped) saying so."""
        if self.client is None or self.parent_run_id is None or self.parent_created is None:
            return
        client, parent = self.client, self.parent_run_id
        self.parent_run_id = None
        try:
            self._end_parent(client, parent, all_jobs_returned)
        except UNREACHABLE as error:
            if not self.decided:
                stopped_by = signals.received()
                reason = "its runs could not be read as it ended, so whether they finished is not known; " + (
                    "every job returned" if all_jobs_returned else self.failure or JOB_FAILED_OR_STOPPED
                )
                self._keep_end(
                    self.parent_created,
                    "KILLED" if stopped_by else "FAILED",
                    f"{signals.interrupted_by(stopped_by)}; {reason}" if stopped_by else reason,
                    error,
                )
            say(
                "axoexp",
                f"the sweep could not end its MLflow runs: {store_unreachable(self.uri, error)}; "
                f"{self.kept_end}once the store is back, end them with: python -m axoexp.sync {self.sweep_dir} "
                f"--tracking-uri {self.uri}",
            )

    def _end_parent(self, client: MlflowClient, parent: str, all_jobs_returned: bool) -> None:
        parent_run = client.get_run(parent)
        stopped_by = signals.received()
        lost: Exception | None = None
        for child in child_runs(client, parent_run):
            if child.info.status == "RUNNING" and (stopped_by or process_gone(child.data.tags)):
                try:
                    _end_dead_child(
                        client, child, f"the sweep was stopped ({stopped_by or 'its job failed'}) before this run ended"
                    )
                except UNREACHABLE as error:  # it stays RUNNING, so unfinished; the sync ends it from its journal
                    lost = error
        children = child_runs(client, parent_run)
        print_reuse(client, parent_run, len(children), stopped=bool(stopped_by))
        self._say_refused(parent_run.data.tags)
        unfinished = [child for child in children if child.info.status != "FINISHED"]
        refused = [key for key in parent_run.data.tags if key.startswith(names.REFUSED_PREFIX)]
        died = {
            key.removeprefix(names.DIED_PREFIX): value
            for key, value in parent_run.data.tags.items()
            if key.startswith(names.DIED_PREFIX)
        }
        if all_jobs_returned and not unfinished and not refused and not died and not stopped_by:
            self._terminate(client, parent_run, "FINISHED", None)
            return
        missing = self._unfinished(children, unfinished, parent_run.data.tags)
        parts = [missing] if missing else []
        if refused:
            jobs = f"{len(refused)} job{'s were' if len(refused) != 1 else ' was'}"
            parts.append(f"{jobs} refused before creating a run (tags {names.REFUSED_PREFIX}*)")
        parts += [f"{job} died: {how}" for job, how in sorted(died.items())]
        if stopped_by:
            parts.insert(0, signals.interrupted_by(stopped_by))
        elif not all_jobs_returned and not refused and not died:
            parts.append(self.failure or JOB_FAILED_OR_STOPPED)
        reason = "; ".join(parts)
        status = "KILLED" if stopped_by else "FAILED"
        self._terminate(client, parent_run, status, reason)
        for child in sorted(
            unfinished, key=lambda run: str(run.info.run_name)
        ):  # not only the first error Hydra raised
            why = child.data.tags.get(names.FAILURE, "no reason recorded")
            say("axoexp", f"{child.info.run_name}: {child.info.status}: {why}")
        say("axoexp", f"the sweep ended {status}: {reason}")
        if lost is not None:
            raise lost

    def _unfinished(self, children: list[Run], unfinished: list[Run], tags: dict[str, str]) -> str:
        """``1 of 3 jobs did not finish (00 eager ...), 2 never started``; where the number of jobs is not
        known up front (another sweeper), ``1 of 2 child runs did not finish (...)``; "" if nothing is missing."""
        never = self.jobs - _jobs_begun(children, tags) if self.jobs else 0
        which = ", ".join(sorted(str(child.info.run_name) for child in unfinished))
        total = plural(self.jobs, "job") if self.jobs else f"{len(children)} child runs"
        if not unfinished:  # never "0 of 3 jobs did not finish", which says nothing
            return f"{never} of {total} never started" if never > 0 else ""
        return f"{len(unfinished)} of {total} did not finish ({which}){f', {never} never started' if never > 0 else ''}"

    def launcher_failure(self, error: BaseException) -> str | None:
        """Why the launcher failed, where the error says it and no run could: a Ray launcher with no
        instance at its set address; an error raised out of another party's launcher's ``launch``, not
        by a job (e.g. ``sbatch`` refusing the job array, a job SLURM killed), with the job's log where
        the error names one. Hydra's own launcher and axoexp's run the jobs here: what they raise is a
        bug's, or a file's that cannot be written, which has a line of its own."""
        ray_said = (str(error).strip().splitlines() or [""])[0].partition(". ")[0]
        if isinstance(error, ConnectionError) and self.ray_address is not None and ray_said.startswith(RAY_NOT_FOUND):
            return (
                f"no Ray instance at {RAY_ADDRESS_KEY}={self.ray_address}: {ray_said}; start one there "
                f"(ray start --head) or drop {RAY_ADDRESS_KEY} to start a local one"
            )
        ours = self.launcher_target.endswith(names.BASIC_LAUNCHER) or self.launcher_target.startswith(
            names.POOL_LAUNCHER
        )
        a_file = isinstance(error, OSError) and error.filename is not None
        if ours or a_file or isinstance(error, AxoexpError) or not _raised_by_launcher(error):
            return None
        log = JOB_LOG.search(str(error))
        return f"{self.launcher} failed to launch or collect the jobs: {first_line(error)}" + (
            f" (the job's log: {log.group()})" if log else ""
        )

    def unsynced_line(self, error: BaseException) -> str | None:
        """Where jobs could not reach the store (``error``, the one that ended the sweep, says so), the
        sweep's last line: every journal to upload, not only the first failed job's; else ``None``."""
        lost = unsynced_journals(Path(self.sweep_dir)) if isinstance(error, TrackingUnavailableError) else {}
        if not lost:
            return None
        reason = next(iter(lost.values())).splitlines()[0]  # a journal of an older axoexp kept the whole error
        jobs = f"{len(lost)} of {plural(self.jobs, 'job')}" if self.jobs else plural(len(lost), "job")
        return (
            f"MLflow tracking at {self.uri} {store_failure(reason)} ({reason}); the results of {jobs} are only "
            f"in their journals under {self.sweep_dir}; upload them all with: "
            f"python -m axoexp.sync {self.sweep_dir} --tracking-uri {self.uri}"
        )

    def _terminate(self, client: MlflowClient, parent: Run, status: str, reason: str | None) -> None:
        """End the parent run ``status`` (``reason`` in ``axoexp.failure``); where the store fails, keep
        that end (:meth:`_keep_end`). A job whose run only the sync completes still failed in the
        sweep (its exit status said so), so the parent stays FAILED, its reason naming the job and the
        store's fault."""
        self.decided = True
        try:
            if reason is not None:
                client.set_tag(parent.info.run_id, names.FAILURE, reason)
            client.set_terminated(parent.info.run_id, status=status)
        except UNREACHABLE as error:
            self._keep_end(parent, status, reason, error)
            raise

    def _keep_end(self, parent: Run, status: str, reason: str | None, error: BaseException) -> None:
        """Keep the parent's end in the sweep's folder (:func:`~axoexp.journal.journal_end`), the
        store's fault added to its reason, and say it in the sweep's last line: the sweep's process
        was not killed, so the sync that line names writes this end, not KILLED."""
        self.decided = True
        decided = f"it ended {status}{f': {reason}' if reason else ''}"
        if reason is not None:
            reason += f"; the store failed as the sweep ended ({store_unreachable(self.uri, error)})"
        folder = Path(self.sweep_dir)
        lost = journal_end(
            folder, parent, experiment=self.experiment, tracking_uri=self.uri, status=status, reason=reason
        )
        self.kept_end = (
            f"{decided} (kept in {folder / JOURNAL_FILE} for the sync); "
            if lost is None
            else f"{decided}, which its folder could not keep ({lost}): the sync will end the parent KILLED; "
        )


LAUNCHER_NEEDS = {names.SLURM_LAUNCHER: ("srun", "slurm", "SLURM")}
"""A launcher's class name: the command it needs on PATH, its preset and what provides the command."""


def check_launcher(config: DictConfig) -> None:
    """Refuse, in one line and before any run exists, a launcher that cannot work on this machine."""
    target = launcher_target(config)
    for launcher, (command, preset, provider) in LAUNCHER_NEEDS.items():
        if target.endswith(launcher) and shutil.which(command) is None:
            raise SweepRefusedError(
                f"hydra/launcher={preset} needs {provider}, but {command!r} is not on PATH here; "
                "start the sweep on a machine that has it, or use hydra/launcher=parallel or the default launcher"
            )
    if target.startswith(names.POOL_LAUNCHER) and config.hydra.launcher.n_jobs < 1:
        jobs = config.hydra.launcher.n_jobs
        raise SweepRefusedError(f"hydra.launcher.n_jobs={jobs}: must be at least 1 (the worker processes of the sweep)")
    if target.endswith(names.JOBLIB_LAUNCHER) and config.hydra.launcher.n_jobs == 0:
        raise SweepRefusedError(
            "hydra.launcher.n_jobs=0: joblib runs no job on 0 workers; choose 1 or more, or -1 for one per CPU "
            "(-2 for all but one, and so on)"
        )
    address = ray_address(config)
    if address is not None:
        unreachable = _ray_unreachable(str(address))
        if unreachable:
            raise SweepRefusedError(
                f"{RAY_ADDRESS_KEY}={address}: no Ray instance answers there ({unreachable}); start one there "
                f"(ray start --head --port=PORT) or drop {RAY_ADDRESS_KEY} to start a local one"
            )


RAY_CONNECT_TIMEOUT_S = 5.0
"""How long the sweep waits for a Ray head's port to accept, before any run exists."""


def _ray_unreachable(address: str) -> str | None:
    """Why nothing answers at a Ray head's ``HOST:PORT`` (also ``ray://HOST:PORT``), in the operating
    system's words; None where it accepts a connection, or where the address names no port
    (``auto``: Ray finds its instance itself). Ray's own connection retries for minutes in silence."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 address: [::1]:6379
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    return None


JOB_LOG = re.compile(r"\S+_log\.err\b")
"""A job's error log, as submitit names it in the error of a job that failed or was killed."""


def _raised_by_launcher(error: BaseException) -> bool:
    """Whether ``error`` came out of a Hydra launcher's ``launch`` (submitting the jobs or collecting
    them), not out of a job: a job's own error comes back as its result, raised later by Hydra."""
    frame = error.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if code.co_name == "launch" and isinstance(frame.tb_frame.f_locals.get("self"), Launcher):
            return True
        frame = frame.tb_next
    return False


def began() -> bool:
    """Whether this process began a sweep (its runs may exist, whatever ends it)."""
    return bool(_running)


_refusals: list[ConfigError] = []
"""The refusals this process's jobs raised (:func:`note_refusal`), which Hydra raises again once the
sweep's last job has run."""


def note_refusal(error: ConfigError) -> None:
    """Remember that one of this process's jobs was refused with ``error``: the sweep's end lists it."""
    _refusals.append(error)


def lists_refusal(error: BaseException) -> bool:
    """Whether ``error`` is a job's refusal (:func:`note_refusal`) in a sweep that has a parent run,
    whose end lists each refused job with why before its last line: it needs no line of its own
    after them (it was the first refused job's line again, without its job)."""
    return bool(_running) and _running[0].parent_run_id is not None and any(error is job for job in _refusals)


def failed(error: BaseException) -> str | None:
    """The running sweep, if one began, failed of ``error``: the sweep's last line where it says more
    than the error, the launcher's failure (kept as the parent run's reason, which no run gives) or
    the journals left to upload; else ``None``."""
    if not _running:
        return None
    sweep = _running[0]
    failure = sweep.launcher_failure(error)
    if failure is not None:
        sweep.failure = failure
        return failure
    return sweep.unsynced_line(error)


def unsynced_journals(sweep_dir: Path) -> dict[Path, str]:
    """The journals under a sweep's folder whose run lost its store, each with why (its ``tracking_lost``
    record): what they measured reaches MLflow only once ``python -m axoexp.sync`` uploads it."""
    lost = {}
    for path in find_journals([sweep_dir]):
        record = first_record(path, TRACKING_LOST)
        if record is not None:
            lost[path] = str(record.get("reason"))
    return lost


def _jobs_begun(children: list[Run], tags: dict[str, str]) -> int:
    """How many jobs left a trace: a child run (named ``NN ...``; one named otherwise, by
    ``tracking.run_name``, counts once), or a reuse, refusal or death recorded on the parent (``axoexp.*.jobN``)."""
    prefixes = (names.REUSED_PREFIX, names.REFUSED_PREFIX, names.DIED_PREFIX)
    begun = {key.rpartition(".job")[2] for key in tags if key.startswith(prefixes)}
    numbers = [str(run.info.run_name).partition(" ")[0] for run in children]
    return len(begun | {str(int(number)) for number in numbers if number.isdigit()}) + sum(
        not number.isdigit() for number in numbers
    )


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


def _end_dead_child(client: MlflowClient, child: Run, reason: str) -> None:
    """End a child run whose process is gone: completed from its journal where it has one
    (everything it measured reaches MLflow), else KILLED with ``reason``."""
    journal = Path(child.data.tags.get(names.JOURNAL, ""))
    if child.data.tags.get(names.JOURNAL) and journal.is_file() and process_gone(child.data.tags):
        sync_journal(client, journal)
    else:
        end_dead_run(client, child.info.run_id, reason)


def end_killed_job(config: DictConfig, job_number: int, job_name: str, output_dir: Path, pid: int, how: str) -> str:
    """A job whose process died (:mod:`axoexp.job_process`): complete its run from its journal
    (KILLED, saying how it died, with every update it journaled) and record the death on the
    sweep's parent run (tag ``axoexp.died.jobN``). Returns what was done, in words."""
    uri = configure_tracking(config.tracking)
    journal = output_dir / JOURNAL_FILE
    try:
        client = open_client(uri)
        if journal.is_file():
            done = sync_journal(client, journal)
            run_id = (first_record(journal, START) or {}).get("run_id")
            if run_id and done.startswith("synced"):
                client.set_tag(
                    run_id,
                    names.FAILURE,
                    f"killed: the job's process {pid} {how}; what it journaled was completed from {journal} "
                    "by axoexp.sync",
                )
        else:
            done = "it had not started a run"
        if config.sweep.parent_run_id:
            client.set_tag(
                config.sweep.parent_run_id, f"{names.DIED_PREFIX}job{job_number}", f"{job_name} {how}; {done}"
            )
    except UNREACHABLE as error:
        done = redacted(  # it becomes the job's error, which a traceback shows
            f"{store_unreachable(uri, error)}; complete its run with: python -m axoexp.sync {output_dir} "
            f"--tracking-uri {uri}"
        )
    return done


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


def add_repeats(config: DictConfig) -> int:
    """``sweep.repeats=N``: the sweep gets the override ``sweep.repeat=0,...,N-1``, first, so the
    sweeper varies it slowest: every job runs once, then every job again, and drift during the
    sweep hits every job alike. Each repetition is a child run of its own (param ``sweep.repeat``).
    Returns how many times this made each planned job run: N, or 1 where it added nothing."""
    repeats = int(config.sweep.repeats)
    task = config.hydra.overrides.task
    if repeats > 1 and not any(str(item).lstrip("+~").startswith(f"{REPEAT_OVERRIDE_KEY}=") for item in task):
        task.insert(0, f"{REPEAT_OVERRIDE_KEY}={','.join(map(str, range(repeats)))}")
        return repeats
    return 1


def note_refused_job(config: DictConfig, job_number: int, job_name: str, error: Exception) -> None:
    """Record on the parent a job that failed before creating its run (e.g. a bad value)."""
    _tag_parent(config, f"{names.REFUSED_PREFIX}job{job_number}", f"{job_name}: {error}", f"the refused job {job_name}")


def note_remeasured_job(config: DictConfig, job_number: int, reason: str) -> None:
    """Record on the parent why job ``job_number`` measures again (``axoexp.remeasured.jobN``), as its
    ``measuring`` line says, once planning has accepted it: a job planning refuses made no run and
    has only its refusal recorded (:func:`note_refused_job`)."""
    _tag_parent(config, f"{names.REMEASURED_PREFIX}job{job_number}", reason, f"why job {job_number} measures again")


def _tag_parent(config: DictConfig, key: str, value: str, what: str) -> None:
    """Set tag ``key`` on the sweep's parent run, if there is one; log, naming ``what``, if the store is unreachable."""
    if not config.sweep.parent_run_id:
        return
    try:
        open_client(configure_tracking(config.tracking)).set_tag(config.sweep.parent_run_id, key, value)
    except UNREACHABLE as unreachable:
        log.error("could not record %s on the parent run: %s", what, unreachable)


def job_components(config: DictConfig) -> list[Component]:
    """The registered components the job's config chooses, one per group (names Hydra accepted)."""
    return [REGISTRY.get(group, str(config[group].name)) for group in GROUPS if group in config]


def result_key(config: DictConfig) -> str:
    """What determines this job's result (:func:`axoexp.metadata.result_key`): config, code
    (axoexp's and the plugin files its components come from), package versions, device."""
    container = cast(dict[str, Any], OmegaConf.to_container(config, resolve=True))
    return metadata.result_key(torch.device(str(config.device)), container, job_components(config))


@dataclass(frozen=True)
class Resume:
    """What resume decided for one job: the run it reuses, or why it measures again."""

    run: Run | None
    remeasure_reason: str = ""


def resume_job(config: DictConfig, job_number: int) -> Resume:
    """Resume: the earlier run this job can reuse, recorded on the sweep's parent, or why none.

    A run qualifies if it FINISHED with every metric finite, was measured quietly
    (:func:`~axoexp.statistics.doubts`: ``timing.contention=none`` and ``timing.noise=low``, both
    recorded; ``sweep.resume_contended=true`` drops this condition), has this job's
    :func:`result_key` (tag ``axoexp.result_key``: config, code,
    the plugin files its components come from, package versions, device) and this
    ``sweep.repeat``, and, with ``sweep.resume=same_sweep`` (the default), is a job of an earlier
    sweep with the same definition (:func:`sweep_definition`: the same jobs' resolved configs,
    however the overrides spelled them): a single run or another sweep's job is reused only with
    ``sweep.resume=any``. Outside a sweep and with ``sweep.resume=false`` nothing is reused and
    no reason is given; otherwise the reuse is recorded on the parent as ``axoexp.reused.jobN``,
    and the reason (new, contended, not finished, code changed, changed versions or device) once
    planning accepts the job (:func:`note_remeasured_job`).
    """
    mode = resume_mode(config.sweep.resume)
    parent_id = config.sweep.parent_run_id
    if mode in (None, "false") or not parent_id:
        return Resume(None)
    try:
        client = open_client(configure_tracking(config.tracking))
        decision = _decide(client, config, parent_id, mode)
        if decision.run is not None:
            client.set_tag(parent_id, f"{names.REUSED_PREFIX}job{job_number}", decision.run.info.run_id)
    except UNREACHABLE as error:
        return Resume(None, f"the MLflow store could not be searched ({str(error).splitlines()[0]})")
    return decision


def _decide(client: MlflowClient, config: DictConfig, parent_id: str, mode: str) -> Resume:
    found = client.get_experiment_by_name(config.tracking.experiment)
    if found is None:
        return Resume(None, f"{NEW}: no earlier run (experiment {config.tracking.experiment!r} is new)")
    repeat = f"params.`{names.SWEEP_REPEAT_PARAM}` = '{config.sweep.repeat}'"
    scope = None if mode == "any" else _same_sweeps(client, found.experiment_id, parent_id)
    where = "in any run" if scope is None else SAME_SWEEPS

    def search(condition: str) -> list[Run]:
        runs = client.search_runs(
            [found.experiment_id],
            filter_string=f"{condition} and {repeat}",
            order_by=["attributes.start_time DESC"],
            max_results=RESUME_CANDIDATES,
        )
        return [run for run in runs if scope is None or run.data.tags.get(names.PARENT_RUN_ID) in scope]

    key = result_key(config)
    same_key = search(f"tags.`{names.RESULT_KEY}` = '{key}'")
    finished = [
        run
        for run in same_key
        if run.info.status == "FINISHED" and all(math.isfinite(value) for value in run.data.metrics.values())
    ]
    quiet = [run for run in finished if config.sweep.resume_contended or not doubts([run.data.tags])]
    if quiet:
        return Resume(quiet[0])
    if finished:
        why = doubts([finished[0].data.tags])
        kind = "load not recorded" if why == "load not recorded" else "contended"  # an older store's run
        return Resume(
            None,
            f"{kind}: the earlier run {finished[0].info.run_id} is no quiet timing "
            f"({why}; sweep.resume_contended=true reuses it)",
        )
    if same_key:
        run = same_key[0]
        how = f"ended {run.info.status}" if run.info.status != "FINISHED" else "logged a non-finite metric"
        return Resume(None, f"not finished: the earlier run {run.info.run_id} {how}")
    container = cast(dict[str, Any], OmegaConf.to_container(config, resolve=True))
    same_config = search(f"tags.`{names.CONFIG_HASH}` = '{config_digest(container)}'")
    if same_config:
        earlier = same_config[0]
        return Resume(None, f"{_what_changed(earlier, config)} since the earlier run {earlier.info.run_id}")
    return Resume(None, f"{NEW}: no earlier run of this resolved config {where}")


def _same_sweeps(client: MlflowClient, experiment: str, parent_id: str) -> set[str]:
    """Earlier sweeps with the same definition as ``parent_id``'s."""
    definition = client.get_run(parent_id).data.tags.get(names.SWEEP_DEFINITION)
    if definition is None:
        return set()
    sweeps = client.search_runs([experiment], filter_string=f"tags.`{names.SWEEP_DEFINITION}` = '{definition}'")
    return {run.info.run_id for run in sweeps} - {parent_id}


def _what_changed(earlier: Run, config: DictConfig) -> str:
    """Why a run of the same config has another result key: which code files, versions or device."""
    tags = earlier.data.tags
    now = {
        **metadata.code_state(job_components(config)),
        **metadata.git_state(metadata.PACKAGE_DIR),
        **version_tags(torch.__version__),
        **metadata.device_identity(torch.device(str(config.device))),
    }
    if names.CODE_FILES in tags and tags[names.CODE_FILES] != now[names.CODE_FILES]:
        files = metadata.changed_files(tags[names.CODE_FILES], now[names.CODE_FILES])
        return f"code changed: {', '.join(files[:5])}{f' and {len(files) - 5} more' if len(files) > 5 else ''}"
    changed = [key for key, value in now.items() if key in tags and tags[key] != value and key != names.CODE_FILES]
    if changed:
        return "changed: " + ", ".join(f"{key} {tags[key]} -> {now[key]}" for key in changed[:3])
    return "code or environment changed (the earlier run predates per-file digests)"


def print_reuse(client: MlflowClient, parent: Run, children: int, stopped: bool = False) -> None:
    """Say how many jobs were new (no earlier run to reuse), how many were measured again,
    by reason (``measured 2 new jobs; re-measured 4 jobs: 3 contended, 1 code changed``; ``began
    measuring ...`` in a sweep a signal ``stopped``), and how many reused earlier runs, and from
    which sweeps (``reused k of n jobs from ...``)."""
    tags = parent.data.tags
    refused = [key for key in tags if key.startswith(names.REFUSED_PREFIX)]
    said = [value for key, value in tags.items() if key.startswith(names.REMEASURED_PREFIX)]
    reasons = [value.partition(":")[0] for value in said]
    new = reasons.count(NEW)
    counts = Counter(reason for reason in reasons if reason != NEW)
    measured, again = ("began measuring", "began re-measuring") if stopped else ("measured", "re-measured")
    elsewhere = (
        "; sweep.resume=any also reuses other sweeps' runs and single runs"
        if any(value.startswith(NEW) and SAME_SWEEPS in value for value in said)
        else ""
    )
    parts = [f"{measured} {plural(new, 'new job')} (no earlier run to reuse{elsewhere})"] if new else []
    if counts:
        remeasured = sum(counts.values())
        parts.append(
            f"{again} {plural(remeasured, 'job')}: "
            + ", ".join(f"{count} {reason}" for reason, count in sorted(counts.items()))
            + " (each job's line says which run or file)"
        )
    if parts:
        print_out("; ".join(parts))
    reused = [value for key, value in parent.data.tags.items() if key.startswith(names.REUSED_PREFIX)]
    if not reused:
        return
    sources = []
    for run_id in dict.fromkeys(client.get_run(run_id).data.tags.get(names.PARENT_RUN_ID) for run_id in reused):
        sources.append(f"'{client.get_run(run_id).info.run_name}' ({run_id})" if run_id else "single runs")
    print_out(
        f"reused {len(reused)} of {len(reused) + children + len(refused)} jobs from {', '.join(sources)} "
        "(sweep.resume=false re-measures)"
    )
