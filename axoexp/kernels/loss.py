"""The losses the fused kernels compute, as their callers name them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class KernelLoss:
    """The mean ``error`` (``squared``, or ``huber`` with threshold ``delta``) over the rows, the
    outputs and the steps from ``warmup_steps`` on, as :class:`axoexp.components.losses.MeanOverSteps`
    defines it."""

    error: str
    warmup_steps: int
    delta: float = 0.0
