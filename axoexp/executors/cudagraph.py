"""The whole update captured once in a CUDA graph and replayed, via axosim's helper."""

from __future__ import annotations

from typing import Annotated

import torch
from axosim import CudaGraphAdaptationStep

from axoexp.executors.base import UPDATE_STAGES, Executor
from axoexp.registry import AT_LEAST_ONE, component
from axoexp.timing import stopwatch, synchronizer

WarmupSteps = Annotated[int, "eager updates on a side stream before capture (state is restored)", AT_LEAST_ONE]
CAPTURE_STAGES = ("graph_capture", "module_and_optimizer_state_restore", "synchronize")


def release_autograd_graphs(module: torch.nn.Module) -> None:
    """Detach tensors that module attributes keep with an autograd graph.

    AxoSim-Lite keeps its last output (``base_soma_prediction``) and with it that update's
    autograd graph. The graph pins each parameter's gradient accumulator to the stream it
    was made on; after an update on the legacy default stream, a capture would then have to
    wait on that stream, which CUDA forbids. Capture needs none of those graphs.
    """
    for submodule in module.modules():
        for name, value in list(vars(submodule).items()):
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                setattr(submodule, name, value.detach())


class ReplayShapeError(ValueError):
    """Replay inputs whose shape or dtype differ from the captured ones."""


@component("executor", "cudagraph")
class CudaGraphExecutor(Executor):
    """Captures zero_grad, forward, loss, backward, gradient transform and optimizer step.

    Each replay copies the inputs and targets into the graph's static buffers (device to
    device), replays the graph and clones the loss. ``warmup_steps`` eager updates run on
    a side stream before capture; axosim restores module and optimizer state afterwards,
    so capture consumes no update.
    """

    requires_cuda = True
    requires_capturable_optimizer = True
    update_includes = ("input_copy", "graph_replay", *UPDATE_STAGES, "loss_clone", "synchronize")

    def __init__(self, *, warmup_steps: WarmupSteps = 3, **components: object) -> None:
        super().__init__(**components)  # type: ignore[arg-type]
        self.warmup_steps = warmup_steps
        self.graph_step: CudaGraphAdaptationStep | None = None

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        warmup = f"{self.warmup_steps}x_warmup_update({'+'.join(UPDATE_STAGES)})_on_side_stream"
        return {"capture": ("static_buffer_copy", warmup, *CAPTURE_STAGES)}

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        phases: dict[str, float] = {}
        with stopwatch(synchronizer(example_inputs.device), phases, "capture"):
            self.graph_step = self.capture(self.module, example_inputs, example_targets)
        return phases

    def capture(
        self, module: torch.nn.Module, example_inputs: torch.Tensor, example_targets: torch.Tensor
    ) -> CudaGraphAdaptationStep:
        release_autograd_graphs(self.module)
        return CudaGraphAdaptationStep.capture(
            module, self.optimizer, example_inputs, example_targets, self.loss_fn,
            warmup_steps=self.warmup_steps, gradient_transform=self.gradient_transform,
        )

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.graph_step is None:
            raise RuntimeError("CudaGraphExecutor.step called before prepare (nothing captured)")
        try:
            return self.graph_step(inputs, targets)
        except ValueError as error:
            captured = self.graph_step
            raise ReplayShapeError(
                f"{error}: got inputs {tuple(inputs.shape)} {inputs.dtype} and targets "
                f"{tuple(targets.shape)} {targets.dtype}; the graph was captured for inputs "
                f"{tuple(captured.static_inputs.shape)} {captured.static_inputs.dtype} and targets "
                f"{tuple(captured.static_targets.shape)} {captured.static_targets.dtype}"
            ) from error
