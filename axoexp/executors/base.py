"""What every executor shares: the stages of one update and the eager update itself
(the contract, :class:`axoexp.interfaces.Executor`, lives with the other interfaces)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import torch

from axoexp.components.losses import masked_form
from axoexp.errors import IncompatibleComponentsError
from axoexp.executors import optimizer_calls
from axoexp.interfaces import STREAM_AXIS_RANK, GradientTransform, LossFn

# The stages one update may contain, for the timing tags.
UPDATE_STAGES = ("zero_grad", "forward", "loss", "backward", "gradient_transform", "optimizer_step")
NOT_TIMED = ("batch_generation", "host_loss_readback", "metric_logging")


class StepFusion(Protocol):
    """The gradient transform and optimizer step as one call, over gradients it zeroes itself
    (:class:`axoexp.executors.fused_step.FusedStep`)."""

    def __call__(self) -> None: ...

    def zero_grad(self) -> None:
        """Zero every gradient the step reads, in place (as ``optimizer.zero_grad(set_to_none=False)``)."""


Objective = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""``objective(inputs, targets, length)``: the forward and loss of one update, differentiable in the
banks (:func:`batch_loss` by default; the fused executor's runs the loss in its kernels)."""

LossAndGradients = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""``loss_and_gradients(inputs, targets, length)``: an :data:`Objective` and its backward without
autograd: returns the 0-dim loss, having added the banks' gradients into their zeroed ``.grad``
itself (the fused executor's kernels, :func:`axoexp.kernels.lite_recurrence.lite_front_loss_and_gradients`)."""


def batch_loss(
    module: torch.nn.Module,
    loss_fn: LossFn,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    length: torch.Tensor | None = None,
) -> torch.Tensor:
    """Forward and loss of one update. One stream: ``loss_fn(module(inputs), targets)``. B streams
    (inputs with a leading stream axis, :data:`axoexp.interfaces.Batch`): the predictions of
    ``module.forward_batch(inputs)`` and the mean over streams of each stream's ``loss_fn``,
    computed for all streams at once (``torch.vmap``), so that each stream's loss is the loss's own
    definition whatever its reduction or slicing. With ``length`` (a 0-dim tensor), inputs and targets
    are padded at the end of the time axis and the loss is the loss's masked form over the first
    ``length`` steps (:func:`axoexp.components.losses.masked_form`)."""
    if length is not None:
        masked = masked_form(loss_fn)
        if masked is None:
            raise IncompatibleComponentsError("this loss has no masked form, so padded batches cannot be adapted to")
        loss_fn = functools.partial(masked, length=length)  # type: ignore[call-arg]
    if inputs.dim() != STREAM_AXIS_RANK:
        return loss_fn(predictions(module, inputs), targets)
    return torch.vmap(loss_fn)(predictions(module, inputs), targets).mean()


def predictions(module: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """The population's predictions of ``inputs``: ``module(inputs)`` for one stream, and
    ``module.forward_batch(inputs)`` for inputs with a leading stream axis."""
    if inputs.dim() != STREAM_AXIS_RANK:
        return module(inputs)
    forward_batch: Callable[[torch.Tensor], torch.Tensor] = module.forward_batch  # type: ignore[assignment]
    return forward_batch(inputs)


def pad_steps(tensor: torch.Tensor, steps: int) -> torch.Tensor:
    """``tensor`` with zeros appended along its time axis (the second last) up to ``steps``."""
    return torch.nn.functional.pad(tensor, (0, 0, 0, steps - tensor.shape[-2]))


def eager_update(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    gradient_transform: GradientTransform,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    length: torch.Tensor | None = None,
    *,
    fused_step: StepFusion | None = None,
    objective: Objective | None = None,
    loss_and_gradients: LossAndGradients | None = None,
) -> torch.Tensor:
    """One update exactly as ``axosim.CudaGraphAdaptationStep`` captures it (with ``length``: on a
    padded batch, whose padded steps contribute nothing, :func:`batch_loss`). ``fused_step``, when
    given, zeroes the gradients and does the gradient transform and the optimizer step in one call
    each (:class:`axoexp.executors.fused_step.FusedStep`); ``objective``, when given, the forward and
    loss; ``loss_and_gradients``, when given, the forward, loss and backward (no autograd)."""
    if fused_step is None:
        optimizer_calls.zero_grad(optimizer)
    else:
        fused_step.zero_grad()
    if loss_and_gradients is not None:
        loss = loss_and_gradients(inputs, targets, length)
    else:
        loss = (
            batch_loss(module, loss_fn, inputs, targets, length)
            if objective is None
            else objective(inputs, targets, length)
        )
        loss.backward()
    if fused_step is not None:
        fused_step()
        return loss.detach()
    if gradient_transform is not None:
        gradient_transform()
    optimizer_calls.step(optimizer)
    return loss.detach()
