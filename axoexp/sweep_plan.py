"""A sweep's jobs planned before any run exists: each composed as its launcher will compose it and
planned as the job will plan itself, where its launcher runs it (this machine, or a cluster's node)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

import torch
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from axoexp import names
from axoexp.config import one_line
from axoexp.errors import ConfigError, SweepRefusedError
from axoexp.plan import plan_experiment
from axoexp.tracking import config_digest

RAY_ADDRESS_KEY = "hydra.launcher.ray.init.address"


def ray_address(config: DictConfig) -> str | None:
    """A Ray launcher's :data:`RAY_ADDRESS_KEY`; None for another launcher, or where it is null (the
    launcher starts a local Ray instance)."""
    if not launcher_target(config).endswith(names.RAY_LAUNCHER):
        return None
    address = OmegaConf.select(config, RAY_ADDRESS_KEY)
    return None if address is None else str(address)


def basic_jobs(config: DictConfig) -> list[list[str]] | None:
    """Each job's overrides, in order, for the basic sweeper, which knows them up front; None for another."""
    if not str(config.hydra.sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    loader = GlobalHydra.instance().config_loader()
    params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
    parsed = OverridesParser.create(config_loader=loader).parse_overrides([*params, *config.hydra.overrides.task])
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


COMPOSING_ERRORS = (HydraException, OmegaConfBaseException)
"""What composing a job's config raises for a mistake in its overrides."""
PLANNING_ERRORS = (ConfigError, *COMPOSING_ERRORS)
"""What composing and planning a job raise for a mistake in its config."""


def launcher_target(config: DictConfig) -> str:
    """The sweep's launcher class, as ``hydra.launcher._target_`` names it."""
    return str(config.hydra.launcher.get("_target_", ""))


def jobs_run_here(config: DictConfig) -> bool:
    """Whether the sweep's jobs run on this machine: under a launcher known to run them here
    (:data:`~axoexp.names.LOCAL_LAUNCHERS`, axoexp's), or Ray's where it starts its own instance here
    (no address, set or in ``RAY_ADDRESS``). Any other launcher (SLURM, a Ray cluster, one axoexp does not know)
    may run them elsewhere, so what a machine has is left to each job there."""
    target = launcher_target(config)
    if target.endswith(names.RAY_LAUNCHER):
        return ray_address(config) is None and not os.environ.get("RAY_ADDRESS")
    return target.startswith(names.POOL_LAUNCHER) or target.endswith(names.LOCAL_LAUNCHERS)


def job_composer(config: DictConfig) -> Callable[[list[str]], DictConfig]:
    """A function composing a job's config from its overrides, as the sweep's launcher will. Call it
    in the process that forks the jobs: it holds torch to one thread first. Planning runs a few torch
    ops (the meta build's inputs), which must not start torch's intra-op (OpenMP) pool there: a child
    forked after it has started deadlocks in its first parallel op. Each job sets its own threads."""
    loader = GlobalHydra.instance().config_loader()
    torch.set_num_threads(1)
    return lambda overrides: loader.load_sweep_config(config, overrides)


def plan_jobs(config: DictConfig) -> tuple[dict[int, str], list[str]]:
    """Plan every job of a basic sweep before any run exists: ``job N (overrides): why`` for each
    refused one, by its number, and each job's resolved config as its :func:`~axoexp.tracking.config_digest`
    (the sweep's definition). If a job's config cannot be composed (Hydra's sweeper would then
    start no job) or every job is refused, :class:`SweepRefusedError` names those jobs in one line
    and no parent run is created. Other sweepers choose their jobs as they go: nothing is planned."""
    jobs = basic_jobs(config)
    if jobs is None:
        return {}, []
    compose, here = job_composer(config), jobs_run_here(config)
    uncomposable: list[str] = []
    refused: dict[int, str] = {}
    digests: list[str] = []
    for number, job in enumerate(jobs):
        try:
            job_config = compose(job)
        except COMPOSING_ERRORS as error:
            uncomposable.append(f"job {number} ({names.job_label(job)}): {one_line(error)}")
            continue
        if uncomposable:  # the sweep is refused: the rest are only composed, to name every such job
            continue
        digests.append(_job_digest(job_config, job))
        try:
            plan_experiment(job_config, here=here)
        except PLANNING_ERRORS as error:
            refused[number] = f"job {number} ({names.job_label(job)}): {one_line(error)}"
    if uncomposable:  # Hydra's BasicSweeper composes a batch's jobs first and fails the batch at the first it cannot
        raise SweepRefusedError(
            "no job of the sweep can run, so it created no run: Hydra starts a sweep's jobs only once it has "
            f"composed every job's config, and it cannot compose {'; '.join(uncomposable)}"
        )
    if jobs and len(refused) == len(jobs):
        raise SweepRefusedError(f"no job of the sweep can run, so it created no run: {'; '.join(refused.values())}")
    return refused, digests


def _job_digest(job_config: DictConfig, overrides: list[str]) -> str:
    """The job's resolved config, less Hydra's own node, as its :func:`~axoexp.tracking.config_digest`;
    its overrides where it cannot be resolved here."""
    task = OmegaConf.masked_copy(job_config, [str(key) for key in job_config if key != "hydra"])
    try:
        return config_digest(cast(dict[str, Any], OmegaConf.to_container(task, resolve=True)))
    except OmegaConfBaseException:
        return "overrides " + " ".join(sorted(overrides))
