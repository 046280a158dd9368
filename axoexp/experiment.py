"""One experiment: validate the config, build the components, time the updates, log to MLflow."""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from axoexp import metadata
from axoexp.components.population import PopulationSetup
from axoexp.executors.base import NOT_TIMED, Executor
from axoexp.registry import GROUPS, REGISTRY, Component, RegistryError, load_plugins
from axoexp.timing import CLOCK, LatencySummary, synchronizer
from axoexp.tracking import (
    CONFIG_HASH_TAG, PARENT_TAG, RunLog, config_digest, configure_http, flatten,
    resolve_tracking_uri, tracked_run,
)
from axoexp.verification import Verification, verify_parity

DTYPES = {
    "float32": torch.float32, "float64": torch.float64,
    "bfloat16": torch.bfloat16, "float16": torch.float16,
}
CAPTURABLE_CHOICES = ("auto", True, False)


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem found."""


@dataclass
class Plan:
    """A validated config: the components chosen, their parameters, device and dtype."""

    config: DictConfig
    device: torch.device
    dtype: torch.dtype
    components: dict[str, Component]
    params: dict[str, dict[str, Any]]
    capturable: bool

    @property
    def executor_class(self) -> type[Executor]:
        return self.components["executor"].factory  # type: ignore[return-value]

    def build_population(self) -> PopulationSetup:
        return self.components["population"].build(
            self.params["population"], device=self.device, dtype=self.dtype, seed=int(self.config.seed)
        )

    def build_executor(self, module: torch.nn.Module, executor: Component | None = None) -> Executor:
        """Optimizer, gradient transform and executor around ``module`` (a fresh set each call)."""
        parameters = list(module.trainable_adaptation_parameters())
        optimizer = self.components["optimizer"].build(
            self.params["optimizer"], parameters=parameters, capturable=self.capturable
        )
        transform = self.components["gradient_transform"].build(
            self.params["gradient_transform"], parameters=parameters
        )
        executor = executor or self.components["executor"]
        return executor.build(
            self.params["executor"] if executor is self.components["executor"] else {},
            module=module, optimizer=optimizer,
            loss_fn=self.components["loss"].build(self.params["loss"]),
            gradient_transform=transform,
        )


def plan_experiment(config: DictConfig) -> Plan:
    """Check everything that can be checked before any work; raise one :class:`ConfigError`."""
    load_plugins()
    problems: list[str] = []
    components: dict[str, Component] = {}
    params: dict[str, dict[str, Any]] = {}
    capturable_setting: object = "auto"
    for group in GROUPS:
        node = OmegaConf.to_container(config[group], resolve=True)
        assert isinstance(node, dict)
        name = node.pop("name", None)
        if group == "optimizer":
            capturable_setting = node.pop("capturable", "auto")
        try:
            components[group] = REGISTRY.get(group, str(name))
            components[group].check_params(node)
        except RegistryError as error:
            problems.append(str(error))
        params[group] = node

    device = _parse_device(str(config.device), problems)
    dtype = DTYPES.get(str(config.dtype))
    if dtype is None:
        problems.append(f"dtype={config.dtype!r} is not supported; choose one of: {', '.join(DTYPES)}")
    executor = components.get("executor")
    capturable = False
    if executor is not None and device is not None:
        executor_class = executor.factory
        if executor_class.requires_cuda and device.type != "cuda":
            problems.append(
                f"executor={executor.name} needs CUDA, but device={config.device} "
                f"(CUDA available here: {'yes' if torch.cuda.is_available() else 'no'}); "
                "use executor=eager, or device=cuda on a machine with a GPU"
            )
        capturable = _resolve_capturable(capturable_setting, executor, device, problems)
    for key, minimum in (("run.warmup_updates", 0), ("run.measured_updates", 1), ("verify.updates", 1)):
        value = OmegaConf.select(config, key)
        if not isinstance(value, int) or value < minimum:
            problems.append(f"{key} must be an integer of at least {minimum}, got {value!r}")
    if problems:
        raise ConfigError("invalid experiment config:\n  - " + "\n  - ".join(problems))
    assert device is not None and dtype is not None
    return Plan(config, device, dtype, components, params, capturable)


def _parse_device(value: str, problems: list[str]) -> torch.device | None:
    try:
        device = torch.device(value)
    except RuntimeError:
        problems.append(f"device={value!r} is not a device; use cpu, cuda or cuda:N")
        return None
    if device.type == "cuda" and not torch.cuda.is_available():
        problems.append(f"device={value} but CUDA is not available here; use device=cpu")
    elif device.type not in ("cpu", "cuda"):
        problems.append(f"device={value!r} is not supported; use cpu, cuda or cuda:N")
    return device


def _resolve_capturable(
    setting: object, executor: Component, device: torch.device, problems: list[str]
) -> bool:
    """``auto`` means: capturable exactly when the executor captures the optimizer step."""
    if setting not in CAPTURABLE_CHOICES:
        problems.append(f"optimizer.capturable={setting!r}; choose auto, true or false")
        return False
    needs = executor.factory.requires_capturable_optimizer
    if setting is False and needs:
        problems.append(
            f"optimizer.capturable=false, but executor={executor.name} captures the optimizer "
            "step in a CUDA graph, which needs a capturable optimizer; "
            "set optimizer.capturable=auto (or true)"
        )
    if setting is True and device.type != "cuda":
        problems.append(
            f"optimizer.capturable=true needs parameters on CUDA, but device={device}; "
            "set optimizer.capturable=auto (or false)"
        )
    return needs if setting == "auto" else bool(setting)


def configure_determinism(config: DictConfig) -> None:
    """Apply the run's determinism settings before any device work."""
    if config.deterministic_algorithms:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(bool(config.deterministic_algorithms))
    torch.backends.cudnn.benchmark = bool(config.cudnn_benchmark)
    torch.set_float32_matmul_precision(str(config.float32_matmul_precision))


