"""``AxoSimPopulation.forward`` with its P4 recurrence replaced by the fused Triton kernels.

Everything before and after the recurrence is the population's own torch code (contact
summaries, runtime coefficients) or a copy of axosim's few lines around its rollout (the
token projection, the four warm-up zeros, the ``base_soma_prediction`` it keeps), so the
output and the gradients of the adaptation banks are those of the eager forward up to
float32 rounding. No host syncs, no data-dependent shapes: CUDA-graph capturable.
"""

from __future__ import annotations

import importlib.util
import itertools

import torch
from axosim import AxoSimLite, AxoSimPopulation
from torch import nn


def unsupported_reason(population: nn.Module, dtype: torch.dtype) -> str | None:
    """Why ``fused_population_forward`` cannot run ``population`` at ``dtype``; None if it can."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    # Exact types: a subclass may change the forward or the step this path reproduces.
    if type(population) is not AxoSimPopulation:
        return f"the fused kernel runs an AxoSimPopulation, not a {type(population).__name__}"
    neuron = population.neuron
    if type(neuron) is not AxoSimLite:
        return f"the fused kernel runs AxoSim-Lite neurons, not {type(neuron).__name__}"
    if dtype != torch.float32:
        return f"the fused kernel runs float32, not {dtype}"
    dtypes = {
        tensor.dtype
        for tensor in itertools.chain(population.parameters(), population.buffers())
        if tensor.is_floating_point()
    }
    if dtypes != {torch.float32}:
        return f"the population holds {sorted(map(str, dtypes))} tensors, not only float32"
    trainable = [name for name, weight in neuron.named_parameters() if weight.requires_grad]
    if trainable:
        return (
            "the fused kernel trains only adaptation banks, but neuron weights require grad: "
            + ", ".join(trainable)
        )
    from axoexp.kernels.lite_recurrence import INTERPRETED

    device = population.behavior_adapter.device
    if device.type != "cuda" and not INTERPRETED:
        return (
            f"the population is on {device}; the Triton kernel needs CUDA "
            "(or Triton's CPU interpreter, TRITON_INTERPRET=1 before importing triton)"
        )
    return None


def fused_population_forward(
    population: AxoSimPopulation,
    inputs: torch.Tensor,
    *,
    block_n: int | None = None,
) -> torch.Tensor:
    """``population(inputs)`` with the recurrence fused: (neurons, time, contacts) contact
    inputs to (neurons, time, outputs) predictions, differentiable in the adaptation banks.

    As in axosim, only whole P4 patches run (``time - time % 4`` steps), block ``b``'s
    forecast fills steps ``4 b + 4 .. 4 b + 7`` (cut at ``time``), and the first four
    steps are zeros. ``block_n`` overrides the kernel's neurons per program.
    """
    reason = unsupported_reason(population, inputs.dtype)
    if reason is not None:
        raise ValueError(reason)
    from axoexp.kernels.lite_recurrence import lite_recurrence

    neuron = population.neuron
    patch = neuron.patch_size
    outputs = neuron.config.output_dim
    summaries = population._contact_summaries(inputs)
    neurons, time_steps, features = summaries.shape
    full_steps = time_steps - time_steps % patch
    if full_steps < patch:
        output = summaries.new_zeros(neurons, time_steps, outputs)
    else:
        blocks = full_steps // patch
        tokens = neuron.input_projection(
            summaries[:, :full_steps].reshape(neurons, blocks, patch * features)
        )
        forecast = lite_recurrence(
            neuron,
            tokens.transpose(0, 1).contiguous(),
            population._runtime_coefficients(),
            block_n=block_n,
        )
        forecast = forecast.transpose(0, 1).reshape(neurons, full_steps, outputs)
        output = torch.cat(
            (summaries.new_zeros(neurons, patch, outputs), forecast[:, : time_steps - patch]),
            dim=1,
        )
    neuron.base_soma_prediction = output[..., 1:2]
    return output
