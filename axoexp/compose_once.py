"""A single run's config composed once: Hydra 1.3 composes it twice, once to learn the run mode, once to run.

``hydra.main`` asks ``Hydra.get_mode`` for the mode the config sets (``hydra.mode``), which
composes the whole config (in multirun mode, errors swallowed), and then ``Hydra.run`` composes
it again (in run mode, adding the ``hydra.mode=RUN`` override where the config set no mode).
:func:`composed_once` makes the first composition the run's own: ``get_mode`` composes as ``run``
will and keeps the result, which ``run`` then takes instead of composing again. Where the
run-mode composition fails (a sweep value without ``-m``, a bad override) or the config sets
``hydra.mode=MULTIRUN``, nothing is kept and Hydra's own path runs, errors and all. This leans on
Hydra's internals; with any Hydra it was not written for, :func:`composed_once` leaves Hydra as it is.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hydra
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra.types import RunMode
from omegaconf import DictConfig

RUN_MODE_OVERRIDE = "hydra.mode=RUN"  # what Hydra's _run_app adds where the config sets no mode
_LOAD_PARAMETERS = ["self", "config_name", "overrides", "run_mode", "from_shell", "validate_sweep_overrides"]
_kept: dict[tuple[str | None, tuple[str, ...]], DictConfig] = {}
"""The run-mode config ``get_mode`` composed, by the (config name, overrides) ``run`` will compose it with."""


def applies() -> bool:
    """Whether this Hydra composes as :func:`composed_once` expects (1.3, whose internals it was written for)."""
    return (
        hydra.__version__.startswith("1.3.")
        and list(inspect.signature(ConfigLoaderImpl.load_configuration).parameters) == _LOAD_PARAMETERS
        and list(inspect.signature(Hydra.get_mode).parameters) == ["self", "config_name", "overrides"]
    )


@contextmanager
def composed_once() -> Iterator[bool]:
    """Within it, a single run's config is composed once (see the module's docstring); it yields
    ``False``, and leaves Hydra as it is, where this Hydra is not one it applies to. A multirun
    would compose once more (its sweep values fail the run-mode composition): use it for single runs."""
    if not applies():
        yield False
        return
    hydras_get_mode, hydras_load = Hydra.get_mode, ConfigLoaderImpl.load_configuration

    def get_mode(self: Hydra, config_name: str | None, overrides: list[str]) -> Any:
        _kept.clear()
        try:
            config = self.config_loader.load_configuration(config_name, overrides, RunMode.RUN)
        except Exception:
            return hydras_get_mode(self, config_name, overrides)  # which swallows it; run raises it
        mode = config.hydra.mode
        if mode is None:  # as run's composition with the override it adds: the mode set, the override recorded
            config.hydra.mode = RunMode.RUN
            config.hydra.overrides.hydra.append(RUN_MODE_OVERRIDE)
            _kept[(config_name, (*overrides, RUN_MODE_OVERRIDE))] = config
        elif mode == RunMode.RUN:
            _kept[(config_name, tuple(overrides))] = config
        return mode

    def load_configuration(
        self: ConfigLoaderImpl,
        config_name: str | None,
        overrides: list[str],
        run_mode: RunMode,
        from_shell: bool = True,
        validate_sweep_overrides: bool = True,
    ) -> DictConfig:
        if run_mode == RunMode.RUN and from_shell and validate_sweep_overrides:
            kept = _kept.pop((config_name, tuple(overrides)), None)
            if kept is not None:
                return kept
        return hydras_load(self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides)

    Hydra.get_mode = get_mode  # type: ignore[method-assign]
    ConfigLoaderImpl.load_configuration = load_configuration  # type: ignore[method-assign]
    try:
        yield True
    finally:
        Hydra.get_mode, ConfigLoaderImpl.load_configuration = hydras_get_mode, hydras_load  # type: ignore[method-assign]
        _kept.clear()
