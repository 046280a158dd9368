"""Losses between a population's prediction and its targets, shape (population, time, outputs)."""

from __future__ import annotations

from typing import Annotated

import torch
import torch.nn.functional as F

from axoexp.components.population import WARMUP_STEPS
from axoexp.errors import IncompatibleComponentsError
from axoexp.interfaces import LossFn
from axoexp.registry import NON_NEGATIVE, POSITIVE, component


def skip_warmup(loss: LossFn, warmup_steps: int) -> LossFn:
    """``loss`` over the time steps after the first ``warmup_steps`` (a causal loss)."""
    if warmup_steps < 0:
        raise ValueError(f"loss.warmup_steps must be non-negative, got {warmup_steps}")

    def causal(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if prediction.shape[1] <= warmup_steps:  # planning finds it on the meta-built population
            raise IncompatibleComponentsError(_too_short(warmup_steps, prediction.shape[1]))
        return loss(prediction[:, warmup_steps:], target[:, warmup_steps:])

    return causal


def _too_short(warmup_steps: int, steps: object) -> str:
    return (
        f"a causal loss skips the first {warmup_steps} warm-up steps, so it needs more than {warmup_steps} "
        f"time steps, and the population's predictions have {steps}; give the population more time steps "
        "or lower loss.warmup_steps"
    )


@component("loss", "causal_mse")
def causal_mse(
    *, warmup_steps: Annotated[int, "leading output steps left out of the loss", NON_NEGATIVE] = WARMUP_STEPS
) -> LossFn:
    """Mean squared error over the steps after AxoSim-Lite's warm-up (the first 4 by default)."""
    return skip_warmup(F.mse_loss, warmup_steps)


@component("loss", "mse")
def mse() -> LossFn:
    """Mean squared error over every step, warm-up included."""
    return F.mse_loss


@component("loss", "huber")
def huber(
    *,
    delta: Annotated[float, "quadratic below, linear above this error", POSITIVE] = 1.0,
    warmup_steps: Annotated[int, "leading output steps left out (4 makes it causal)", NON_NEGATIVE] = 0,
) -> LossFn:
    """Huber loss; ``warmup_steps`` > 0 makes it causal like ``causal_mse``."""

    def loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.huber_loss(prediction, target, delta=delta)

    return skip_warmup(loss, warmup_steps) if warmup_steps else loss
