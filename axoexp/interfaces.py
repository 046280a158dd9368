"""What components hand each other: batches, losses, gradient transforms, a ready population,
an executor, a run's log.

Kept apart from the components themselves so that the registry, the executors and the
components can all name these types without importing one another. Torch and MLflow are
named in annotations only, so that the registry (and every plugin) imports neither. The aliases
are real objects with only ``torch.Tensor`` quoted: a hint naming one resolves wherever ``torch`` is
imported (``typing.get_type_hints`` of a loss factory), with no ``Callable`` needed there.
"""

from __future__ import annotations

import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias, cast

from axoexp import names

if TYPE_CHECKING:  # annotations only: importing torch or MLflow costs seconds
    import torch
    from mlflow.data.dataset import Dataset

Batch: TypeAlias = tuple["torch.Tensor", "torch.Tensor"]
"""Inputs and targets of one update. One stream: inputs (population, time, channels) (an AxoSim
neuron's channels are its contact inputs) and targets (population, time, outputs), run through
``module(inputs)``. B independent streams: the same with a leading stream axis, (B, population,
time, channels), run through ``module.forward_batch(inputs)`` (as ``axosim.AxoSimPopulation``
does); the update's loss is then the mean over streams of each stream's loss
(:func:`axoexp.executors.base.batch_loss`)."""

STREAM_AXIS_RANK = 4
"""Rank of batched-stream inputs: (streams, population, time, channels)."""


def length_range(batches: list[Batch]) -> tuple[int, int] | None:
    """The shortest and the longest batch's time steps, or ``None`` where every batch has one length."""
    lengths = {int(inputs.shape[-2]) for inputs, _ in batches}
    return (min(lengths), max(lengths)) if len(lengths) > 1 else None


# typing's Callable, not collections.abc's: typing.get_type_hints evaluates the quoted arguments of the
# former where the hint is read; Python 3.11 flattens the latter's argument list when it does
LossFn: TypeAlias = typing.Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""``loss_fn(prediction, target)``: a scalar loss tensor."""

MaskedLossFn: TypeAlias = typing.Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""``masked(prediction, target, length)``: the loss over the first ``length`` steps (a 0-dim tensor)
of predictions and targets padded at the end of the time axis (docs/lengths.md)."""

GradientTransform: TypeAlias = Callable[[], None] | None
"""Called between backward and the optimizer step (graph-safe: no host reads), or ``None``."""


def adaptation_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters a population module adapts (its ``trainable_adaptation_parameters()``)."""
    parameters = cast("Callable[[], Iterable[torch.nn.Parameter]]", module.trainable_adaptation_parameters)
    return list(parameters())


@dataclass
class PopulationSetup:
    """What a ``population`` factory returns: a module to adapt, fixed-shape batches, and
    held-out batches of the same workload (same teacher) that no update adapts on, on which
    the run logs ``eval_loss_before`` and ``eval_loss_after`` (none given: no evaluation)."""

    module: torch.nn.Module
    batches: list[Batch]
    description: dict[str, object] = field(default_factory=dict)
    eval_batches: list[Batch] = field(default_factory=list)

    @property
    def streams(self) -> int:
        """Independent streams per update: B for batched inputs (B, population, time, channels), else 1."""
        inputs = self.batches[0][0]
        return int(inputs.shape[0]) if inputs.dim() == STREAM_AXIS_RANK else 1

    @property
    def shape(self) -> tuple[int, ...]:
        """One stream's input shape, (population, time, channels): what the population says it is."""
        inputs = self.batches[0][0]
        return tuple(inputs.shape[1:] if inputs.dim() == STREAM_AXIS_RANK else inputs.shape)

    @property
    def shape_label(self) -> str:
        """One stream's shape as runs are named and tagged by it (:func:`~axoexp.names.shape_label`), the
        time steps the range of the batches' lengths where they differ: ``3x17..39x4``, not the first's."""
        dims: list[object] = list(self.shape)
        lengths = length_range(self.batches)
        if lengths is not None:
            dims[-2] = f"{lengths[0]}..{lengths[1]}"
        return names.shape_label(*dims)


