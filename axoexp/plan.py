"""Planning: check a composed config before any work and resolve it into a :class:`Plan`.

Every problem that can be found before the work (unknown names, parameters a factory does
not take, keys a ``+key=value`` override added, out-of-range values, a CUDA-only executor on
the CPU, a non-capturable optimizer under capture, what a factory's ``config_problems``
refuses, a population an executor cannot run, banks to start from that do not fit) is
collected into one :class:`ConfigError`, raised before any MLflow run exists.

The population is built once while planning (:func:`probe_population`): its factory runs as it
will in the run. What it builds decides each executor's preconditions
(:meth:`axoexp.interfaces.Executor.refusal`) and the loss's (one forward and loss at the real
shapes), and gives the run its shape and streams, for any population, whatever its parameters
are called. A small population (:func:`probe_device`) is built on the CPU, at the run's own shapes,
whatever device the run is for (a meta forward runs every operation through torch's Python
references, whose wrappers import ``torch._dynamo``: seconds, against milliseconds for the default
population built on the CPU; docs/startup.md), and kept on the meta device once checked; a large
one, or one whose factory gives no memory estimate, on the meta device, where no tensor holds
memory or data.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, cast

import psutil
import torch
from omegaconf import DictConfig, OmegaConf

from axoexp.banks import InitialBanks, init_from_problems, read_initial_banks
from axoexp.components.population import checkpoint_problem, warm_up_batches_problem
from axoexp.config import added_keys, bounded_keys, choice_keys
from axoexp.errors import (
    AxoexpError,
    BanksError,
    ConfigError,
    IncompatibleComponentsError,
    RegistryError,
    first_line,
)
from axoexp.executors import optimizer_calls
from axoexp.executors.base import batch_loss, predictions
from axoexp.interfaces import Batch, Executor, LossFn, PopulationSetup, adaptation_parameters
from axoexp.nvml import cuda_present, gpu_probe
from axoexp.progress import noted_if_slow
from axoexp.registry import BUILTIN, GROUPS, INIT_FROM, INIT_FROM_SHA256, REGISTRY, Component, Registry
from axoexp.runtime import allowed_cpus
from axoexp.stdout import plural, type_in_words, with_article
from axoexp.tracking import configure_tracking, resolve_tracking_uri, store_problem, tracking_uri_key

log = logging.getLogger(__name__)
META = torch.device("meta")

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
CAPTURABLE_CHOICES = ("auto", True, False)
CPU_PROBE_BYTES = 64 * 2**20
"""The largest population (by its factory's memory estimate) planning builds on the CPU: its
teacher's forwards take milliseconds at the default size, but would load, at a large one, CPUs
that a parallel sweep's other jobs may be measuring on (this run takes its lease only later)."""
CPU = torch.device("cpu")
REFUSED_DTYPES = {
    "float16": "float16 parameters and optimizer state underflow (Adam's squared gradients and eps=1e-8 "
    "round to 0, so the first step divides 0 by 0: NaN) and axoexp keeps no float32 master "
    "weights or loss scaling; use bfloat16 (16 bits with float32's range) or float32",
}


@dataclass
class Plan:
    """A checked config: the components chosen, their parameters, device, dtype, capturable."""

    config: DictConfig
    device: torch.device
    dtype: torch.dtype
    components: dict[str, Component]
    params: dict[str, dict[str, Any]]
    capturable: bool
    registry: Registry
    probe: PopulationSetup | None = None
    """The population built while planning, on the meta device (None where its factory cannot build it)."""
    initial_banks: InitialBanks | None = None
    """The adapted banks ``population.init_from`` names, read and checked; loaded once built."""

    @property
    def shape(self) -> str:
        """The population's :attr:`~axoexp.interfaces.PopulationSetup.shape_label`, e.g. ``64x256x32``
        (``?`` where planning could not build it)."""
        return self.probe.shape_label if self.probe is not None else "?"

    @property
    def streams(self) -> int:
        """Independent streams per update (B), as the population builds its batches."""
        return self.probe.streams if self.probe is not None else 1

    def build_population(self) -> PopulationSetup:
        """The population as its factory builds it, then (``population.init_from``) given the
        initial banks, after its teacher and batches were made from the freshly built one."""
        population = self.components["population"]
        setup = population.build(
            self.params["population"], device=self.device, dtype=self.dtype, seed=int(self.config.seed)
        )
        problem = built_problem(population, setup)
        if problem:  # planning could not build it: found here, not as a NaN loss or a traceback
            raise IncompatibleComponentsError(problem)
        if self.initial_banks is not None:
            self.initial_banks.load_into(population.name, setup.module, self.dtype)
        return setup

    def build_loss(self) -> LossFn:
        return self.components["loss"].build(self.params["loss"])

    def begin_executor_setup(self) -> None:
        """Let the planned executor start its population-independent one-off work now."""
        executor_class(self.components["executor"]).begin_setup(self.device, self.params["executor"])

    def build_executor(self, module: torch.nn.Module, executor: str | None = None) -> Executor:
        """Optimizer, gradient transform and executor around ``module`` (a fresh set each call).

        ``executor`` names another executor of the plan's registry (built with its defaults),
        e.g. ``"eager"`` for a reference; by default the planned one with its parameters.
        """
        parameters = adaptation_parameters(module)
        optimizer, transform = (
            build_update_part(self.components[group], self.params[group], parameters, self.capturable)
            for group in UPDATE_PARTS
        )
        chosen = self.components["executor"]
        entry = chosen if executor is None else self.registry.get("executor", executor)
        refusal = executor_refusal(entry, module, self.dtype)
        if refusal:  # planning judged the meta-built population, or could not build one
            raise IncompatibleComponentsError(f"executor={entry.name} cannot run this population: {refusal}")
        return entry.build(
            self.params["executor"] if entry is chosen else {},
            module=module,
            optimizer=optimizer,
            loss_fn=self.build_loss(),
            gradient_transform=transform,
        )


RESUME_MODES = ("same_sweep", "any", "false")
UPDATE_PARTS = ("optimizer", "gradient_transform")


def build_update_part(component: Component, params: dict[str, Any], parameters: list[Any], capturable: bool) -> Any:
    """The optimizer (``capturable`` as resolved) or the gradient transform over ``parameters``, as a
    run builds it, and as planning builds it over the probe's to see whether it refuses its settings."""
    if component.group == "optimizer":
        with optimizer_calls.constructing():
            return component.build(params, parameters=parameters, capturable=capturable)
    return component.build(params, parameters=parameters)


def fails_alike(where: torch.device, run_device: torch.device) -> bool:
    """Whether what fails on a probe built ``where`` fails the same in the run: the run builds the same
    population (factory, parameters, seed, dtype, shapes) on the same kind of device, the CPU."""
    return where.type == "cpu" and run_device.type == "cpu"


def executor_class(entry: Component) -> type[Executor]:
    """An ``executor`` option's factory: a subclass of :class:`Executor` (checked at registration)."""
    return cast(type[Executor], entry.factory)


def executor_refusal(entry: Component, module: torch.nn.Module, dtype: torch.dtype) -> str | None:
    """The executor's :meth:`~axoexp.interfaces.Executor.refusal` of ``module`` at ``dtype``: a
    reason, or None; where the hook returns neither (``True``), a reason that says so."""
    refusal = executor_class(entry).refusal(module=module, dtype=dtype)
    if refusal is None or isinstance(refusal, str):
        return refusal or None
    return f"{hook_name(entry, 'refusal')} returns {type_in_words(refusal)} ({refusal!r}), not a reason (a str) or None"


def resume_mode(value: object) -> str | None:
    """``sweep.resume`` as one of :data:`RESUME_MODES` (``true`` means ``same_sweep``), else ``None``."""
    mode = {"true": "same_sweep"}.get(str(value).lower(), str(value).lower())
    return mode if mode in RESUME_MODES else None


def plan_experiment(config: DictConfig, registry: Registry = REGISTRY, *, here: bool = True) -> Plan:
    """Check everything that can be checked before any work; raise one :class:`ConfigError`. Planning
    that takes long says so (:func:`~axoexp.progress.noted_if_slow`): it builds the population and
    runs one forward, loss and update, whose Python runs at every time step even on the meta device.

    ``here=False`` plans a run that another machine will run (a sweep's job on a SLURM or Ray
    cluster's node): what this machine has (CPUs, CUDA, free memory) is left to the job's own
    planning there."""
    population = OmegaConf.select(config, "population.name")
    with noted_if_slow(f"planning (population={population} is built and one update checked before any run exists)"):
        return _plan(config, registry, here)


def _plan(config: DictConfig, registry: Registry, here: bool) -> Plan:
    problems: list[str] = []
    components: dict[str, Component] = {}
    params: dict[str, dict[str, Any]] = {}
    settings: dict[str, dict[str, Any]] = {}
    settings_refused: set[str] = set()  # groups whose parameters were refused: not asked about more
    for group, spec in GROUPS.items():
        node = cast(dict[str, Any], OmegaConf.to_container(config[group], resolve=True))
        unset = [key for key in node if OmegaConf.is_missing(config[group], key)]
        if unset:  # a factory would get the string '???'
            problems += [f"{group}.{key} is mandatory and not set: set it, e.g. {group}.{key}=VALUE" for key in unset]
            continue
        name = node.pop("name", None)
        settings[group] = {key: node.pop(key, setting.default) for key, setting in spec.settings.items()}
        params[group] = node
        try:
            components[group] = registry.get(group, str(name))
            components[group].check_params(node)
        except RegistryError as error:
            problems.append(str(error))
            continue
        refused = components[group].value_problems(node) + factory_problems(components[group], node, config)
        problems += refused
        if refused:
            settings_refused.add(group)

    problems += added_keys(config)
    for key, bounds in bounded_keys().items():
        problem = bounds.problem(OmegaConf.select(config, key))
        if problem:
            problems.append(f"{key}={OmegaConf.select(config, key)!r}: {problem}")
    for key, allowed in choice_keys().items():
        if OmegaConf.select(config, key) not in allowed:
            problems.append(f"{key}={OmegaConf.select(config, key)!r}: choose one of {', '.join(allowed)}")
    out_of_bounds = any(problem.startswith(("run.min_time_s=", "run.max_time_s=")) for problem in problems)
    if config.run.min_time_s > config.run.max_time_s and not out_of_bounds:  # each said once
        problems.append(
            f"run.min_time_s={config.run.min_time_s!r} exceeds run.max_time_s={config.run.max_time_s!r}, "
            "the cap on adaptive measuring; raise run.max_time_s or lower run.min_time_s"
        )
    problems += cpu_problems(config.run.lease_cpus, config.run.threads, here)
    if resume_mode(config.sweep.resume) is None:
        problems.append(f"sweep.resume={config.sweep.resume!r}: choose one of {', '.join(RESUME_MODES)}")
    device = _parse_device(str(config.device), problems, here)
    dtype = DTYPES.get(str(config.dtype))
    if str(config.dtype) in REFUSED_DTYPES:
        problems.append(f"dtype={config.dtype} is refused: {REFUSED_DTYPES[str(config.dtype)]}")
    elif dtype is None:
        choices = ", ".join(name for name in DTYPES if name not in REFUSED_DTYPES)
        problems.append(f"dtype={config.dtype!r} is not supported; choose one of: {choices}")
    if "population" in components:  # found here rather than once the MLflow run exists, nor by the probe's build
        checkpoint = params["population"].get("checkpoint")
        problems += filter(None, [checkpoint_problem(checkpoint, params["population"].get("checkpoint_sha256"))])
    probe = None
    if "population" in components and device is not None and dtype is not None and not problems:
        try:  # a hook that answers no number of bytes is said as a refusal
            estimate = memory_estimate(components["population"], params["population"], dtype)
        except ConfigError as error:
            problems.append(str(error))
        else:
            if here:
                problems += memory_problems(components["population"].name, estimate, device, dtype)
            if not problems:  # it fits: build it, to see what it is
                probe, unbuildable = probe_population(
                    components["population"],
                    params["population"],
                    probe_device(estimate),
                    dtype,
                    int(config.seed),
                    device,
                )
                problems += filter(None, [unbuildable])
    store = store_problem(resolve_tracking_uri(config.tracking.uri), tracking_uri_key(config.tracking.uri))
    if store:
        problems.append(store)
    if not str(config.tracking.experiment).strip():
        problems.append(
            f"tracking.experiment={config.tracking.experiment!r}: name an MLflow experiment (default axoexp)"
        )
    executor = components.get("executor")
    capturable = False
    if executor is not None and device is not None:
        if executor_class(executor).requires_cuda and device.type != "cuda":
            problems.append(
                f"executor={executor.name} needs CUDA, but device={config.device} "
                f"(CUDA available here: {'yes' if cuda_present() else 'no'}); "
                "use executor=eager, or device=cuda on a machine with a GPU"
            )
        capturable = resolve_capturable(settings["optimizer"]["capturable"], executor, device, problems)
    if executor is not None and dtype is not None and probe is not None:
        refusal = executor_refusal(executor, probe.module, dtype)
        if refusal:
            problems.append(
                f"executor={executor.name} cannot run this experiment: {refusal}; "
                f"executors that can: {_able_executors(registry, probe.module, dtype, device)}"
            )
    if probe is not None and "loss" in components and not problems:
        assert device is not None
        problems += loss_problems(components["loss"], params["loss"], probe, device)
    if probe is not None and not problems:
        assert device is not None
        problems += update_problems(components, params, probe, device, capturable)
    lengths = [int(inputs.shape[-2]) for inputs, _ in probe.batches] if probe is not None else []
    if executor is not None and "loss" in components and len(set(lengths)) > 1 and "executor" not in settings_refused:
        refusal = executor_class(executor).length_refusal(
            params={**executor.defaults(), **params["executor"]},
            lengths=lengths,
            loss_fn=None if problems else components["loss"].build(params["loss"]),  # built only when valid
        )
        if refusal:
            problems.append(f"executor={executor.name} cannot run batches of these lengths: {refusal}")
    problems += init_from_problems(settings.get("population", {}))
    initial_banks = None
    if not problems and settings["population"][INIT_FROM] is not None:  # the population's settings were read
        try:
            initial_banks = read_initial_banks(
                str(settings["population"][INIT_FROM]),
                settings["population"][INIT_FROM_SHA256],
                configure_tracking(config.tracking),  # bounded retries: a dead server fails in seconds
            )
        except BanksError as error:
            problems.append(str(error))
        else:
            problems += banks_problems(initial_banks, components["population"], probe, dtype)
    if problems:
        raise ConfigError(
            "invalid experiment config:"
            + (f" {problems[0]}" if len(problems) == 1 else "".join(f"\n  - {problem}" for problem in problems))
        )
    assert device is not None and dtype is not None
    probe = on_meta(probe) if probe is not None else None  # a CPU-built probe's memory goes back to the run
    return Plan(config, device, dtype, components, params, capturable, registry, probe, initial_banks)


def banks_problems(
    banks: InitialBanks, population: Component, probe: PopulationSetup | None, dtype: torch.dtype | None
) -> list[str]:
    """Why ``banks`` cannot start this population: another population option, or (judged on the
    population built on the meta device) other bank names, shapes or dtype. A population that
    cannot be built there is judged on the real module once built, inside the run."""
    kind = banks.kind_problem(population.name)
    if kind or probe is None or dtype is None:
        return [kind] if kind else []
    return banks.problems(population.name, probe.module, dtype)


def _able_executors(
    registry: Registry, module: torch.nn.Module, dtype: torch.dtype, device: torch.device | None
) -> str:
    """The executors that can run ``module`` in ``dtype``, those that need CUDA named apart where
    ``device`` is not a GPU: ``eager (with device=cuda: cudagraph, ...)``."""
    able = [
        entry
        for entry in registry.components()
        if entry.group == "executor" and not executor_refusal(entry, module, dtype)
    ]
    off_gpu = device is None or device.type != "cuda"
    on_gpu_only = sorted(entry.name for entry in able if off_gpu and executor_class(entry).requires_cuda)
    here = ", ".join(sorted(entry.name for entry in able if entry.name not in on_gpu_only)) or "none"
    return f"{here} (with device=cuda: {', '.join(on_gpu_only)})" if on_gpu_only else here


def loss_problems(loss: Component, params: dict[str, Any], probe: PopulationSetup, device: torch.device) -> list[str]:
    """What the loss refuses of the population's predictions, found by one forward and loss of the
    population built while planning (:func:`probe_device`) on each of :func:`checked_batches`, the
    held-out batches' too (batches may differ in length: population.lengths): what it raises as
    :class:`IncompatibleComponentsError` (e.g. a causal loss on too few time steps, judged on shapes
    alone) wherever the probe was built, a loss that is not a scalar (the update's backward needs
    one), and one that depends on no bank (an update would adapt nothing; a held-out loss could not
    change).

    Any other exception refuses the config only where the probe was built on the CPU for a run on
    the CPU (``device``): the run builds the same population (factory, parameters, seed, dtype,
    shapes) on the same kind of device, and its updates compute this same forward and loss
    (``batch_loss``, as the eager update does) over these batches, so the exception would end it
    FAILED, only later, once its MLflow run exists. Refusing can turn away a config that would run
    only for a loss whose failure depends on values (the banks change from update to update, and
    ``population.init_from`` loads others) or on a batch that the run's few updates never reach, or
    under an executor of its own that never calls the loss so. Elsewhere the exception is logged and
    left to the run: on the meta device an operation may lack a meta implementation, and for a run on
    a GPU judged on a CPU-built probe the failure may be the CPU's alone (an operation or dtype only
    CUDA implements, a plugin loss that launches a CUDA kernel). A loss that is not finite on a
    CPU-built probe (its initial banks, for a run on any device) refuses the config too."""
    for checked in checked_batches(probe):
        problem = _batch_loss_problem(loss, params, probe, device, checked)
        if problem:
            return [problem]
    return []


SHORTEST = "shortest batch"
"""How a line names the shortest of the batches an update adapts on."""


@dataclass(frozen=True)
class CheckedBatch:
    """A batch planning runs a forward and loss of, and how a line names it."""

    label: str  # SHORTEST, "batch 3", "held-out batch 0"
    held_out: bool
    batch: Batch


def checked_batches(probe: PopulationSetup) -> list[CheckedBatch]:
    """The batches planning runs a forward and loss of: of the training batches and of the held-out
    ones, the shortest of each shape but the time axis (a batch of other cells or channels may fail
    where the shortest does not; a longer one of the same shape only adds time steps)."""
    chosen = []
    for kind, batches in (("batch", probe.batches), ("held-out batch", probe.eval_batches)):
        shortest: dict[tuple[tuple[int, ...], ...], tuple[int, Batch]] = {}
        for index, batch in enumerate(batches):
            shape = tuple((*tensor.shape[:-2], tensor.shape[-1]) for tensor in batch)
            if shape not in shortest or batch[0].shape[-2] < shortest[shape][1][0].shape[-2]:
                shortest[shape] = (index, batch)
        groups = sorted(shortest.values(), key=lambda found: found[1][0].shape[-2])
        held_out = kind != "batch"
        for rank, (index, batch) in enumerate(groups):
            label = SHORTEST if not held_out and rank == 0 else f"{kind} {index}"
            chosen.append(CheckedBatch(label, held_out, batch))
    return chosen


def _batch_loss_problem(
    loss: Component, params: dict[str, Any], probe: PopulationSetup, device: torch.device, checked: CheckedBatch
) -> str | None:
    """What :func:`loss_problems` finds on one batch, or None."""
    label, held_out, batch = checked.label, checked.held_out, checked.batch
    where = batch[0].device
    try:
        value = batch_loss(probe.module, loss.build(params), *batch)
    except IncompatibleComponentsError as error:
        return f"loss={loss.name}: {error}" if label == SHORTEST else f"loss={loss.name} on {label}: {error}"
    except Exception as error:
        if fails_alike(where, device):
            return f"loss={loss.name}: a forward and loss of this population's {label} raise {first_line(error)}"
        log.info("loss %s cannot be evaluated on the %s-built population (%s)", loss.name, where.type, error)
        return None
    if value.dim() != 0:
        return (
            f"loss={loss.name} returns a tensor of shape {tuple(value.shape)}, not a scalar: an update's "
            "backward needs one number; reduce it (e.g. .mean())"
        )
    if not value.requires_grad:
        return _no_gradient(loss.name, probe, checked)
    if where.type == "cpu" and not torch.isfinite(value):
        return (
            f"loss={loss.name} is {value.item()} on this population's {label} before any update "
            f"({batch[0].shape[-2]} time steps), so the run's {'held-out loss' if held_out else 'first update'} "
            "would be too (e.g. a mean over no time steps left after the loss's warm-up)"
        )
    return None


def _no_gradient(loss_name: str, probe: PopulationSetup, checked: CheckedBatch) -> str:
    """Why a loss of a batch carries no gradient to the banks: the population's predictions of it
    carry none (e.g. every output is a warm-up output), or the loss drops theirs."""
    label, held_out, batch = checked.label, checked.held_out, checked.batch
    refused = (
        f"loss={loss_name} on this population's {label} ({batch[0].shape[-2]} time steps) depends on none of the "
        "banks it adapts (no gradient), "
        f"so {'its held-out loss could not change as they adapt' if held_out else 'an update would adapt nothing'}"
    )
    if not predictions(probe.module, batch[0]).requires_grad:
        return (
            f"{refused}: the population's predictions carry none (e.g. every output is a warm-up output); "
            f"give the population more time steps{' in its held-out batches' if held_out else ''}"
        )
    return (
        f"{refused}: the predictions carry one, and the loss drops it (.detach(), .item() or NumPy, or it reads "
        "only outputs without one, such as warm-up outputs); compute the loss with torch operations on them"
    )


INPUT_AXES = {3: ("population", "time", "channels"), 4: ("streams", "population", "time", "channels")}
TARGET_AXES = {3: ("population", "time", "outputs"), 4: ("streams", "population", "time", "outputs")}


def empty_batches_problem(population: Component, setup: PopulationSetup) -> str | None:
    """Why the population's batches (or held-out batches) hold nothing to adapt on or evaluate: none
    at all, or a tensor with no elements (e.g. a wrapper of ``lite`` without its bounds, given an
    empty population), whose every loss is the mean of nothing, NaN; ``None`` when each holds some.
    Judged on shapes alone (a meta-built population's too)."""
    if not setup.batches:
        return f"population={population.name} builds no batches; it must build at least one (inputs, targets) pair"
    for kind, batches in (("batch", setup.batches), ("held-out batch", setup.eval_batches)):
        for index, (inputs, targets) in enumerate(batches):
            for what, tensor, axes in (("inputs", inputs, INPUT_AXES), ("targets", targets, TARGET_AXES)):
                if tensor.numel() > 0:
                    continue
                shape, named = tuple(tensor.shape), axes.get(tensor.dim())
                if named:
                    empty = [axis for axis, size in zip(named, shape, strict=True) if size == 0]
                    plural = "axes are" if len(empty) > 1 else "axis is"
                    shape_text = f"{shape} ({', '.join(named)}): its {' and '.join(empty)} {plural} empty"
                else:
                    shape_text = f"{shape}, no elements"
                return (
                    f"population={population.name} builds empty batches: {kind} {index}'s {what} have shape "
                    f"{shape_text}, so every loss over them is NaN; check its population.* settings"
                )
    return None


def probe_device(estimate: int | None) -> torch.device:
    """Where planning builds the population, given its :func:`memory_estimate`: where that is at most
    :data:`CPU_PROBE_BYTES`, the CPU, for a run on any device (the run's own factory, parameters,
    seed and dtype: exact at every shape, and faster to build there than on the meta device); else
    the meta device (no memory taken on a GPU before the run holds its lease, no arithmetic on CPUs
    it holds no lease on yet)."""
    return META if estimate is None or estimate > CPU_PROBE_BYTES else CPU


def memory_estimate(population: Component, params: dict[str, Any], dtype: torch.dtype) -> int | None:
    """The bytes the population's factory estimates with its ``memory_estimate(params, dtype)`` hook
    (defaults included); None where it has none. Raise :class:`ConfigError` naming the hook where it
    raises, or returns no number of bytes."""
    estimate = getattr(population.factory, "memory_estimate", None)
    if estimate is None:
        return None
    try:
        value = estimate({**population.defaults(), **params}, dtype)
    except Exception as error:
        raise ConfigError(f"{hook_name(population, 'memory_estimate')} raised {first_line(error)}") from error
    number = _bytes(value)
    if not 0 <= number < math.inf:
        raise ConfigError(
            f"{hook_name(population, 'memory_estimate')} returns {type_in_words(value)}"
            f"{'' if value is None else f' ({repr(value)[:80]})'}, not a number of bytes (an int of 0 or more)"
        )
    return int(number)


def _bytes(value: object) -> float:
    """``value`` as a number (NumPy's, a 0-d tensor's too); NaN where it is none (text, ``None``, a bool)."""
    if isinstance(value, str | bytes | bool):
        return math.nan
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several elements
        return math.nan
    except OverflowError:  # an int too large for a float: more bytes than any machine has
        return math.inf


def hook_name(component: Component, hook: str) -> str:
    """``population=column's memory_estimate hook (plugins/column.py)``: a factory's hook, in a line
    that says what is wrong with it."""
    where = "" if component.source == BUILTIN else f" ({component.source})"
    return f"{component.group}={component.name}'s {hook} hook{where}"


def probe_population(
    population: Component,
    params: dict[str, Any],
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    run_device: torch.device,
) -> tuple[PopulationSetup | None, str | None]:
    """The population as its factory builds it on ``device`` (:func:`probe_device`): the module's
    types, dtypes and trainable parameters and the batches' shapes (on the meta device with no
    memory or arithmetic spent on tensors; the factory still runs its own host code, e.g. a random
    generator's draws); or None and why the config is refused.

    Refused: what the factory built cannot be adapted (:func:`setup_problem`,
    :func:`empty_batches_problem`); its build raised one of axoexp's config errors (e.g. a
    checkpoint that cannot be read), wherever it was built; or it raised anything where it was
    built on the CPU for a run on the CPU (``run_device``), which builds it the same way, so the
    run would fail the same, only once its MLflow run exists. Elsewhere (None, None): the factory
    cannot build there (e.g. an operation with no meta implementation), so the executor's
    preconditions are checked on the real module, inside the run, and the shape is read from the
    real batches."""
    try:
        setup = population.build(params, device=device, dtype=dtype, seed=seed)
    except Exception as error:
        if isinstance(error, AxoexpError):  # its message is the user's line already
            return None, str(error).splitlines()[0]
        if fails_alike(device, run_device):
            return None, f"population={population.name} cannot be built: {first_line(error)}"
        log.info("population %s cannot be built on %s (%s); it is judged when built", population.name, device, error)
        return None, None
    problem = built_problem(population, setup)
    return (None, problem) if problem else (setup, None)


def built_problem(population: Component, setup: object) -> str | None:
    """Why what ``population``'s factory built cannot be adapted or evaluated, as planning and the run
    judge it: no setup to adapt (:func:`setup_problem`), empty batches (:func:`empty_batches_problem`)
    or an AxoSim population's all-warm-up batches (:func:`warm_up_batches_problem`); else None."""
    problem = setup_problem(population, setup)
    if problem:
        return problem
    built = cast(PopulationSetup, setup)
    return empty_batches_problem(population, built) or warm_up_batches_problem(population.name, built)


def setup_problem(population: Component, setup: object) -> str | None:
    """Why what ``population``'s factory returned cannot be adapted: not a :class:`PopulationSetup`,
    a module without ``trainable_adaptation_parameters()`` (what an update adapts), or nothing there."""
    if not isinstance(setup, PopulationSetup):
        return (
            f"population={population.name} returns {type_in_words(setup)}, not an "
            "axoexp.interfaces.PopulationSetup(module=..., batches=...) (docs/plugins.md)"
        )
    module = type(setup.module).__name__
    if not callable(getattr(setup.module, "trainable_adaptation_parameters", None)):
        return (
            f"population={population.name} builds {with_article(module)} without trainable_adaptation_parameters(), "
            "which names the parameters an update adapts (docs/plugins.md)"
        )
    if not adaptation_parameters(setup.module):
        return (
            f"population={population.name} builds {with_article(module)} whose trainable_adaptation_parameters() "
            "is empty"
        )
    return None


def update_problems(
    components: dict[str, Component],
    params: dict[str, dict[str, Any]],
    probe: PopulationSetup,
    device: torch.device,
    capturable: bool,
) -> list[str]:
    """What the optimizer or the gradient transform refuses of its settings, found by building each
    over the probe's adaptation parameters as the run builds them over its own, ``capturable`` as
    resolved (torch's optimizers check devices only when they step; e.g. Adam refuses a beta of 1).
    A ``ValueError`` (how torch.optim refuses a setting) refuses the config wherever the probe was
    built; any other exception only where it was built on the CPU for a run on the CPU, as in
    :func:`loss_problems`."""
    parameters = adaptation_parameters(probe.module)
    where = parameters[0].device
    problems = []
    for group in UPDATE_PARTS:
        try:
            build_update_part(components[group], params[group], parameters, capturable)
        except Exception as error:
            if isinstance(error, ValueError) or fails_alike(where, device):
                problems.append(f"{group}={components[group].name} refuses its settings: {first_line(error)}")
            else:
                log.info(
                    "%s %s cannot be built on the %s-built population (%s)",
                    group,
                    components[group].name,
                    where.type,
                    error,
                )
    return problems


def on_meta(probe: PopulationSetup) -> PopulationSetup:
    """``probe`` with its module and batches moved to the meta device (shapes, dtypes and types kept)."""
    return replace(
        probe,
        module=probe.module.to(META),
        batches=[(inputs.to(META), targets.to(META)) for inputs, targets in probe.batches],
        eval_batches=[(inputs.to(META), targets.to(META)) for inputs, targets in probe.eval_batches],
    )


def available_bytes(device: torch.device) -> int:
    """Memory free for a new workload: the device's free memory on CUDA, else the host's
    available memory (MemAvailable on Linux).

    On CUDA it is read through NVML where possible: ``torch.cuda.mem_get_info`` would create a
    CUDA context, and a job still waiting for its device lease would then be one more process
    on the GPU of the job that holds it (counted as contention where the driver keeps no
    per-process utilization samples)."""
    if device.type == "cuda":
        probe = gpu_probe(device)
        free = probe.free_bytes() if probe is not None else None
        return free if free is not None else torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def factory_problems(component: Component, params: dict[str, Any], config: DictConfig) -> list[str]:
    """What a factory with ``config_problems(params, config) -> list[str]`` refuses in its
    settings (defaults included) and the config around them, before anything is built."""
    check = getattr(component.factory, "config_problems", None)
    if check is None:
        return []
    try:
        found = check({**component.defaults(), **params}, config)
    except Exception as error:
        return [f"{hook_name(component, 'config_problems')} raised {first_line(error)}"]
    problems = None if isinstance(found, str) or not isinstance(found, Iterable) else list(found)
    if problems is None or not all(isinstance(problem, str) for problem in problems):
        return [
            f"{hook_name(component, 'config_problems')} returns {type_in_words(found)}, not a list of problems "
            "(a line each; [] for none)"
        ]
    return problems


def memory_problems(population: str, needed: int | None, device: torch.device, dtype: torch.dtype) -> list[str]:
    """Population ``population``, whose factory's ``memory_estimate(params, dtype)`` hook estimates
    ``needed`` bytes (:func:`memory_estimate`; None: it has none), is refused when that cannot fit in
    the memory available, before anything is allocated."""
    if needed is None:
        return []
    available = available_bytes(device)
    if needed <= available:
        return []
    where = f"device {device}" if device.type == "cuda" else "host"
    return [
        f"population {population} needs about {needed / 2**30:.1f} GiB "
        f"({dtype}; its estimate), but {where} memory has {available / 2**30:.1f} GiB available; "
        "make the population smaller (its population.* settings)"
    ]


def cpu_problems(lease_cpus: object, threads: object, here: bool) -> list[str]:
    """``run.lease_cpus`` and ``run.threads`` beyond the CPUs this process may use (``here``; else,
    planned for another machine, only threads beyond the lease, refused on any machine): threads
    beyond them take turns, and every update waits for the last."""
    cpus = len(allowed_cpus()) if here else None
    problems = []
    if cpus is not None and isinstance(lease_cpus, int) and lease_cpus > cpus:
        problems.append(f"run.lease_cpus={lease_cpus}: this process may use only {cpus} CPUs")
    leased = lease_cpus if isinstance(lease_cpus, int) and (cpus is None or lease_cpus < cpus) else None
    usable = leased or cpus
    if isinstance(threads, int) and usable is not None and threads > usable:
        why = (
            f"run.lease_cpus={leased} pins this process to {plural(leased, 'CPU')}"
            if leased
            else f"this process may use only {cpus} CPUs"
        )
        problems.append(
            f"run.threads={threads}: {why}, so its threads would take turns on them and every update wait "
            f"for the last; choose at most {usable}, or null (axoexp's choice)"
        )
    return problems


def _parse_device(value: str, problems: list[str], here: bool) -> torch.device | None:
    try:
        device = torch.device(value)
    except RuntimeError:
        problems.append(f"device={value!r} is not a device; use cpu, cuda or cuda:N")
        return None
    if device.type == "cuda" and here and not cuda_present():
        problems.append(f"device={value} but CUDA is not available here; use device=cpu")
    elif device.type not in ("cpu", "cuda"):
        problems.append(f"device={value!r} is not supported; use cpu, cuda or cuda:N")
    return device


def resolve_capturable(setting: object, executor: Component, device: torch.device, problems: list[str]) -> bool:
    """``auto`` means: capturable exactly when the executor captures the optimizer step."""
    if setting not in CAPTURABLE_CHOICES:
        problems.append(f"optimizer.capturable={setting!r}; choose auto, true or false")
        return False
    needs = executor_class(executor).requires_capturable_optimizer
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