@dataclass
class UpdateTrace:
    """Per-update latencies (ms) and losses, filled in as updates complete."""

    latencies_ms: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


def run_updates(
    executor: Executor, setup: PopulationSetup, count: int, first: int, trace: UpdateTrace
) -> None:
    """Time ``count`` updates, cycling through the batches; losses are read after timing."""
    sync = synchronizer(setup.batches[0][0].device)
    losses = []
    try:
        for index in range(first, first + count):
            inputs, targets = setup.batches[index % len(setup.batches)]
            sync()
            start = time.perf_counter_ns()
            losses.append(executor.step(inputs, targets))
            sync()
            trace.latencies_ms.append((time.perf_counter_ns() - start) / 1e6)
    finally:
        trace.losses.extend(float(loss) for loss in losses[: len(trace.latencies_ms)])


@dataclass
class ExperimentResult:
    """What a finished experiment measured, and where it was logged."""

    run_id: str
    tracking_uri: str
    experiment: str
    prepare_ms: dict[str, float]
    update: LatencySummary
    warmup_ms: list[float]
    losses: list[float]
    description: dict[str, Any]
    verification: Verification | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


def timing_tags(executor: Executor) -> dict[str, str]:
    tags = {
        "timing.clock": CLOCK,
        "timing.update.includes": ",".join(executor.update_includes),
        "timing.update.excludes": ",".join(NOT_TIMED),
        "timing.update.inputs": "batches already resident on the run device, cycled",
    }
    for phase, stages in executor.prepare_includes().items():
        tags[f"timing.{phase}.includes"] = ",".join(stages)
    return tags


def describe_shapes(setup: PopulationSetup, plan: Plan) -> dict[str, str]:
    inputs, targets = setup.batches[0]
    banks = {name: parameter for name, parameter in setup.module.named_parameters()
             if name in ("behavior_adapter", "morphology_adapter", "synaptic_log_efficacy")}
    tags = {
        "shape.inputs": str(tuple(inputs.shape)), "shape.targets": str(tuple(targets.shape)),
        "dtype.inputs": str(inputs.dtype), "dtype.parameters": str(plan.dtype),
        "device.resolved": str(inputs.device), "optimizer.capturable": str(plan.capturable).lower(),
    }
    for name, parameter in banks.items():
        tags[f"bank.{name}"] = f"{tuple(parameter.shape)} trainable={str(parameter.requires_grad).lower()}"
    tags.update({f"population.{key}": str(value) for key, value in setup.description.items()})
    return tags


def default_run_name(plan: Plan) -> str:
    """E.g. ``cudagraph lite-64x256x32 causal_mse adam cuda``."""
    population = plan.params["population"]
    shape = "x".join(str(population.get(key, "?")) for key in ("neurons", "time_steps", "contacts"))
    names = plan.components
    return (f"{names['executor'].name} {names['population'].name}-{shape} "
            f"{names['loss'].name} {names['optimizer'].name} {plan.device}")


