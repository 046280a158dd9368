"""An executor that runs the population forward through ``torch.compile`` (inductor)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from axoexp.executors import compiler_startup, optimizer_calls
from axoexp.executors.base import batch_loss
from axoexp.executors.capture import release_autograd_graphs
from axoexp.executors.cudagraph import CudaGraphExecutor, WarmupSteps
from axoexp.interfaces import Executor, LossFn
from axoexp.registry import component
from axoexp.stdout import with_article
from axoexp.timing import stopwatch, synchronizer

INDUCTOR_OPTIONS: dict[str, Any] = {"triton.cudagraphs": False}  # the whole update is captured in one graph instead
COMPILE_STAGES = ("dynamo_trace", "inductor_codegen", "forward", "loss", "backward", "grad_reset", "synchronize")


def forward_backward_without_update(
    executor: Executor, module: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor
) -> None:
    """Run forward and backward (compiling both graphs) and drop the gradients: no update.

    It runs on a side stream, as axosim's capture warm-up does: AxoSim-Lite keeps its last
    output (and so that autograd graph) alive, and a gradient accumulator created on the
    legacy default stream would make the later capture depend on that stream, which CUDA
    forbids.
    """
    release_autograd_graphs(module)  # an earlier update's graph would pin its accumulators' stream
    stream = torch.cuda.Stream(inputs.device)
    stream.wait_stream(torch.cuda.current_stream(inputs.device))
    with torch.cuda.stream(stream):
        batch_loss(module, executor.loss_fn, inputs, targets).backward()
        optimizer_calls.zero_grad(executor.optimizer)
    torch.cuda.current_stream(inputs.device).wait_stream(stream)
    release_autograd_graphs(module)


class CompiledForward(torch.nn.Module):
    """The population's ``forward`` and, for batched streams, ``forward_batch``, each compiled
    with ``options`` (``torch.compile`` of a module compiles its ``forward`` only)."""

    def __init__(self, population: torch.nn.Module, **options: object) -> None:
        super().__init__()
        self.population = population
        self.whole = torch.compile(population, **options)  # type: ignore[call-overload]
        batched = getattr(population, "forward_batch", None)  # compiled on its first call, if ever
        self.batched = None if batched is None else torch.compile(batched, **options)  # type: ignore[call-overload]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.whole(inputs)

    def forward_batch(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.batched is None:
            raise TypeError(
                "batched streams need the population's forward_batch; "
                f"{with_article(type(self.population).__name__)} has none"
            )
        return self.batched(inputs)


@component("executor", "compiled_cudagraph")
class CompiledCudaGraphExecutor(compiler_startup.StartsCompilerEarly, CudaGraphExecutor):
    """Inductor-compiled forward (static shapes, no cudagraph trees), then the whole update
    captured in one CUDA graph exactly as ``cudagraph`` does.

    ``prepare`` reports ``compile`` (tracing and code generation, triggered by one forward
    and backward whose gradients are discarded) separately from ``capture``.
    """

    def __init__(self, *, warmup_steps: WarmupSteps = 3, **components: Any) -> None:
        super().__init__(warmup_steps=warmup_steps, **components)
        self.compiled = CompiledForward(self.module, backend="inductor", dynamic=False, options=INDUCTOR_OPTIONS)

    @classmethod
    def length_refusal(cls, *, params: Mapping[str, Any], lengths: list[int], loss_fn: LossFn | None) -> str | None:
        if len(set(lengths)) == 1:
            return None
        return (
            "it compiles and captures one length; for batches of different lengths use cudagraph, "
            "regional_cudagraph or fused_cudagraph (one graph per length bucket)"
        )

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        return {
            compiler_startup.PHASE: compiler_startup.STAGES,
            "compile": COMPILE_STAGES,
            **super().prepare_includes(),
        }

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        phases: dict[str, float] = {}
        compiler_startup.wait_into(phases, example_inputs.device)
        with stopwatch(synchronizer(example_inputs.device), phases, "compile"):
            forward_backward_without_update(self, self.compiled, example_inputs, example_targets)
        with stopwatch(synchronizer(example_inputs.device), phases, "capture"):
            self.graph_step = self.capture(self.compiled, example_inputs, example_targets)
        return phases
