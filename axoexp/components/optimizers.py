"""Optimizers over a population's trainable adaptation banks.

``capturable`` is decided by the framework from the executor and the group setting
``optimizer.capturable`` (see :func:`axoexp.plan.resolve_capturable`): a CUDA-Graph executor needs an optimizer
whose step keeps its state on the device and never syncs with the host.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any

import torch

from axoexp.registry import NON_NEGATIVE, POSITIVE, Bounds, component

LR = Annotated[float, "learning rate", POSITIVE]
BETA1 = Annotated[float, "first-moment decay", Bounds(0, 1, high_inclusive=False)]
BETA2 = Annotated[float, "second-moment decay", Bounds(0, 1, high_inclusive=False)]
EPS = Annotated[float, "added to the denominator", POSITIVE]


@component("optimizer", "adam")
def adam(
    *,
    parameters: Iterable[torch.nn.Parameter],
    capturable: bool,
    lr: LR = 1e-3,
    beta1: BETA1 = 0.9,
    beta2: BETA2 = 0.999,
    eps: EPS = 1e-8,
    weight_decay: Annotated[float, "L2 penalty added to the gradient", NON_NEGATIVE] = 0.0,
) -> torch.optim.Optimizer:
    """Adam (torch.optim.Adam)."""
    return torch.optim.Adam(
        parameters,
        lr=lr,
        betas=(beta1, beta2),
        eps=eps,
        weight_decay=weight_decay,
        capturable=capturable,
    )


@component("optimizer", "adamw")
def adamw(
    *,
    parameters: Iterable[torch.nn.Parameter],
    capturable: bool,
    lr: LR = 1e-3,
    beta1: BETA1 = 0.9,
    beta2: BETA2 = 0.999,
    eps: EPS = 1e-8,
    weight_decay: Annotated[float, "decoupled weight decay", NON_NEGATIVE] = 0.01,
) -> torch.optim.Optimizer:
    """AdamW (torch.optim.AdamW): Adam with decoupled weight decay."""
    return torch.optim.AdamW(
        parameters,
        lr=lr,
        betas=(beta1, beta2),
        eps=eps,
        weight_decay=weight_decay,
        capturable=capturable,
    )


@component("optimizer", "sgd")
def sgd(
    *,
    parameters: Iterable[torch.nn.Parameter],
    capturable: bool,
    lr: LR = 1e-2,
    momentum: Annotated[float, "momentum factor (0: none)", Bounds(0, 1)] = 0.0,
    nesterov: Annotated[bool, "Nesterov momentum"] = False,
    weight_decay: Annotated[float, "L2 penalty added to the gradient", NON_NEGATIVE] = 0.0,
) -> torch.optim.Optimizer:
    """Plain SGD. It has no host-side state, so it is graph-safe whatever ``capturable`` says.

    Dampening is not offered: CUDA-Graph capture restores a fresh momentum buffer as zeros,
    which equals eager SGD's first step only without dampening.
    """
    del capturable
    return torch.optim.SGD(parameters, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)


def sgd_problems(params: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """What planning refuses in ``sgd``'s settings (defaults included): Nesterov without momentum."""
    if params["nesterov"] and not params["momentum"]:
        return [
            f"optimizer.nesterov=true needs momentum, but optimizer.momentum={params['momentum']!r}; set it above 0"
        ]
    return []


sgd.config_problems = sgd_problems  # type: ignore[attr-defined]
