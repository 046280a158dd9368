"""docs/plugins.md's optimizer and gradient transform of one's own: RMSprop and a gradient scale."""

from typing import Annotated

import torch

from axoexp import component
from axoexp.interfaces import GradientTransform
from axoexp.registry import POSITIVE, Bounds


@component("optimizer", "rmsprop")
def rmsprop(
    *,
    parameters: list[torch.nn.Parameter],
    capturable: bool,
    lr: Annotated[float, "learning rate", POSITIVE] = 1e-3,
    alpha: Annotated[float, "squared-gradient decay", Bounds(0, 1, high_inclusive=False)] = 0.99,
) -> torch.optim.Optimizer:
    """RMSprop (torch.optim.RMSprop); capturable keeps its step count on the device, as a CUDA graph needs."""
    return torch.optim.RMSprop(parameters, lr=lr, alpha=alpha, capturable=capturable)


@component("gradient_transform", "scale")
def scale(
    *, parameters: list[torch.nn.Parameter], factor: Annotated[float, "multiplies every gradient", POSITIVE] = 0.5
) -> GradientTransform:
    """Every gradient times ``factor``, in place: graph-safe, it reads nothing back to the host."""

    def scaled() -> None:
        torch._foreach_mul_([parameter.grad for parameter in parameters if parameter.grad is not None], factor)

    return scaled
