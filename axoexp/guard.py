"""The results guard: a run whose loss or parameters stop being finite ends FAILED.

A NaN or infinite loss (a too-large learning rate, a dtype too narrow) makes every later
timing a measurement of garbage; :class:`FiniteGuard` stops the run at the first such
update, naming it, while everything measured before it is logged as usual.
"""

from __future__ import annotations

import math

import torch

from axoexp import names
from axoexp.errors import NonFiniteResultError
from axoexp.interfaces import RunLog
from axoexp.windows import Observer


class FiniteGuard(Observer):
    """Checks the loss and the trainable parameters after every timed update (outside the clock)."""

    def __init__(self, module: torch.nn.Module, run: RunLog) -> None:
        self.parameters = [
            (name, parameter) for name, parameter in module.named_parameters() if parameter.requires_grad
        ]
        self.run = run

    def update_finished(self, window: str, index: int, latency_ms: float, loss: float, bucket: int | None) -> None:
        problem = None
        if not math.isfinite(loss):
            problem = f"its loss is {loss}"
        elif self.parameters and not bool(
            torch.stack([parameter.detach().isfinite().all() for _, parameter in self.parameters]).all()
        ):
            bad = next(name for name, parameter in self.parameters if not parameter.detach().isfinite().all())
            problem = f"parameter {bad} holds non-finite values"
        if problem is None:
            return
        self.run.set_tags({names.NON_FINITE_UPDATE: f"{index} ({window})"})
        raise NonFiniteResultError(
            f"update {index} ({window}) produced a non-finite result: {problem}; the run's results are "
            f"invalid, so it ends FAILED; what was measured up to it is logged "
            "(usual causes: optimizer.lr too large or not finite, or a dtype too narrow for the workload)"
        )
