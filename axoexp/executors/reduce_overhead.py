"""``torch.compile(mode="reduce-overhead")``: inductor with PyTorch's CUDA-graph trees."""

from __future__ import annotations

import torch

from axoexp.executors import compiler_startup, optimizer_calls
from axoexp.executors.base import batch_loss, eager_update
from axoexp.executors.compiled import CompiledForward
from axoexp.interfaces import Executor
from axoexp.registry import component
from axoexp.timing import stopwatch, synchronizer

# Calls before cudagraph trees replay a recorded graph: one warm-up run, then the recording.
RECORDING_CALLS = 2
COMPILE_AND_RECORD_STAGES = (
    "dynamo_trace",
    "inductor_codegen",
    f"{RECORDING_CALLS}x(forward+loss+backward)",
    "cudagraph_tree_warmup",
    "cudagraph_tree_recording",
    "grad_reset",
    "synchronize",
)


def allocate_gradients(module: torch.nn.Module) -> None:
    """Give every trainable parameter a zero ``.grad`` before the first backward.

    Autograd adopts the first gradient it produces as ``.grad``. Under cudagraph trees that
    tensor lives in the graph's memory pool and the next replay overwrites it, which torch
    reports as "accessing tensor output of CUDAGraphs that has been overwritten". With a
    gradient already there, the backward's output is only added into it.
    """
    for parameter in module.parameters():
        if parameter.requires_grad and parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)


@component("executor", "reduce_overhead")
class ReduceOverheadExecutor(compiler_startup.StartsCompilerEarly, Executor):
    """The population forward (and its backward) compiled with ``mode="reduce-overhead"``.

    Forward and backward replay as CUDA graphs managed by torch's cudagraph trees; the loss,
    gradient transform and optimizer step run eagerly. Each update starts with
    ``torch.compiler.cudagraph_mark_step_begin()``, so the previous update's graph outputs
    may be reused; the returned loss is computed eagerly and is not one of them. AxoSim-Lite's
    kept output (``base_soma_prediction``) is such an output: read it before the next update.
    Shapes are static: another input shape compiles and records again.
    """

    requires_cuda = True
    update_includes = (
        "cudagraph_mark_step_begin",
        "zero_grad",
        "forward(graph_replay)",
        "loss",
        "backward(graph_replay+grad_accumulate)",
        "gradient_transform",
        "optimizer_step",
        "synchronize",
    )

    def __init__(self, **components: object) -> None:
        super().__init__(**components)  # type: ignore[arg-type]
        self.compiled = CompiledForward(self.module, mode="reduce-overhead", dynamic=False)
        self.prepared = False

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        return {compiler_startup.PHASE: compiler_startup.STAGES, "compile": COMPILE_AND_RECORD_STAGES}

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        """Compile, warm up and record with forward and backward only: no update is made."""
        allocate_gradients(self.module)
        phases: dict[str, float] = {}
        compiler_startup.wait_into(phases, example_inputs.device)
        with stopwatch(synchronizer(example_inputs.device), phases, "compile"):
            for _ in range(RECORDING_CALLS):
                torch.compiler.cudagraph_mark_step_begin()
                batch_loss(self.compiled, self.loss_fn, example_inputs, example_targets).backward()
            optimizer_calls.zero_grad(self.optimizer)
        self.prepared = True
        return phases

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not self.prepared:  # gradients must exist before the first backward (allocate_gradients)
            raise RuntimeError("ReduceOverheadExecutor.step called before prepare (gradients not allocated)")
        torch.compiler.cudagraph_mark_step_begin()
        return eager_update(self.compiled, self.optimizer, self.loss_fn, self.gradient_transform, inputs, targets)
