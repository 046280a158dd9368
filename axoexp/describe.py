"""What a run is, as tags and a name: components, workload shapes, what each timing includes."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.data.meta_dataset import MetaDataset
from mlflow.types.schema import ColSpec, Schema, TensorSpec

from axoexp import metadata, names
from axoexp.executors.base import NOT_TIMED
from axoexp.interfaces import Executor, PopulationSetup
from axoexp.plan import Plan
from axoexp.registry import GROUPS
from axoexp.timing import CLOCK, DEVICE_CLOCK
from axoexp.tracking import config_digest

BANKS = ("behavior_adapter", "morphology_adapter", "synaptic_log_efficacy")


def run_tags(plan: Plan, resolved_config: dict[str, Any]) -> dict[str, str]:
    """Tags known before anything is built: components and their sources, seed, config hash."""
    tags = {names.component_tag(group): entry.name for group, entry in plan.components.items()}
    tags.update({names.component_source_tag(group): entry.source for group, entry in plan.components.items()})
    tags.update(
        {
            names.SEED: str(plan.config.seed),
            names.CONFIG_HASH: config_digest(resolved_config),
            names.PROCESS_PID: str(os.getpid()),
            names.SHAPE: plan.shape,
            names.STREAMS: str(plan.streams),
        }
    )
    tags.update(metadata.source_tags())
    parent = plan.config.sweep.parent_run_id
    if parent:
        tags[names.PARENT_RUN_ID] = parent
    return tags


def workload_tags(setup: PopulationSetup, plan: Plan) -> dict[str, str]:
    """Shapes, dtypes, device, the adaptation banks and the population's own description."""
    inputs, targets = setup.batches[0]
    tags = {
        names.SHAPE: setup.shape_label,  # as built (planning may not have built it)
        names.STREAMS: str(setup.streams),
        names.SHAPE_INPUTS: str(tuple(inputs.shape)),
        names.SHAPE_TARGETS: str(tuple(targets.shape)),
        names.DTYPE_INPUTS: str(inputs.dtype),
        names.DTYPE_PARAMETERS: str(plan.dtype),
        names.DEVICE_RESOLVED: str(inputs.device),
        names.OPTIMIZER_CAPTURABLE: str(plan.capturable).lower(),
    }
    for name, parameter in setup.module.named_parameters():
        if name in BANKS:
            tags[names.bank_tag(name)] = f"{tuple(parameter.shape)} trainable={str(parameter.requires_grad).lower()}"
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


NOT_IN_NAMES = ("executor", "executor.name")  # named first, as the executor
TIMESTAMP = "%m-%d %H:%M:%S"


def short_overrides(overrides: Iterable[str], skip: tuple[str, ...] = (), choices_by_value: bool = True) -> list[str]:
    """Overrides as a run name shows them: a group choice by its option (``clip_norm``) if
    ``choices_by_value``, any other key by its last part (``lr=0.01``); bookkeeping keys
    (where results go, how a run is watched) left out."""
    shown = []
    for override in map(names.unescaped, overrides):
        key, _, value = override.partition("=")
        key = key.lstrip("+~")
        if key in skip or names.is_bookkeeping(key) or key.startswith("hydra"):
            continue
        shown.append(value if choices_by_value and key in GROUPS else f"{key.rsplit('.', 1)[-1]}={value}")
    return shown


def job_run_name(plan: Plan, job_number: int, overrides: Iterable[str]) -> str:
    """A sweep job's run: job number (so names sort in sweep order), executor, the population's
    shape and the job's other overrides, e.g. ``03 cudagraph 64x256x32 batch_size=8 clip_norm``.
    The full overrides are in its params."""
    return " ".join(
        [f"{job_number:02d}", plan.components["executor"].name, plan.shape, *short_overrides(overrides, NOT_IN_NAMES)]
    )


def sweep_run_name(overrides: Iterable[str]) -> str:
    """A sweep's parent run: when it started and what it sweeps, e.g. ``sweep 12-05 14:32:05 batch_size=1,8``."""
    return " ".join(["sweep", time.strftime(TIMESTAMP), *short_overrides(overrides, choices_by_value=False)])


def default_run_name(plan: Plan) -> str:
    """A single run: when it started (names sort by time), executor, the population's shape (and
    streams where more than one) and device, e.g. ``12-05 14:32:05 cudagraph 64x256x32 B=8 cuda``."""
    streams = f" B={plan.streams}" if plan.streams > 1 else ""
    return f"{time.strftime(TIMESTAMP)} {plan.components['executor'].name} {plan.shape}{streams} {plan.device.type}"


def _numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    try:
        return torch.empty((), dtype=dtype).numpy().dtype
    except TypeError:  # bfloat16 has no numpy dtype
        return None


def workload_dataset(setup: PopulationSetup, plan: Plan) -> MetaDataset:
    """The workload as an MLflow dataset: the settings that generated it (population, shape,
    input rate, teacher perturbation, batches, seed) and a digest of the generated batches,
    so that equal digests mean identical inputs and targets."""
    population = plan.components["population"].name
    settings = {key: str(value) for key, value in plan.params["population"].items()}
    source = CodeDatasetSource({"population": population, "seed": str(plan.config.seed), **settings})
    digest = hashlib.sha256()
    for batch in setup.batches:
        for tensor in batch:
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    inputs, targets = setup.batches[0]
    specs: list[ColSpec | TensorSpec] = []
    for name, tensor in (("inputs", inputs), ("targets", targets)):
        dtype = _numpy_dtype(tensor.dtype)
        if dtype is not None:
            specs.append(TensorSpec(dtype, (len(setup.batches), *tensor.shape), name))
    return MetaDataset(  # type: ignore[abstract]  # MLflow declares profile abstract; MetaDataset has none
        source,
        name=f"{population}-{setup.shape_label}" + (f"-B{setup.streams}" if setup.streams > 1 else ""),
        digest=digest.hexdigest()[:16],
        schema=Schema(specs) if specs else None,
    )
