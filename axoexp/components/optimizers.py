"""Optimizers over a population's trainable adaptation banks.

``capturable`` is decided by the framework from the executor (see
:func:`axoexp.experiment.resolve_capturable`): a CUDA-Graph executor needs an optimizer
whose step keeps its state on the device and never syncs with the host.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from axoexp.registry import component


@component("optimizer", "adam")
def adam(
    *, parameters: Iterable[torch.nn.Parameter], capturable: bool, lr: float = 1e-3,
    beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    return torch.optim.Adam(
        parameters, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay,
        capturable=capturable,
    )


@component("optimizer", "adamw")
def adamw(
    *, parameters: Iterable[torch.nn.Parameter], capturable: bool, lr: float = 1e-3,
    beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01,
) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        parameters, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay,
        capturable=capturable,
    )


@component("optimizer", "sgd")
def sgd(
    *, parameters: Iterable[torch.nn.Parameter], capturable: bool, lr: float = 1e-2,
    momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """Plain SGD. It has no host-side state, so it is graph-safe whatever ``capturable`` says.

    Dampening is not offered: CUDA-Graph capture restores a fresh momentum buffer as zeros,
    which equals eager SGD's first step only without dampening.
    """
    del capturable
    return torch.optim.SGD(
        parameters, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay
    )
