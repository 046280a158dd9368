"""What every executor is: something that prepares once and then performs updates."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from axoexp.interfaces import GradientTransform, LossFn

# The stages one update may contain, for the timing tags.
UPDATE_STAGES = ("zero_grad", "forward", "loss", "backward", "gradient_transform", "optimizer_step")
NOT_TIMED = ("batch_generation", "host_loss_readback", "metric_logging")


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

    @classmethod
    def refusal(cls, *, population: str, dtype: torch.dtype) -> str | None:
        """Why this executor cannot run a plan with this population option and dtype (checked
        while planning, before any work), or ``None``."""
        del population, dtype
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

    @abstractmethod
    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Queue one update on (inputs, targets); return the loss tensor (not synchronised)."""


def eager_update(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    gradient_transform: GradientTransform,
    inputs: torch.Tensor,
    targets: torch.Tensor,
) -> torch.Tensor:
    """One update exactly as ``axosim.CudaGraphAdaptationStep`` captures it."""
    optimizer.zero_grad(set_to_none=False)
    loss = loss_fn(module(inputs), targets)
    loss.backward()
    if gradient_transform is not None:
        gradient_transform()
    optimizer.step()
    return loss.detach()
