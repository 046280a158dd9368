"""Whole-update CUDA-graph capture that consumes no update and keeps no autograd graph alive.

It does what ``axosim.CudaGraphAdaptationStep.capture`` does — warm-up updates on a side
stream, capture of zero_grad, forward, loss, backward, gradient transform and optimizer
step, then module and optimizer state restored in place — with one difference: warm-up and
capture run on the same stream, and no warm-up autograd graph survives into the capture.
A surviving graph (AxoSim-Lite keeps its last output, and with it the graph) would keep each
parameter's gradient accumulator from the warm-up stream alive into the capture, which
autograd reports as "The AccumulateGrad node's stream does not match ..." on every run.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from axoexp.executors import optimizer_calls
from axoexp.executors.base import LossAndGradients, Objective, StepFusion, eager_update, pad_steps
from axoexp.interfaces import GradientTransform, LossFn

OptimizerSnapshot = dict[torch.Tensor, dict[str, Any]]
PAD_IN_ONE_LAUNCH = importlib.util.find_spec("triton") is not None
"""Whether a bucket's batch is padded into its buffers by one Triton launch (else by torch's)."""


class ReplayShapeError(ValueError):
    """Replay inputs whose shape or dtype differ from the captured ones."""


def release_autograd_graphs(module: torch.nn.Module) -> None:
    """Detach tensors that module attributes keep with an autograd graph (e.g. Lite's last output)."""
    for submodule in module.modules():
        for name, value in list(vars(submodule).items()):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                setattr(submodule, name, value.detach())


def snapshot_optimizer(optimizer: torch.optim.Optimizer) -> OptimizerSnapshot:
    return {
        parameter: {
            key: value.detach().clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)
            for key, value in state.items()
        }
        for parameter, state in optimizer.state.items()
    }


def restore_optimizer(optimizer: torch.optim.Optimizer, snapshot: OptimizerSnapshot) -> None:
    """Put the state back in place (the graph holds these tensors); state that warm-up created
    is zeroed, which equals fresh state for Adam, AdamW and SGD without dampening."""
    for parameter, state in optimizer.state.items():
        saved = snapshot.get(parameter, {})
        for key, value in state.items():
            if key not in saved:
                if isinstance(value, torch.Tensor):
                    value.zero_()
                elif isinstance(value, (int, float)):
                    state[key] = type(value)(0)
            elif isinstance(value, torch.Tensor):
                value.copy_(saved[key])
            else:
                state[key] = copy.deepcopy(saved[key])


@contextmanager
def state_preserved(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Updates run inside leave the module and the optimizer as they were (in place: a captured
    graph keeps pointing at the same tensors), gradients zeroed."""
    module_state = {key: value.detach().clone() for key, value in module.state_dict().items()}
    optimizer_state = snapshot_optimizer(optimizer)
    try:
        yield
    finally:
        module.load_state_dict(module_state, strict=True)
        restore_optimizer(optimizer, optimizer_state)
        optimizer_calls.zero_grad(optimizer)


@dataclass
class CapturedUpdate:
    """A captured update: copy the batch into static buffers, replay, return a copy of the loss.

    With ``static_length`` the graph was captured for a length bucket (padded batches, masked
    loss): a batch of any length up to the bucket's is copied into the first steps of the
    buffers, the rest zeroed, and its length written to ``static_length``, in one launch on the
    stream (:class:`axoexp.kernels.pad.BucketPad`, set up once per bucket; five torch launches where Triton
    is missing)."""

    graph: torch.cuda.CUDAGraph
    static_inputs: torch.Tensor
    static_targets: torch.Tensor
    static_loss: torch.Tensor
    static_length: torch.Tensor | None = None
    pad: Callable[[torch.Tensor, torch.Tensor], None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.static_length is not None and PAD_IN_ONE_LAUNCH:
            from axoexp.kernels.pad import BucketPad  # Triton: imported by bucketed runs only

            self.pad = BucketPad(self.static_inputs, self.static_targets, self.static_length)

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.static_length is not None:
            steps = inputs.shape[-2]
            if steps > self.static_inputs.shape[-2]:
                raise ReplayShapeError(f"a batch of {steps} steps is longer than its bucket's graph")
            if self.pad is not None:
                self.pad(inputs, targets)
            else:
                for given, static in ((inputs, self.static_inputs), (targets, self.static_targets)):
                    static[..., :steps, :].copy_(given, non_blocking=True)
                    static[..., steps:, :].zero_()
                self.static_length.fill_(steps)
            self.graph.replay()
            return self.static_loss.clone()
        for role, given, static in (("inputs", inputs, self.static_inputs), ("targets", targets, self.static_targets)):
            if given.shape != static.shape or given.dtype != static.dtype:
                problem = (
                    f"{role} must have shape {tuple(static.shape)}"
                    if given.shape != static.shape
                    else f"{role} must have dtype {static.dtype}"
                )
                raise ReplayShapeError(
                    f"{problem}: got inputs {tuple(inputs.shape)} {inputs.dtype} and targets "
                    f"{tuple(targets.shape)} {targets.dtype}; the graph was captured for inputs "
                    f"{tuple(self.static_inputs.shape)} {self.static_inputs.dtype} and targets "
                    f"{tuple(self.static_targets.shape)} {self.static_targets.dtype}"
                )
        self.static_inputs.copy_(inputs, non_blocking=True)
        self.static_targets.copy_(targets, non_blocking=True)
        self.graph.replay()
        return self.static_loss.clone()


def capture_update(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    transform: GradientTransform,
    example_inputs: torch.Tensor,
    example_targets: torch.Tensor,
    *,
    warmup_steps: int,
    bucket: int | None = None,
    pool: Any = None,
    fused_step: StepFusion | None = None,
    objective: Objective | None = None,
    loss_and_gradients: LossAndGradients | None = None,
) -> CapturedUpdate:
    """Capture one whole update for these shapes; module and optimizer end as they began.

    With ``bucket``, for batches of up to ``bucket`` steps: the example is padded to it and the
    loss masked to a length read from a static device scalar. ``pool``: the memory pool the
    graph allocates from (``torch.cuda.graph_pool_handle()``, shared by a run's bucket graphs).
    ``fused_step``, ``objective`` and ``loss_and_gradients``: as in :func:`eager_update`."""
    static_length = None
    if bucket is None:
        static_inputs, static_targets = example_inputs.clone(), example_targets.clone()
    else:
        static_inputs, static_targets = pad_steps(example_inputs, bucket), pad_steps(example_targets, bucket)
        static_length = torch.tensor(example_inputs.shape[-2], device=example_inputs.device)
    batch = (static_inputs, static_targets, static_length)
    with state_preserved(module, optimizer):
        release_autograd_graphs(module)
        stream = torch.cuda.Stream(example_inputs.device)
        stream.wait_stream(torch.cuda.current_stream(example_inputs.device))
        update = functools.partial(
            eager_update,
            module,
            optimizer,
            loss_fn,
            transform,
            *batch,
            fused_step=fused_step,
            objective=objective,
            loss_and_gradients=loss_and_gradients,
        )
        with torch.cuda.stream(stream):
            for _ in range(warmup_steps):
                update()
                release_autograd_graphs(module)  # no warm-up graph (nor its accumulators) outlives its update
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            static_loss = update()
        release_autograd_graphs(module)
        torch.cuda.current_stream(example_inputs.device).wait_stream(stream)
        torch.cuda.synchronize(example_inputs.device)
    torch.cuda.synchronize(example_inputs.device)
    return CapturedUpdate(graph, static_inputs, static_targets, static_loss, static_length)
