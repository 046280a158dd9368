"""Executors that run the population forward through ``torch.compile`` (inductor)."""

from __future__ import annotations

import torch

from axoexp.executors.base import Executor, eager_update
from axoexp.executors.cudagraph import CudaGraphExecutor
from axoexp.registry import component
from axoexp.timing import stopwatch, synchronizer

COMPILE_STAGES = ("dynamo_trace", "inductor_codegen", "forward", "loss", "backward", "grad_reset", "synchronize")


def _forward_backward_without_update(
    executor: Executor, module: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> None:
    """Run forward and backward (compiling both graphs) and drop the gradients: no update."""
    executor.loss_fn(module(inputs), targets).backward()
    executor.optimizer.zero_grad(set_to_none=False)


@component("executor", "compiled_cudagraph")
class CompiledCudaGraphExecutor(CudaGraphExecutor):
    """Inductor-compiled forward (static shapes, no cudagraph trees), then the whole update
    captured in one CUDA graph with axosim's helper, exactly as ``cudagraph`` does.

    ``prepare`` reports ``compile`` (tracing and code generation, triggered by one forward
    and backward whose gradients are discarded) separately from ``capture``.
    """

    def __init__(self, *, warmup_steps: int = 3, **components: object) -> None:
        super().__init__(warmup_steps=warmup_steps, **components)
        self.compiled = torch.compile(
            self.module, backend="inductor", dynamic=False, options={"triton.cudagraphs": False}
        )

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        return {"compile": COMPILE_STAGES, **super().prepare_includes()}

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        phases: dict[str, float] = {}
        with stopwatch(synchronizer(example_inputs.device), phases, "compile"):
            _forward_backward_without_update(self, self.compiled, example_inputs, example_targets)
        with stopwatch(synchronizer(example_inputs.device), phases, "capture"):
            self.graph_step = self.capture(self.compiled, example_inputs, example_targets)
        return phases


@component("executor", "compiled_reduce_overhead")
class CompiledReduceOverheadExecutor(Executor):
    """``torch.compile(mode="reduce-overhead")``: inductor's CUDA-graph trees replay the
    compiled forward and backward; loss, gradient transform and optimizer step run eagerly.

    Each update starts with ``torch.compiler.cudagraph_mark_step_begin()``, so the trees
    may reuse the previous update's output memory (the returned loss is a fresh tensor).
    """

    requires_cuda = True
    update_includes = ("cudagraph_mark_step_begin", "zero_grad", "forward_graph_replay", "loss",
                       "backward_graph_replay", "gradient_transform", "optimizer_step", "synchronize")

    def __init__(self, *, recording_steps: int = 3, **components: object) -> None:
        super().__init__(**components)  # type: ignore[arg-type]
        if recording_steps < 1:
            raise ValueError(f"executor.recording_steps must be at least 1, got {recording_steps}")
        self.recording_steps = recording_steps
        self.compiled = torch.compile(self.module, mode="reduce-overhead", dynamic=False)

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        return {"compile": (f"{self.recording_steps}x_forward_backward_without_update",
                            *COMPILE_STAGES, "cudagraph_tree_warmup_and_recording")}

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        phases: dict[str, float] = {}
        with stopwatch(synchronizer(example_inputs.device), phases, "compile"):
            for _ in range(self.recording_steps):
                torch.compiler.cudagraph_mark_step_begin()
                _forward_backward_without_update(self, self.compiled, example_inputs, example_targets)
        return phases

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()
        return eager_update(
            self.compiled, self.optimizer, self.loss_fn, self.gradient_transform, inputs, targets
        )