def configure_tracking(config: DictConfig) -> str:
    """Bound HTTP retries as configured; return the tracking URI to use."""
    tracking = config.tracking
    configure_http(int(tracking.http_max_retries), int(tracking.http_timeout_s),
                   int(tracking.http_backoff_factor))
    return resolve_tracking_uri(tracking.uri)


def run_experiment(
    config: DictConfig, output_dir: Path | None = None, *,
    parent_run_id: str | None = None, run_name: str | None = None,
) -> ExperimentResult:
    """Run the experiment ``config`` describes and log it as one MLflow run.

    In a sweep the run is a child of ``parent_run_id``. If the tracking store is unreachable
    the experiment still runs, logs to ``output_dir`` and then raises
    :class:`~axoexp.tracking.TrackingUnavailableError`.
    """
    plan = plan_experiment(config)
    configure_determinism(config.determinism)
    tracking_uri = configure_tracking(config)
    container = OmegaConf.to_container(config, resolve=True)
    assert isinstance(container, dict)
    tags = {
        **{f"component.{group}": component.name for group, component in plan.components.items()},
        **{f"component.{group}.source": component.source for group, component in plan.components.items()},
        "seed": str(config.seed), CONFIG_HASH_TAG: config_digest(container), "process.pid": str(os.getpid()),
    }
    if parent_run_id is not None:
        tags[PARENT_TAG] = parent_run_id
    run_name = config.tracking.run_name or run_name or default_run_name(plan)
    with tracked_run(tracking_uri, config.tracking.experiment, run_name, tags, offline_dir=output_dir) as tracker:
        tracker.log_params(flatten(container))
        tracker.log_text(OmegaConf.to_yaml(config, resolve=True), "config.yaml")
        tracker.set_tags(metadata.collect(plan.device))
        if output_dir is not None:
            tracker.set_tags({"output_dir": str(output_dir)})
        result = _measure(plan, tracker, tracking_uri)
        if output_dir is not None:
            path = output_dir / "result.json"
            path.write_text(result.to_json())
            tracker.log_artifact(str(path))
        return result


def _measure(plan: Plan, tracker: RunLog, tracking_uri: str) -> ExperimentResult:
    config = plan.config
    setup = plan.build_population()
    tracker.set_tags(describe_shapes(setup, plan))
    pristine = copy.deepcopy(setup.module) if config.verify.enabled else None
    executor = plan.build_executor(setup.module)
    tracker.set_tags(timing_tags(executor))

    prepare_ms = executor.prepare(*setup.batches[0])
    tracker.log_metrics({f"{phase}_ms": value for phase, value in prepare_ms.items()})

    warmup, measured = UpdateTrace(), UpdateTrace()
    warmup_count, measured_count = int(config.run.warmup_updates), int(config.run.measured_updates)
    try:
        run_updates(executor, setup, warmup_count, 0, warmup)
        run_updates(executor, setup, measured_count, warmup_count, measured)
    finally:
        _log_traces(tracker, warmup, measured, measured_count)

    verification = None
    if pristine is not None:
        verification = verify_parity(
            plan, pristine, setup.batches, int(config.verify.updates),
            float(config.verify.loss_atol), float(config.verify.param_atol),
        )
        tracker.log_metrics(verification.metrics())
        verification.raise_if_failed()
    return ExperimentResult(
        run_id=tracker.run_id, tracking_uri=tracking_uri, experiment=config.tracking.experiment,
        prepare_ms=prepare_ms, update=LatencySummary.of(measured.latencies_ms),
        warmup_ms=warmup.latencies_ms, losses=warmup.losses + measured.losses,
        description=setup.description, verification=verification,
    )


def _log_traces(tracker: RunLog, warmup: UpdateTrace, measured: UpdateTrace, planned: int) -> None:
    """Log whatever completed, also when an update failed part-way."""
    tracker.log_series("update_ms", warmup.latencies_ms + measured.latencies_ms)
    tracker.log_series("loss", warmup.losses + measured.losses)
    metrics = {"measured_updates_completed": float(len(measured.latencies_ms))}
    if warmup.latencies_ms:
        metrics["first_update_ms"] = warmup.latencies_ms[0]
    if measured.latencies_ms:
        metrics.update(LatencySummary.of(measured.latencies_ms).as_metrics("update_ms"))
    losses = warmup.losses + measured.losses
    if losses:
        metrics.update(loss_initial=losses[0], loss_final=losses[-1])
    tracker.log_metrics(metrics)
    if len(measured.latencies_ms) < planned:
        tracker.set_tags({"axoexp.partial": f"{len(measured.latencies_ms)} of {planned} measured updates"})
