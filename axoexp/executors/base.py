"""What every executor shares: the stages of one update and the eager update itself
(the contract, :class:`axoexp.interfaces.Executor`, lives with the other interfaces)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from axoexp.interfaces import STREAM_AXIS_RANK, GradientTransform, LossFn

# The stages one update may contain, for the timing tags.
UPDATE_STAGES = ("zero_grad", "forward", "loss", "backward", "gradient_transform", "optimizer_step")
NOT_TIMED = ("batch_generation", "host_loss_readback", "metric_logging")


def batch_loss(module: torch.nn.Module, loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Forward and loss of one update. One stream: ``loss_fn(module(inputs), targets)``. B streams
    (inputs with a leading stream axis, :data:`axoexp.interfaces.Batch`): the predictions of
    ``module.forward_batch(inputs)`` and the mean over streams of each stream's ``loss_fn``,
    computed for all streams at once (``torch.vmap``), so that each stream's loss is the loss's own
    definition whatever its reduction or slicing."""
    if inputs.dim() != STREAM_AXIS_RANK:
        return loss_fn(module(inputs), targets)
    forward_batch: Callable[[torch.Tensor], torch.Tensor] = module.forward_batch  # type: ignore[assignment]
    return torch.vmap(loss_fn)(forward_batch(inputs), targets).mean()


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
    loss = batch_loss(module, loss_fn, inputs, targets)
    loss.backward()
    if gradient_transform is not None:
        gradient_transform()
    optimizer.step()
    return loss.detach()
