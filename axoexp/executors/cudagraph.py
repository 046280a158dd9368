"""The whole update captured once in a CUDA graph and replayed (:mod:`axoexp.executors.capture`)."""

from __future__ import annotations

from typing import Annotated

import torch

from axoexp.executors.base import UPDATE_STAGES
from axoexp.executors.capture import CapturedUpdate, capture_update
from axoexp.interfaces import Executor
from axoexp.registry import AT_LEAST_ONE, component
from axoexp.timing import stopwatch, synchronizer

WarmupSteps = Annotated[int, "eager updates on a side stream before capture (state is restored)", AT_LEAST_ONE]
CAPTURE_STAGES = ("graph_capture", "module_and_optimizer_state_restore", "synchronize")


@component("executor", "cudagraph")
class CudaGraphExecutor(Executor):
    """Captures zero_grad, forward, loss, backward, gradient transform and optimizer step.

    Each replay copies the inputs and targets into the graph's static buffers (device to
    device), replays the graph and clones the loss. ``warmup_steps`` eager updates run on
    a side stream before capture; module and optimizer state are restored afterwards, so
    capture consumes no update. The graph is the one ``axosim.CudaGraphAdaptationStep``
    captures (the benchmark compares the two).
    """

    requires_cuda = True
    requires_capturable_optimizer = True
    update_includes = ("input_copy", "graph_replay", *UPDATE_STAGES, "loss_clone", "synchronize")

    def __init__(self, *, warmup_steps: WarmupSteps = 3, **components: object) -> None:
        super().__init__(**components)  # type: ignore[arg-type]
        self.warmup_steps = warmup_steps
        self.graph_step: CapturedUpdate | None = None

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        warmup = f"{self.warmup_steps}x_warmup_update({'+'.join(UPDATE_STAGES)})_on_side_stream"
        return {"capture": ("static_buffer_copy", warmup, *CAPTURE_STAGES)}

    def captured_forward(self) -> torch.nn.Module:
        """The forward the graph captures: the population itself here."""
        return self.module

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        phases: dict[str, float] = {}
        with stopwatch(synchronizer(example_inputs.device), phases, "capture"):
            self.graph_step = self.capture(self.captured_forward(), example_inputs, example_targets)
        return phases

    def capture(
        self, module: torch.nn.Module, example_inputs: torch.Tensor, example_targets: torch.Tensor
    ) -> CapturedUpdate:
        """Capture the whole update with ``module`` as the forward (e.g. a compiled one)."""
        return capture_update(
            module,
            self.optimizer,
            self.loss_fn,
            self.gradient_transform,
            example_inputs,
            example_targets,
            warmup_steps=self.warmup_steps,
        )

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.graph_step is None:
            raise RuntimeError("CudaGraphExecutor.step called before prepare (nothing captured)")
        return self.graph_step(inputs, targets)
