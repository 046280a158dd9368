"""The Launcher Hydra instantiates for ``hydra/launcher=parallel``: a facade over :mod:`axoexp.parallel_launcher`."""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class ParallelLauncher(Launcher):
    def __init__(self, n_jobs: int = 1) -> None:
        self.n_jobs = n_jobs
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from axoexp import parallel_launcher

        return parallel_launcher.launch(self, job_overrides, initial_job_idx)
