"""What a fused step computes: the optimizer and gradient transform as plain numbers, read from the
built torch optimizer and transform, and what it cannot compute exactly, judged from the config
while planning. No Triton here: planning imports this module.

The fused step (:mod:`axoexp.executors.fused_step`, whose kernels are in
:mod:`axoexp.kernels.fused_step`) reproduces, over one flat view of the banks, exactly these:
``optimizer=adam``, ``adamw`` and ``sgd`` (any momentum, Nesterov, weight decay) after
``gradient_transform=none``, ``clip_value`` and ``clip_norm`` with ``norm_type`` 1, 2 or inf.
Anything else (another p-norm, a plugin's optimizer or transform) is refused with ``fused_step=true``;
``auto`` (the default) runs torch's step for it instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from axoexp.components.gradient_transforms import ClipNorm, ClipValue
from axoexp.errors import IncompatibleComponentsError
from axoexp.interfaces import GradientTransform

FUSED_STEP_KEY = "fused_step"
OPTIMIZERS = ("adam", "adamw", "sgd")
TRANSFORMS = ("none", "clip_norm", "clip_value")
NORMS = (1.0, 2.0, math.inf)
"""The p-norms the fused step reduces exactly as ``clip_grad_norm_`` does (sums of |g| or g^2, a max)."""


@dataclass(frozen=True)
class StepRule:
    """One update's gradient transform and optimizer step, as the fused kernel takes them."""

    optimizer: str  # one of OPTIMIZERS
    lr: float
    weight_decay: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    eps: float = 0.0
    momentum: float = 0.0
    nesterov: bool = False
    transform: str = "none"  # one of TRANSFORMS
    max_norm: float = 0.0
    norm_type: float = 2.0
    clip_value: float = 0.0

    @property
    def state_keys(self) -> tuple[str, ...]:
        """The per-parameter tensors torch keeps in ``optimizer.state`` for this rule (step apart)."""
        if self.optimizer == "sgd":
            return ("momentum_buffer",) if self.momentum else ()
        return ("exp_avg", "exp_avg_sq")


def _flags(group: Mapping[str, Any], refused: dict[str, object]) -> None:
    for key, allowed in refused.items():
        if key in group and group[key] != allowed:
            raise IncompatibleComponentsError(
                f"executor.{FUSED_STEP_KEY}=true cannot fuse an optimizer with {key}={group[key]!r} (only {allowed!r})"
            )


def step_rule(optimizer: torch.optim.Optimizer, transform: GradientTransform) -> StepRule:
    """The rule of ``optimizer`` (one parameter group) after ``transform``; what the fused step
    cannot compute exactly raises :class:`IncompatibleComponentsError` naming it."""
    if len(optimizer.param_groups) != 1:
        raise IncompatibleComponentsError(f"executor.{FUSED_STEP_KEY}=true fuses an optimizer of one parameter group")
    group = optimizer.param_groups[0]
    if isinstance(group["lr"], torch.Tensor):
        raise IncompatibleComponentsError(f"executor.{FUSED_STEP_KEY}=true takes a float learning rate, not a tensor")
    _flags(group, {"maximize": False, "differentiable": False, "amsgrad": False})
    kind = type(optimizer)
    if kind in (torch.optim.Adam, torch.optim.AdamW):
        decoupled = kind is torch.optim.AdamW or bool(group.get("decoupled_weight_decay", False))
        beta1, beta2 = (float(beta) for beta in group["betas"])
        rule = StepRule(
            "adamw" if decoupled else "adam",
            float(group["lr"]),
            float(group["weight_decay"]),
            beta1=beta1,
            beta2=beta2,
            eps=float(group["eps"]),
        )
    elif kind is torch.optim.SGD:
        _flags(group, {"dampening": 0})
        rule = StepRule(
            "sgd",
            float(group["lr"]),
            float(group["weight_decay"]),
            momentum=float(group["momentum"]),
            nesterov=bool(group["nesterov"]),
        )
    else:
        raise IncompatibleComponentsError(
            f"executor.{FUSED_STEP_KEY}=true fuses torch.optim.Adam, AdamW and SGD, not {kind.__name__}"
        )
    if transform is None:
        return rule
    if isinstance(transform, ClipValue):
        return StepRule(**{**vars(rule), "transform": "clip_value", "clip_value": float(transform.clip_value)})
    if isinstance(transform, ClipNorm):
        if float(transform.norm_type) not in NORMS:
            raise IncompatibleComponentsError(norm_problem(transform.norm_type))
        return StepRule(
            **{
                **vars(rule),
                "transform": "clip_norm",
                "max_norm": float(transform.max_norm),
                "norm_type": float(transform.norm_type),
            }
        )
    raise IncompatibleComponentsError(
        f"executor.{FUSED_STEP_KEY}=true fuses the gradient transforms {', '.join(TRANSFORMS)}, not {transform!r}"
    )


def norm_problem(norm_type: object) -> str:
    return (
        f"executor.{FUSED_STEP_KEY}=true cannot fuse gradient_transform.norm_type={norm_type}: it reduces "
        "the 1-, 2- and inf-norm exactly; set gradient_transform.norm_type to 1, 2 or inf, "
        f"or executor.{FUSED_STEP_KEY}=false"
    )


def fused_step_problem(config: Mapping[str, Any]) -> str | None:
    """Why the config's optimizer and gradient transform cannot be fused exactly (``None`` if they
    can), judged by their names and settings while planning, before anything is built."""
    optimizer = str(config["optimizer"]["name"])
    transform = config["gradient_transform"]
    if optimizer not in OPTIMIZERS:
        return (
            f"executor.{FUSED_STEP_KEY}=true fuses optimizer={', '.join(OPTIMIZERS)}, not optimizer={optimizer}; "
            f"choose one of those or executor.{FUSED_STEP_KEY}=false"
        )
    if str(transform["name"]) not in TRANSFORMS:
        return (
            f"executor.{FUSED_STEP_KEY}=true fuses gradient_transform={', '.join(TRANSFORMS)}, not "
            f"gradient_transform={transform['name']}; choose one of those or executor.{FUSED_STEP_KEY}=false"
        )
    if str(transform["name"]) == "clip_norm":
        try:
            norm = float(transform["norm_type"])
        except (TypeError, ValueError):
            return None  # a bad value: its bounds check says so
        if norm not in NORMS:
            return norm_problem(transform["norm_type"])
    return None
