"""Losses between a population's prediction and its targets, shape (neurons, time, outputs)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from axoexp.components.population import WARMUP_STEPS
from axoexp.registry import component

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def skip_warmup(loss: LossFn, warmup_steps: int) -> LossFn:
    """``loss`` over the time steps after the first ``warmup_steps`` (a causal loss)."""
    if warmup_steps < 0:
        raise ValueError(f"loss.warmup_steps must be non-negative, got {warmup_steps}")

    def causal(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if prediction.shape[1] <= warmup_steps:
            raise ValueError(
                f"a causal loss skips the first {warmup_steps} warm-up steps, so it needs more "
                f"than {warmup_steps} time steps; got {prediction.shape[1]} "
                "(raise population.time_steps)"
            )
        return loss(prediction[:, warmup_steps:], target[:, warmup_steps:])

    return causal


@component("loss", "causal_mse")
def causal_mse(*, warmup_steps: int = WARMUP_STEPS) -> LossFn:
    """Mean squared error over the steps after AxoSim-Lite's warm-up (the first 4 by default)."""
    return skip_warmup(F.mse_loss, warmup_steps)


@component("loss", "mse")
def mse() -> LossFn:
    """Mean squared error over every step, warm-up included."""
    return F.mse_loss


@component("loss", "huber")
def huber(*, delta: float = 1.0, warmup_steps: int = 0) -> LossFn:
    """Huber loss; ``warmup_steps`` > 0 makes it causal like ``causal_mse``."""
    if delta <= 0:
        raise ValueError(f"loss.delta must be positive, got {delta}")

    def loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.huber_loss(prediction, target, delta=delta)

    return skip_warmup(loss, warmup_steps) if warmup_steps else loss
