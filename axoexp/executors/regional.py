"""Regional compilation: compile a few ``step_token`` calls once, reuse them for every block.

Compiling the whole population unrolls AxoSim-Lite's Python loop over its P4 blocks, so
compile time grows with the number of time steps (about 2 minutes at 256 steps).
Here inductor compiles one region of ``tokens_per_region`` consecutive ``step_token`` calls
(forward and backward); the code before the loop (contact summaries, token projection,
adaptation cache) runs eagerly unless ``compile_edges`` compiles it too, and the loop over
regions stays Python. The whole update is then captured in one CUDA graph, so the Python
never runs again. Compile time no longer depends on the
number of time steps, and a persistent inductor cache makes a second process with the same
shapes (another job of a sweep, a verification copy) skip code generation. When all the
blocks fit in one region, the whole forward is compiled as one graph instead (as
``compiled_cudagraph`` compiles it): one region would leave three pieces where one fuses.
By default inductor also rewrites the model's tiny matmuls as pointwise code that fuses with
the rest of each block (``matmul_decomposition``), which makes the captured update several
times faster than cuBLAS calls between small kernels.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import torch
from axosim import AxoSimLite, AxoSimPopulation

from axoexp import names
from axoexp.executors import compiler_startup, matmul_decomposition
from axoexp.executors.compiled import COMPILE_STAGES, INDUCTOR_OPTIONS, forward_backward_without_update
from axoexp.executors.cudagraph import Buckets, CudaGraphExecutor, WarmupSteps
from axoexp.interfaces import STREAM_AXIS_RANK
from axoexp.kernels.lite_population import assemble_output, lite_structure_reason, lite_tokens
from axoexp.lengths import DEFAULT_BUCKETS
from axoexp.registry import AT_LEAST_ONE, component
from axoexp.timing import stopwatch, synchronizer

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
DEFAULT_CACHE = Path.home() / ".cache" / "axoexp" / "inductor"
RECOMPILE_LIMIT = 64  # one graph per region shape; a process may time many shapes


def run_tokens(
    neuron: AxoSimLite, tokens: torch.Tensor, state: torch.Tensor, cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``step_token`` over (k, neurons, token_dim) time-major tokens: (k, neurons, 4 * outputs)
    forecasts and the last state. This is the region inductor compiles."""
    forecasts = []
    for token in tokens.unbind(0):
        prediction, state = neuron.step_token(token, state, adaptation_cache=cache)
        forecasts.append(prediction.reshape(prediction.shape[0], -1))
    return torch.stack(forecasts), state


class RegionalLiteForward(torch.nn.Module):
    """``population(inputs)`` with compiled regions (same parameters; the same outputs up to
    float32 rounding); the whole forward compiled as one graph when its blocks fit in one region."""

    def __init__(
        self, population: AxoSimPopulation, tokens_per_region: int, compile_edges: bool, decompose_matmuls: bool
    ) -> None:
        super().__init__()
        self.population = population
        self.tokens_per_region = tokens_per_region
        self.decompose_matmuls = decompose_matmuls
        options = {**INDUCTOR_OPTIONS, **(matmul_decomposition.OPTIONS if decompose_matmuls else {})}
        self.region = torch.compile(run_tokens, dynamic=False, fullgraph=True, options=options)
        self.prologue = (
            torch.compile(lite_tokens, dynamic=False, fullgraph=True, options=options) if compile_edges else lite_tokens
        )
        self.whole = torch.compile(population.forward, backend="inductor", dynamic=False, options=options)
        self.whole_batch = torch.compile(population.forward_batch, backend="inductor", dynamic=False, options=options)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """One stream (neurons, time, contacts), or B streams (B, neurons, time, contacts) whose
        B x neurons rows every region runs at once."""
        if self.decompose_matmuls:  # here, not in __init__: it imports inductor, which may be starting up
            matmul_decomposition.widen_thresholds()
        neuron = self.population.neuron
        time_steps = inputs.shape[-2]
        if time_steps // neuron.patch_size <= self.tokens_per_region:
            return (self.whole_batch if inputs.dim() == STREAM_AXIS_RANK else self.whole)(inputs)
        tokens, cache = self.prologue(self.population, inputs)
        # A leaf that requires grad: every region then sees a state that requires grad, so one
        # graph serves the first region too (its own gradient is computed and dropped).
        state = torch.zeros(
            tokens.shape[1], neuron.config.state_dim, device=tokens.device, dtype=tokens.dtype, requires_grad=True
        )
        forecasts = []
        for chunk in tokens.split(self.tokens_per_region, dim=0):
            forecast, state = self.region(neuron, chunk, state, cache)
            forecasts.append(forecast)
        output = assemble_output(neuron, torch.cat(forecasts), time_steps)
        return output.reshape(*inputs.shape[:-1], neuron.config.output_dim)

    forward_batch = forward


