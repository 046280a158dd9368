"""Example user plugin: a causal log-cosh loss, selectable as ``loss=log_cosh``.

Any ``*.py`` file here is imported by ``python -m axoexp`` (set ``AXOEXP_PLUGINS_DIR`` to
use another directory). It needs no YAML file: the factory's keyword defaults become the
config, so ``loss=log_cosh loss.warmup_steps=8`` works. Plugins are code: keep only
trusted files here.
"""

import math
from typing import Annotated

import torch
import torch.nn.functional as F

from axoexp import component
from axoexp.components.losses import skip_warmup
from axoexp.interfaces import LossFn
from axoexp.registry import NON_NEGATIVE


@component("loss", "log_cosh")
def log_cosh(*, warmup_steps: Annotated[int, "leading output steps left out of the loss", NON_NEGATIVE] = 4) -> LossFn:
    """mean(log(cosh(prediction - target))) after the warm-up steps: MSE-like near 0, L1-like far."""

    def loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        difference = prediction - target
        return torch.mean(difference + F.softplus(-2.0 * difference) - math.log(2.0))

    return skip_warmup(loss, warmup_steps)