class MetricsLog(Protocol):
    """Where tags, metrics and metric series go (what ``axoexp.windows.log_traces`` needs)."""

    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None: ...
    def log_series(self, name: str, values: list[float], first_step: int = 0) -> None: ...


class RunLog(MetricsLog, Protocol):
    """Where one experiment's params, tags, metrics and artifacts go (``axoexp.journal``'s
    journaled MLflow run)."""

    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def log_artifact(self, path: str) -> None: ...
    def log_dataset(self, dataset: Dataset, context: str) -> None: ...


class Executor(ABC):
    """Runs one fixed-shape adaptation update at a time.

    ``step`` queues one update and returns its loss as a device tensor without waiting
    (the caller synchronises); later updates must not overwrite that tensor. ``prepare``
    does any one-off work (capture, compilation) and returns how long each phase of it took,
    in milliseconds. Neither may consume an update: after ``prepare`` the module and optimizer
    are as they were.
    """

    requires_cuda: ClassVar[bool] = False
    requires_capturable_optimizer: ClassVar[bool] = False
    update_includes: ClassVar[tuple[str, ...]]

    def __init__(
        self,
        *,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        gradient_transform: GradientTransform,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.gradient_transform = gradient_transform
        self.prepared_tags: dict[str, str] = {}
        """Facts ``prepare`` learned, logged as run tags (e.g. whether a compile cache was warm)."""
        self.prepared_metrics: dict[str, float] = {}
        """Quantities ``prepare`` measured, logged as run metrics (e.g. CUDA graph pool bytes)."""

    @classmethod
    def refusal(cls, *, module: torch.nn.Module, dtype: torch.dtype) -> str | None:
        """Why this executor cannot run the population ``module`` (as its factory built it) at
        ``dtype``, or ``None``. Planning asks it of the population it built (on the CPU or
        the meta device), before any MLflow run exists (so judge structure, types and ``requires_grad``, not values
        or the device); ``axoexp.plan.Plan.build_executor`` asks again of the real module."""
        del module, dtype
        return None

    @classmethod
    def begin_setup(cls, device: torch.device, params: Mapping[str, Any]) -> None:
        """Start one-off work that needs no population (e.g. a compiler's start-up) in the
        background as soon as the run is planned (``params``: this executor's options);
        ``prepare`` waits for it."""
        del device, params

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        """For each phase ``prepare`` times, the stages that phase contains."""
        return {}

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        del example_inputs, example_targets
        return {}

    @classmethod
    def length_refusal(cls, *, params: Mapping[str, Any], lengths: list[int], loss_fn: LossFn | None) -> str | None:
        """Why this executor cannot run batches of these lengths (one per batch; they may differ,
        ``population.lengths``) with ``loss_fn`` (``None`` where the config has other problems),
        or ``None``. Planning asks it before any run."""
        del params, lengths, loss_fn
        return None

    def buckets(self) -> tuple[int, ...] | None:
        """The lengths this executor runs batches at, when it pads them (after ``prepare_all``),
        else ``None``: every batch runs at its exact length."""
        return None

    def captures(self) -> int | None:
        """How many graphs this executor has captured so far, ``None`` where it captures none itself. A run
        logs those captured after ``prepare`` (:data:`axoexp.names.RECAPTURES`): a steady state captures none."""
        return None

    def prepare_all(self, batches: list[Batch]) -> dict[str, float]:
        """``prepare`` for a run over ``batches``: on the first batch, unless the executor needs
        every batch (e.g. one captured graph per length bucket)."""
        return self.prepare(*batches[0])

    @abstractmethod
    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Queue one update on (inputs, targets); return the loss tensor (not synchronised)."""
