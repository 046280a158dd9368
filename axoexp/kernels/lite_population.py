"""``AxoSimPopulation.forward`` with a replaceable P4 recurrence (the fused Triton kernels, or
compiled regions of ``step_token`` calls).

Everything before and after the recurrence is the population's own torch code (contact
summaries, runtime coefficients) or a copy of axosim's few lines around its rollout (the
token projection, the four warm-up zeros, the ``base_soma_prediction`` it keeps), so the
output and the gradients of the adaptation banks are those of the eager forward up to
float32 rounding. No host syncs, no data-dependent shapes: CUDA-graph capturable.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
from collections.abc import Callable
from typing import cast

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
    neuron = cast(nn.Module, population.neuron)
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
        return "the fused kernel trains only adaptation banks, but neuron weights require grad: " + ", ".join(trainable)
    from axoexp.kernels.lite_recurrence import INTERPRETED

    device = population.behavior_adapter.device
    if device.type != "cuda" and not INTERPRETED:
        return (
            f"the population is on {device}; the Triton kernel needs CUDA "
            "(or Triton's CPU interpreter, TRITON_INTERPRET=1 before importing triton)"
        )
    return None


Recurrence = Callable[[AxoSimLite, torch.Tensor, torch.Tensor], torch.Tensor]
"""``recurrence(neuron, tokens, cache)``: ``step_token`` over every P4 block. ``tokens`` is
(blocks, neurons, token_dim), time-major; ``cache`` the (neurons, cache_width) adaptation
cache; the result the (blocks, neurons, 4 * outputs) forecasts, time-major."""


def lite_tokens(population: AxoSimPopulation, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Everything before the recurrence: time-major P4 tokens and the adaptation cache.

    (blocks, neurons, token_dim) tokens of the whole P4 patches (``time - time % 4`` steps;
    ``blocks`` may be 0) and the (neurons, cache_width) cache, by the population's own code.
    """
    neuron = population.neuron
    patch = neuron.patch_size
    summaries = population._contact_summaries(inputs)
    neurons, time_steps, features = summaries.shape
    blocks = time_steps // patch
    tokens = neuron.input_projection(summaries[:, : blocks * patch].reshape(neurons, blocks, patch * features))
    return tokens.transpose(0, 1).contiguous(), population._runtime_coefficients()


def assemble_output(neuron: AxoSimLite, forecast: torch.Tensor, time_steps: int) -> torch.Tensor:
    """Everything after the recurrence, as axosim does it: four warm-up zeros, then block
    ``b``'s forecast at steps ``4 b + 4 .. 4 b + 7``, cut at ``time_steps``; the neuron keeps
    the output's soma channel as ``base_soma_prediction``."""
    patch, outputs = neuron.patch_size, neuron.config.output_dim
    blocks, neurons, _ = forecast.shape
    forecast = forecast.transpose(0, 1).reshape(neurons, blocks * patch, outputs)
    output = torch.cat((forecast.new_zeros(neurons, patch, outputs), forecast[:, : time_steps - patch]), dim=1)
    neuron.base_soma_prediction = output[..., 1:2]
    return output


def population_forward(population: AxoSimPopulation, inputs: torch.Tensor, recurrence: Recurrence) -> torch.Tensor:
    """``population(inputs)`` with ``recurrence`` running the P4 blocks: (neurons, time,
    contacts) contact inputs to (neurons, time, outputs) predictions, differentiable in the
    adaptation banks."""
    neuron = population.neuron
    tokens, cache = lite_tokens(population, inputs)
    if tokens.shape[0] == 0:  # fewer than 4 steps: all warm-up, as in axosim
        output = inputs.new_zeros(inputs.shape[0], inputs.shape[1], neuron.config.output_dim)
        neuron.base_soma_prediction = output[..., 1:2]
        return output
    return assemble_output(neuron, recurrence(neuron, tokens, cache), inputs.shape[1])


def fused_population_forward(
    population: AxoSimPopulation,
    inputs: torch.Tensor,
    *,
    block_n: int | None = None,
) -> torch.Tensor:
    """``population(inputs)`` with the recurrence in the fused Triton kernels (float32);
    ``block_n`` overrides the kernel's neurons per program."""
    reason = unsupported_reason(population, inputs.dtype)
    if reason is not None:
        raise ValueError(reason)
    from axoexp.kernels.lite_recurrence import lite_recurrence

    return population_forward(population, inputs, functools.partial(lite_recurrence, block_n=block_n))
