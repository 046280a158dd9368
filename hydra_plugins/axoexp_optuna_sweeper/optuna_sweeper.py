"""The Sweeper Hydra instantiates for ``hydra/sweeper=optuna``: a facade over :mod:`axoexp.search`."""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf


class OptunaSweeper(Sweeper):
    def __init__(self, **settings: Any) -> None:
        self.settings = OmegaConf.create(settings)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from hydra.core.plugins import Plugins

        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> Any:
        from axoexp.search import Search

        assert self.config is not None and self.launcher is not None
        return Search(self.settings, self.config, self.launcher.launch).run(arguments)
