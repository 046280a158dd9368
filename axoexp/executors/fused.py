"""AxoSim-Lite's recurrence as one hand-fused Triton kernel, and the whole update captured."""

from __future__ import annotations

import torch
from axosim import AxoSimPopulation

from axoexp.errors import IncompatibleComponentsError
from axoexp.executors.base import UPDATE_STAGES
from axoexp.executors.cudagraph import CudaGraphExecutor, WarmupSteps
from axoexp.kernels.lite_population import fused_population_forward, fused_refusal, unsupported_reason
from axoexp.registry import component


class FusedLiteForward(torch.nn.Module):
    """``population(inputs)`` with the P4 recurrence in the fused kernels (same parameters)."""

    def __init__(self, population: AxoSimPopulation) -> None:
        super().__init__()
        self.population = population

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return fused_population_forward(self.population, inputs)

    def forward_batch(self, inputs: torch.Tensor) -> torch.Tensor:
        """B streams: the kernel's rows are B x neurons."""
        return fused_population_forward(self.population, inputs)


@component("executor", "fused_cudagraph")
class FusedCudaGraphExecutor(CudaGraphExecutor):
    """The forward's P4 recurrence runs as one Triton launch (backward: one more, in reverse
    order) for every block of neurons; contact summaries, loss, gradient transform and
    optimizer step stay torch; the whole update is captured in one CUDA graph. float32,
    AxoSim-Lite populations, adaptation banks only."""

    update_includes = ("input_copy", "graph_replay", *UPDATE_STAGES, "loss_clone", "synchronize")

    def __init__(self, *, warmup_steps: WarmupSteps = 3, **components: object) -> None:
        super().__init__(warmup_steps=warmup_steps, **components)
        self.fused = FusedLiteForward(self.module)

    @classmethod
    def refusal(cls, *, module: torch.nn.Module, dtype: torch.dtype) -> str | None:
        return fused_refusal(module, dtype)

    def captured_forward(self) -> torch.nn.Module:
        return self.fused

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        reason = unsupported_reason(self.module, example_inputs.dtype)
        if reason is not None:  # what planning cannot see: where the population lives
            raise IncompatibleComponentsError(f"executor=fused_cudagraph cannot run this population: {reason}")
        return super().prepare(example_inputs, example_targets)
