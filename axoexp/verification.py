"""Parity: does an executor compute the same updates as the eager reference?"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from axoexp.errors import VerificationError
from axoexp.interfaces import Batch, Executor, adaptation_parameters
from axoexp.timing import synchronizer

BuildExecutor = Callable[[torch.nn.Module, str | None], Executor]
"""``build(module, executor_name)``: a fresh executor (with optimizer) around ``module``;
``None`` names the planned executor (:meth:`axoexp.plan.Plan.build_executor`)."""
REFERENCE = "eager"


@dataclass(frozen=True)
class Verification:
    """Largest differences between K eager and K executor updates from one initial state."""

    executor: str
    updates: int
    max_abs_loss_diff: float
    max_abs_param_diff: float
    max_abs_param_change: float
    loss_atol: float
    param_atol: float

    @property
    def passed(self) -> bool:
        return self.max_abs_loss_diff <= self.loss_atol and self.max_abs_param_diff <= self.param_atol

    def metrics(self) -> dict[str, float]:
        return {
            "verify_max_abs_loss_diff": self.max_abs_loss_diff,
            "verify_max_abs_param_diff": self.max_abs_param_diff,
            "verify_max_abs_param_change": self.max_abs_param_change,
            "verify_passed": float(self.passed),
        }

    def raise_if_failed(self) -> None:
        if not self.passed:
            raise VerificationError(
                f"executor={self.executor} differs from eager after {self.updates} updates: "
                f"max |loss diff| {self.max_abs_loss_diff:.3e} (tolerance {self.loss_atol:.1e}), "
                f"max |parameter diff| {self.max_abs_param_diff:.3e} (tolerance {self.param_atol:.1e})"
            )


def _prepared(build: BuildExecutor, pristine: torch.nn.Module, name: str | None, example: Batch) -> Executor:
    executor = build(copy.deepcopy(pristine), name)
    executor.prepare(*example)
    return executor


def _adapt(executor: Executor, batches: list[Batch], updates: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    losses = [executor.step(*batches[index % len(batches)]) for index in range(updates)]
    synchronizer(batches[0][0].device)()
    return losses, [parameter.detach().clone() for parameter in adaptation_parameters(executor.module)]


def _max_abs_diff(left: list[torch.Tensor], right: list[torch.Tensor]) -> float:
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(left, right, strict=True))


def verify_parity(
    build: BuildExecutor,
    executor_name: str,
    pristine: torch.nn.Module,
    batches: list[Batch],
    updates: int,
    loss_atol: float,
    param_atol: float,
    prepared: Executor | None = None,
) -> Verification:
    """Run ``updates`` eager and ``updates`` executor updates from copies of ``pristine``.

    ``prepared``, when given, is the planned executor already prepared on an unchanged copy
    of ``pristine`` (so a benchmark need not compile twice); it is then adapted in place.
    """
    reference_losses, reference_params = _adapt(_prepared(build, pristine, REFERENCE, batches[0]), batches, updates)
    executor = prepared if prepared is not None else _prepared(build, pristine, None, batches[0])
    losses, params = _adapt(executor, batches, updates)
    initial = [parameter.detach() for parameter in adaptation_parameters(pristine)]
    return Verification(
        executor=executor_name,
        updates=updates,
        max_abs_loss_diff=_max_abs_diff(reference_losses, losses),
        max_abs_param_diff=_max_abs_diff(reference_params, params),
        max_abs_param_change=_max_abs_diff(reference_params, initial),
        loss_atol=loss_atol,
        param_atol=param_atol,
    )
