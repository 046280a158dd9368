"""``hydra/launcher=parallel``: a sweep's jobs on axoexp's :class:`~axoexp.worker_pool.WorkerPool`.

It does what Hydra's joblib launcher does, job for job: each job is composed from the sweep's
config and its overrides and run by Hydra's ``run_job`` in a worker process, under the sweep's
singleton state (the config store, the plugins). What differs is the pool: a worker that dies
mid-job (kill -9, the out-of-memory killer) fails that job alone. Its job's process gets SIGTERM
and ends its run KILLED with what it measured; once it is gone, the sweep's process completes
the run from its journal where it has to, records the death on the sweep's parent run (tag
``axoexp.died.jobN``, as for a killed job process, :func:`axoexp.sweep.end_killed_job`) and fails
the job with one line, while the siblings go on and a fresh worker runs the next jobs.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict, read_write

from axoexp import names
from axoexp.errors import JobKilledError
from axoexp.worker_pool import WorkerDeath, WorkerPool

if TYPE_CHECKING:
    from hydra_plugins.axoexp_parallel_launcher.parallel_launcher import ParallelLauncher

log = logging.getLogger(__name__)


def launch(launcher: ParallelLauncher, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """Run the jobs on this process's pool of ``n_jobs`` workers; their returns, in order."""
    setup_globals()
    config, context, task = launcher.config, launcher.hydra_context, launcher.task_function
    assert config is not None and context is not None and task is not None
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    pool = pool_of(launcher.n_jobs)
    log.info("axoexp's pool of %d worker processes is launching %d jobs", launcher.n_jobs, len(job_overrides))
    log.info("Launching jobs, sweep output dir : %s", sweep_dir)
    for number, overrides in enumerate(job_overrides, initial_job_idx):
        log.info("\t#%d : %s", number, " ".join(filter_overrides(overrides)))
    state = Singleton.get_state()
    calls = [
        (execute_job, (number, overrides, context, config, task, state))
        for number, overrides in enumerate(job_overrides, initial_job_idx)
    ]

    def on_death(index: int, death: WorkerDeath) -> JobReturn:
        return dead_job(context, config, initial_job_idx + index, job_overrides[index], death)

    return pool.run(calls, on_death)


_pool: WorkerPool | None = None


def pool_of(size: int) -> WorkerPool:
    """This process's pool of ``size`` workers, kept from batch to batch and sweep to sweep (a
    worker's imports are paid once); one of another size is closed first."""
    global _pool
    if _pool is None or _pool.size != size:
        close_pool()
        _pool = WorkerPool(size)
    return _pool


def close_pool() -> None:
    """Close this process's pool, if any (it closes itself when the process exits)."""
    global _pool
    if _pool is not None:
        _pool.close()
        _pool = None


def job_config(context: HydraContext, config: DictConfig, overrides: Sequence[str], number: int) -> DictConfig:
    """Job ``number``'s config, composed from the sweep's and its overrides."""
    job = context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(job):
        job.hydra.job.id = f"{job.hydra.job.name}_{number}"
        job.hydra.job.num = number
    return job


def execute_job(
    number: int,
    overrides: Sequence[str],
    context: HydraContext,
    config: DictConfig,
    task: TaskFunction,
    state: dict[Any, Any],
) -> JobReturn:
    """In a worker: run one job as Hydra runs a sweep's job, in the sweep's state (its singletons)."""
    setup_globals()
    Singleton.set_state(state)
    job = job_config(context, config, overrides, number)
    HydraConfig.instance().set_config(job)
    with job_labelled_output(number):
        return run_job(
            hydra_context=context,
            config=job,
            task_function=task,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )


@contextmanager
def job_labelled_output(number: int) -> Iterator[None]:
    """Every line the job prints (its log, its summary, its messages) starts with ``[#N]``, Hydra's
    number for it, since jobs that run at once share the terminal."""
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (LabelledLines(stream, f"[#{number}] ") for stream in streams)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams


class LabelledLines:
    """A text stream that writes ``label`` at the start of each line to ``stream``."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream, self.label, self.at_line_start = stream, label, True

    def write(self, text: str) -> int:
        pieces = []
        for line in text.splitlines(keepends=True):
            pieces.append(f"{self.label}{line}" if self.at_line_start else line)
            self.at_line_start = line.endswith("\n")
        self.stream.write("".join(pieces))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding: the stream's own
        return getattr(self.stream, name)


def dead_job(
    context: HydraContext, config: DictConfig, number: int, overrides: Sequence[str], death: WorkerDeath
) -> JobReturn:
    """Job ``number``'s return when its worker died: FAILED, saying how, once its run is ended
    and the death recorded on the sweep's parent run."""
    from axoexp import sweep

    job = job_config(context, config, overrides, number)
    output_dir = Path(os.path.abspath(os.path.join(str(job.hydra.sweep.dir), str(job.hydra.sweep.subdir))))
    name = names.job_label(overrides)
    job_pid = death.forked[0][0] if death.forked else death.pid
    how = f"was stopped when its worker process {death.pid} {death.how}"
    done = sweep.end_killed_job(job, number, name, output_dir, job_pid, how)
    task_config = copy.deepcopy(job)  # as run_job returns it: without the hydra node
    with read_write(task_config), open_dict(task_config):
        del task_config["hydra"]
    return JobReturn(
        overrides=list(overrides),
        cfg=task_config,
        hydra_cfg=job,
        working_dir=os.getcwd(),
        task_name=job.hydra.job.name,
        status=JobStatus.FAILED,
        _return_value=JobKilledError(f"job {number}'s worker process {death.pid} {death.how}; {done}"),
    )
