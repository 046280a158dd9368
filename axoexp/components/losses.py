"""Losses between a population's prediction and its targets, shape (neurons, time, outputs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

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
        if prediction.shape[1] <= warmup_steps:  # planning refuses this where the population names time_steps
            raise IncompatibleComponentsError(_too_short(warmup_steps, prediction.shape[1]))
        return loss(prediction[:, warmup_steps:], target[:, warmup_steps:])

    return causal


def _too_short(warmup_steps: int, time_steps: object) -> str:
    return (
        f"population.time_steps={time_steps}: a causal loss skips the first {warmup_steps} warm-up steps, "
        f"so it needs more than {warmup_steps} time steps; raise population.time_steps or lower loss.warmup_steps"
    )


def warmup_problems(params: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """What planning refuses for a causal loss: a population with no step after the warm-up."""
    warmup_steps, population = params.get("warmup_steps", 0), config.get("population") or {}
    time_steps = population.get("time_steps")
    if warmup_steps and isinstance(time_steps, int) and time_steps <= warmup_steps:
        return [_too_short(warmup_steps, time_steps)]
    return []


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


causal_mse.config_problems = warmup_problems  # type: ignore[attr-defined]
huber.config_problems = warmup_problems  # type: ignore[attr-defined]