def use_cache_dir(cache_dir: str | None) -> str:
    """Point inductor (and so Triton) at ``cache_dir``; if None, at $TORCHINDUCTOR_CACHE_DIR
    where set, else at DEFAULT_CACHE. Returns the directory in use."""
    if cache_dir is not None or CACHE_ENV not in os.environ:
        os.environ[CACHE_ENV] = str(Path(cache_dir or DEFAULT_CACHE).expanduser())
    return os.environ[CACHE_ENV]


def compile_counters() -> dict[str, int]:
    """Inductor's and AOTAutograd's cache hits and misses so far in this process."""
    from torch._dynamo.utils import counters

    return {
        "hit": counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"],
        "miss": counters["inductor"]["fxgraph_cache_miss"] + counters["aot_autograd"]["autograd_cache_miss"],
    }


@component("executor", "regional_cudagraph")
class RegionalCudaGraphExecutor(compiler_startup.StartsCompilerEarly, CudaGraphExecutor):
    """Inductor-compiled regions of ``tokens_per_region`` P4 blocks (and the code before the
    loop), then the whole update captured in one CUDA graph. ``prepare`` reports ``compile``
    (tracing, code generation or cache load) apart from ``capture``; tag ``compile.cache``
    says whether the persistent inductor cache already held every compiled graph."""

    def __init__(
        self,
        *,
        warmup_steps: WarmupSteps = 3,
        buckets: Buckets = DEFAULT_BUCKETS,
        tokens_per_region: Annotated[int, "P4 blocks (4 time steps each) per compiled region", AT_LEAST_ONE] = 2,
        compile_edges: Annotated[
            bool, "also compile the code before the block loop (about 3 s more to compile at 64x256x32)"
        ] = False,
        decompose_matmuls: Annotated[
            bool, "inductor rewrites the model's tiny matmuls as pointwise code that fuses with each block's other work"
        ] = True,
        cache_dir: Annotated[
            str | None,
            "inductor cache, shared by jobs of the same shape; "
            "null: $TORCHINDUCTOR_CACHE_DIR, else ~/.cache/axoexp/inductor",
        ] = None,
        **components: object,
    ) -> None:
        super().__init__(warmup_steps=warmup_steps, buckets=buckets, **components)
        self.cache_dir = cache_dir
        self.regional = RegionalLiteForward(
            self.module,
            tokens_per_region,
            compile_edges,
            decompose_matmuls,
        )

    @classmethod
    def refusal(cls, *, module: torch.nn.Module, dtype: torch.dtype) -> str | None:
        structure = lite_structure_reason(module)
        return None if structure is None else f"its regions are AxoSim-Lite's step_token calls: {structure}"

    @classmethod
    def begin_setup(cls, device: torch.device, params: Mapping[str, Any]) -> None:
        use_cache_dir(params.get("cache_dir"))  # before the compile workers start: they inherit it
        super().begin_setup(device, params)

    def prepare_includes(self) -> dict[str, tuple[str, ...]]:
        return {
            compiler_startup.PHASE: compiler_startup.STAGES,
            "compile": COMPILE_STAGES,
            **super().prepare_includes(),
        }

    def captured_forward(self) -> torch.nn.Module:
        return self.regional

    def prepare(self, example_inputs: torch.Tensor, example_targets: torch.Tensor) -> dict[str, float]:
        cache_dir = use_cache_dir(self.cache_dir)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        phases: dict[str, float] = {}
        compiler_startup.wait_into(phases, example_inputs.device)
        before = compile_counters()
        with stopwatch(synchronizer(example_inputs.device), phases, "compile"):
            forward_backward_without_update(self, self.regional, example_inputs, example_targets)
        after = compile_counters()
        misses, hits = after["miss"] - before["miss"], after["hit"] - before["hit"]
        self.prepared_tags = {
            names.COMPILE_CACHE: "cold" if misses else "warm" if hits else "in-process",
            names.COMPILE_CACHE_DIR: cache_dir,
        }
        phases.update(super().prepare(example_inputs, example_targets))
        return phases
