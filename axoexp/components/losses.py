"""Losses between a population's prediction and its targets, shape (population, time, outputs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F

from axoexp.components.population import WARMUP_STEPS
from axoexp.errors import IncompatibleComponentsError
from axoexp.interfaces import LossFn, MaskedLossFn
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


@dataclass(frozen=True)
class PointwiseError:
    """An elementwise error by name, for code that computes it and its derivative itself (the fused
    kernels): ``squared`` is torch's ``mse_loss``, ``huber`` torch's ``huber_loss`` at ``delta``."""

    kind: Literal["squared", "huber"]
    delta: float = 0.0


class MeanOverSteps:
    """A loss that is the mean of an elementwise error over the steps after ``warmup_steps``.

    Called as ``loss(prediction, target)`` it is exactly ``reduced`` over those steps (today's
    numbers). :meth:`masked` takes the same mean over predictions padded at the end of the time
    axis, counting only the first ``length`` steps of each sequence, so a padded step contributes
    nothing to the loss nor to any gradient (docs/lengths.md). ``pointwise`` names the elementwise
    error where it is one the fused kernels compute themselves (docs/fused.md)."""

    def __init__(
        self, reduced: LossFn, elementwise: LossFn, warmup_steps: int, pointwise: PointwiseError | None = None
    ) -> None:
        self.elementwise = elementwise
        self.warmup_steps = warmup_steps
        self.pointwise = pointwise
        self.reduced = skip_warmup(reduced, warmup_steps) if warmup_steps else reduced

    def __call__(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.reduced(prediction, target)

    def masked(self, prediction: torch.Tensor, target: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """The loss over steps ``warmup_steps`` .. ``length`` - 1 (``length``: a 0-dim device tensor,
        so that one captured graph serves every length of its bucket)."""
        steps = torch.arange(prediction.shape[1], device=prediction.device)
        kept = ((steps >= self.warmup_steps) & (steps < length)).to(prediction.dtype)[:, None]
        errors = self.elementwise(prediction, target) * kept
        return errors.sum() / (kept.sum() * prediction.shape[0] * prediction.shape[2])


def masked_form(loss: LossFn) -> MaskedLossFn | None:
    """The loss's masked form for padded batches, or ``None`` where it has none."""
    return loss.masked if isinstance(loss, MeanOverSteps) else None


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
    return MeanOverSteps(F.mse_loss, _squared_error, warmup_steps, PointwiseError("squared"))


def _squared_error(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(prediction, target, reduction="none")


@component("loss", "mse")
def mse() -> LossFn:
    """Mean squared error over every step, warm-up included."""
    return MeanOverSteps(F.mse_loss, _squared_error, 0, PointwiseError("squared"))


@component("loss", "huber")
def huber(
    *,
    delta: Annotated[float, "quadratic below, linear above this error", POSITIVE] = 1.0,
    warmup_steps: Annotated[int, "leading output steps left out (4 makes it causal)", NON_NEGATIVE] = 0,
) -> LossFn:
    """Huber loss; ``warmup_steps`` > 0 makes it causal like ``causal_mse``."""

    def loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.huber_loss(prediction, target, delta=delta)

    def elementwise(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.huber_loss(prediction, target, delta=delta, reduction="none")

    return MeanOverSteps(loss, elementwise, warmup_steps, PointwiseError("huber", delta))
