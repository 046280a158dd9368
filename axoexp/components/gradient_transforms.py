"""Gradient transforms applied between backward and the optimizer step.

Each factory returns a no-argument callable over the trainable parameters (or ``None``),
the form ``axosim.CudaGraphAdaptationStep`` captures. All of them are graph-safe: none
reads a value back to the host. The callables are small dataclasses, so that a fused step
(:mod:`axoexp.executors.step_rule`) can read what they do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch

from axoexp.interfaces import GradientTransform
from axoexp.registry import POSITIVE, Bounds, component


@dataclass(frozen=True, eq=False)
class ClipNorm:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type)``."""

    parameters: list[torch.nn.Parameter]
    max_norm: float
    norm_type: float

    def __call__(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.parameters, self.max_norm, norm_type=self.norm_type)


@dataclass(frozen=True, eq=False)
class ClipValue:
    """``torch.nn.utils.clip_grad_value_(parameters, clip_value)``."""

    parameters: list[torch.nn.Parameter]
    clip_value: float

    def __call__(self) -> None:
        torch.nn.utils.clip_grad_value_(self.parameters, self.clip_value)


@component("gradient_transform", "none")
def none(*, parameters: list[torch.nn.Parameter]) -> GradientTransform:
    """Gradients as backward left them."""
    del parameters
    return None


@component("gradient_transform", "clip_norm")
def clip_norm(
    *,
    parameters: list[torch.nn.Parameter],
    max_norm: Annotated[float, "largest total gradient norm", POSITIVE] = 1.0,
    norm_type: Annotated[
        float, "p of the p-norm (inf: the largest |element|)", Bounds(low=0, low_inclusive=False, infinite=True)
    ] = 2.0,
) -> GradientTransform:
    """Scale all gradients together so their total ``norm_type`` norm is at most ``max_norm``."""
    return ClipNorm(parameters, max_norm, norm_type)


@component("gradient_transform", "clip_value")
def clip_value(
    *,
    parameters: list[torch.nn.Parameter],
    clip_value: Annotated[float, "largest |gradient element|", POSITIVE] = 1.0,
) -> GradientTransform:
    """Clamp every gradient element to [-clip_value, clip_value]."""
    return ClipValue(parameters, clip_value)
