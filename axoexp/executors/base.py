"""What every executor shares: the stages of one update and the eager update itself
(the contract, :class:`axoexp.interfaces.Executor`, lives with the other interfaces)."""

from __future__ import annotations

import torch

from axoexp.interfaces import GradientTransform, LossFn

# The stages one update may contain, for the timing tags.
UPDATE_STAGES = ("zero_grad", "forward", "loss", "backward", "gradient_transform", "optimizer_step")
NOT_TIMED = ("batch_generation", "host_loss_readback", "metric_logging")


def eager_update(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    gradient_transform: GradientTransform,
    inputs: torch.Tensor,
    targets: torch.Tensor,
) -> torch.Tensor:
    """One update exactly as ``axosim.CudaGraphAdaptationStep`` captures it."""
    optimizer.zero_grad(set_to_none=False)
    loss = loss_fn(module(inputs), targets)
    loss.backward()
    if gradient_transform is not None:
        gradient_transform()
    optimizer.step()
    return loss.detach()
