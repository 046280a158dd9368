"""What a run is, as tags and a name: components, workload shapes, what each timing includes."""

from __future__ import annotations

import os
from typing import Any

import torch

from axoexp import names
from axoexp.executors.base import NOT_TIMED, Executor
from axoexp.interfaces import PopulationSetup
from axoexp.plan import Plan
from axoexp.timing import CLOCK, DEVICE_CLOCK
from axoexp.tracking import config_digest

BANKS = ("behavior_adapter", "morphology_adapter", "synaptic_log_efficacy")


def shape_of(plan: Plan) -> str:
    """The planned population's shape label, e.g. ``64x256x32``."""
    population = plan.params["population"]
    return names.shape_label(*(population.get(key, "?") for key in ("neurons", "time_steps", "contacts")))


def run_tags(plan: Plan, resolved_config: dict[str, Any]) -> dict[str, str]:
    """Tags known before anything is built: components and their sources, seed, config hash."""
    tags = {names.component_tag(group): entry.name for group, entry in plan.components.items()}
    tags.update({names.component_source_tag(group): entry.source for group, entry in plan.components.items()})
    tags.update({
        names.SEED: str(plan.config.seed), names.CONFIG_HASH: config_digest(resolved_config),
        names.PROCESS_PID: str(os.getpid()), names.SHAPE: shape_of(plan),
    })
    parent = plan.config.sweep.parent_run_id
    if parent:
        tags[names.PARENT_RUN_ID] = parent
    return tags


def workload_tags(setup: PopulationSetup, plan: Plan) -> dict[str, str]:
    """Shapes, dtypes, device, the adaptation banks and the population's own description."""
    inputs, targets = setup.batches[0]
    tags = {
        names.SHAPE_INPUTS: str(tuple(inputs.shape)), names.SHAPE_TARGETS: str(tuple(targets.shape)),
        names.DTYPE_INPUTS: str(inputs.dtype), names.DTYPE_PARAMETERS: str(plan.dtype),
        names.DEVICE_RESOLVED: str(inputs.device), names.OPTIMIZER_CAPTURABLE: str(plan.capturable).lower(),
    }
    for name, parameter in setup.module.named_parameters():
        if name in BANKS:
            tags[names.bank_tag(name)] = (f"{tuple(parameter.shape)} "
                                          f"trainable={str(parameter.requires_grad).lower()}")
    tags.update({names.population_tag(key): str(value) for key, value in setup.description.items()})
    return tags


def timing_tags(executor: Executor, device: torch.device | None = None) -> dict[str, str]:
    """What the update timing (and on CUDA its device clock) and each one-off phase include."""
    tags = {
        names.TIMING_CLOCK: CLOCK,
        names.TIMING_UPDATE_INCLUDES: ",".join(executor.update_includes),
        names.TIMING_UPDATE_EXCLUDES: ",".join(NOT_TIMED),
        names.TIMING_UPDATE_INPUTS: "batches already resident on the run device, cycled",
    }
    if device is not None and device.type == "cuda":
        tags[names.TIMING_DEVICE_CLOCK] = DEVICE_CLOCK
    for phase, stages in executor.prepare_includes().items():
        tags[names.timing_includes_tag(phase)] = ",".join(stages)
    return tags


def default_run_name(plan: Plan) -> str:
    """E.g. ``cudagraph lite-64x256x32 causal_mse adam cuda``."""
    chosen = plan.components
    return (f"{chosen['executor'].name} {chosen['population'].name}-{shape_of(plan)} "
            f"{chosen['loss'].name} {chosen['optimizer'].name} {plan.device}")
