"""``AxoSimPopulation.forward`` (and ``forward_batch``) with a replaceable P4 recurrence (the fused Triton kernels, or
compiled regions of ``step_token`` calls).

Everything before and after the recurrence is the population's own torch code (contact
summaries, runtime coefficients) or a copy of axosim's few lines around its rollout (the
token projection, the four warm-up zeros, the ``base_soma_prediction`` it keeps), so the
output and the gradients of the adaptation banks are those of the eager forward up to
float32 rounding. No host syncs, no data-dependent shapes: CUDA-graph capturable.
:func:`fused_population_loss` goes one step further for the built-in mean errors: the loss and
its gradient run inside the recurrence kernels, so no output is assembled. With ``front_in_kernel``
(the default) the fused paths also compute the front in the kernels: the tokens from the raw contact
inputs, the efficacies and :func:`population_front`'s constants, and the cache from the banks.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch
from axosim import AxoSimLite, AxoSimPopulation
from torch import nn

from axoexp.interfaces import STREAM_AXIS_RANK
from axoexp.kernels.loss import KernelLoss
from axoexp.stdout import with_article

if TYPE_CHECKING:
    from axoexp.kernels.lite_recurrence import Front


def lite_structure_reason(module: nn.Module) -> str | None:
    """Why ``module`` is not an exact ``AxoSimPopulation`` of ``AxoSimLite`` neurons (whose
    forward, and forward_batch, this module reproduces around a replaceable recurrence); None if it is.
    Exact types: a subclass may change the forward or the step this path reproduces."""
    if type(module) is not AxoSimPopulation:
        return f"it runs an axosim.AxoSimPopulation, and the population is {with_article(type(module).__name__)}"
    neuron = cast(nn.Module, module.neuron)
    if type(neuron) is not AxoSimLite:
        return f"it runs AxoSim-Lite (axosim.AxoSimLite) neurons, and the population's are {type(neuron).__name__}"
    return None


def fused_refusal(module: nn.Module, dtype: torch.dtype) -> str | None:
    """Why the fused kernels cannot run the population ``module`` at ``dtype``, judged by what
    it is (types, dtypes, which weights train), not where it lives; None if they can."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install triton)"
    structure = lite_structure_reason(module)
    if structure is not None:
        return f"the fused kernel {structure.removeprefix('it ')}"
    if dtype != torch.float32:
        return f"the fused kernel runs float32, not dtype={str(dtype).removeprefix('torch.')}"
    dtypes = {
        tensor.dtype for tensor in itertools.chain(module.parameters(), module.buffers()) if tensor.is_floating_point()
    }
    if dtypes != {torch.float32}:
        return f"the population holds {sorted(map(str, dtypes))} tensors, not only float32"
    neuron = cast(nn.Module, module.neuron)
    trainable = [name for name, weight in neuron.named_parameters() if weight.requires_grad]
    if trainable:
        return "the fused kernel trains only adaptation banks, but neuron weights require grad: " + ", ".join(trainable)
    return None


def unsupported_reason(population: nn.Module, dtype: torch.dtype) -> str | None:
    """Why ``fused_population_forward`` cannot run ``population`` at ``dtype`` where it lives; None if it can."""
    reason = fused_refusal(population, dtype)
    if reason is not None:
        return reason
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


def summaries_and_cache(population: AxoSimPopulation, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (rows, time, route_features) contact summaries and (rows, cache_width) adaptation
    cache the neuron runs on, by the population's own code: for one stream (neurons, time,
    contacts) the rows are the neurons (``forward``); for B streams (B, neurons, time, contacts)
    they are B x neurons, stream-major, each stream with the same banks (``forward_batch``'s lines)."""
    if inputs.dim() != STREAM_AXIS_RANK:
        return population._contact_summaries(inputs), population._runtime_coefficients()
    streams, neurons, time_steps, contacts = inputs.shape
    features = population.neuron.config.route_feature_dim
    weighted = inputs * population.synaptic_efficacies().view(1, neurons, 1, contacts)
    summaries = (
        torch.bmm(
            weighted.permute(1, 0, 2, 3).reshape(neurons, streams * time_steps, contacts),
            population._contact_route_features(),
        )
        .reshape(neurons, streams, time_steps, features)
        .permute(1, 0, 2, 3)
        .reshape(streams * neurons, time_steps, features)
    )
    cache = (
        population._runtime_coefficients().view(1, neurons, -1).expand(streams, -1, -1).reshape(streams * neurons, -1)
    )
    return summaries, cache


def lite_tokens(population: AxoSimPopulation, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Everything before the recurrence: time-major P4 tokens and the adaptation cache.

    (blocks, rows, token_dim) tokens of the whole P4 patches (``time - time % 4`` steps;
    ``blocks`` may be 0) and the (rows, cache_width) cache (:func:`summaries_and_cache`).
    """
    neuron = population.neuron
    patch = neuron.patch_size
    summaries, cache = summaries_and_cache(population, inputs)
    rows, time_steps, features = summaries.shape
    blocks = time_steps // patch
    tokens = neuron.input_projection(summaries[:, : blocks * patch].reshape(rows, blocks, patch * features))
    return tokens.transpose(0, 1).contiguous(), cache


def assemble_output(neuron: AxoSimLite, forecast: torch.Tensor, time_steps: int) -> torch.Tensor:
    """Everything after the recurrence, as axosim does it: four warm-up zeros, then block
    ``b``'s forecast at steps ``4 b + 4 .. 4 b + 7``, cut at ``time_steps``; the neuron keeps
    the output's soma channel as ``base_soma_prediction``. (rows, time_steps, outputs)."""
    patch, outputs = neuron.patch_size, neuron.config.output_dim
    blocks, rows, _ = forecast.shape
    forecast = forecast.transpose(0, 1).reshape(rows, blocks * patch, outputs)
    output = torch.cat((forecast.new_zeros(rows, patch, outputs), forecast[:, : time_steps - patch]), dim=1)
    neuron.base_soma_prediction = output[..., 1:2]
    return output


def population_forward(population: AxoSimPopulation, inputs: torch.Tensor, recurrence: Recurrence) -> torch.Tensor:
    """``population(inputs)`` with ``recurrence`` running the P4 blocks: (neurons, time,
    contacts) contact inputs to (neurons, time, outputs) predictions, differentiable in the
    adaptation banks; or ``population.forward_batch(inputs)`` for (B, neurons, time, contacts)
    inputs, whose B x neurons rows the recurrence runs at once."""
    neuron = population.neuron
    time_steps = inputs.shape[-2]
    tokens, cache = lite_tokens(population, inputs)
    if tokens.shape[0] == 0:  # fewer than 4 steps: all warm-up, as in axosim
        output = inputs.new_zeros(cache.shape[0], time_steps, neuron.config.output_dim)
        neuron.base_soma_prediction = output[..., 1:2]
    else:
        output = assemble_output(neuron, recurrence(neuron, tokens, cache), time_steps)
    return output.reshape(*inputs.shape[:-1], neuron.config.output_dim)


_FRONTS: weakref.WeakKeyDictionary[AxoSimPopulation, tuple[tuple[tuple[int, int], ...], Front]] = (
    weakref.WeakKeyDictionary()
)
"""Each population's last :class:`Front`, with the (storage, version) of the tensors it was computed from."""


def population_front(population: AxoSimPopulation) -> Front:
    """The constants the kernels compute the population's front from: each contact's route features
    times the input projection's weight (the projection the kernels apply to the contact inputs times
    the efficacies), the projection's bias and the morphology indices (the module's own tensors).

    The product is computed on the first call and again only when a tensor it comes from is replaced
    or written in place (storage and version counter compared, host-side): buffers and frozen weights,
    never a bank, whose values the kernels read live. A recomputed product is written into the cached
    tensor, so a CUDA graph captured with it (capture restores the module's state, which counts as a
    write) keeps reading valid memory."""
    from axoexp.kernels.lite_recurrence import Front, contact_projection

    neuron = population.neuron
    projection = neuron.input_projection
    sources = (
        projection.weight,
        projection.bias,
        neuron.route_features,
        population.morphology_indices,
        population.contact_branch_indices,
    )
    key = tuple((tensor.data_ptr(), tensor._version) for tensor in sources)
    cached = _FRONTS.get(population)
    if cached is not None and cached[0] == key:
        return cached[1]
    with torch.no_grad():
        product = contact_projection(neuron, population._contact_route_features())
        previous = None if cached is None else cached[1].projection
        if previous is not None and (previous.shape, previous.device) == (product.shape, product.device):
            product = previous.copy_(product)
        front = Front(
            product,
            projection.bias,
            population.morphology_indices,
            neuron.patch_size,
            population.synaptic_efficacies_per_neuron,
        )
    _FRONTS[population] = (key, front)
    return front


def front_in_kernel(population: AxoSimPopulation, inputs: torch.Tensor, requested: bool) -> bool:
    """Whether the kernels compute the front: where ``requested``, for at least one patch of steps and
    inputs that need no gradient (the kernels give none to them)."""
    needs_input_grad = torch.is_grad_enabled() and inputs.requires_grad
    return requested and inputs.shape[-2] >= population.neuron.patch_size and not needs_input_grad


def _rows(inputs: torch.Tensor) -> torch.Tensor:
    """(neurons, time, contacts) or (B, neurons, time, contacts) inputs as (rows, time, contacts), stream-major."""
    return inputs.reshape(-1, *inputs.shape[-2:])


def adaptation_banks(population: AxoSimPopulation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (behaviour, morphology, log-efficacy) banks the kernels read."""
    return population.behavior_adapter, population.morphology_adapter, population.synaptic_log_efficacy


def fused_population_forward(
    population: AxoSimPopulation,
    inputs: torch.Tensor,
    *,
    block_n: int | None = None,
    front: bool = True,
) -> torch.Tensor:
    """``population(inputs)`` (or ``forward_batch`` for batched streams) with the recurrence in
    the fused Triton kernels (float32); ``block_n`` overrides the kernel's rows per program; with
    ``front`` the tokens and the cache are computed in the kernels too (:func:`front_in_kernel`)."""
    reason = unsupported_reason(population, inputs.dtype)
    if reason is not None:
        raise ValueError(reason)
    from axoexp.kernels.lite_recurrence import lite_front_recurrence, lite_recurrence

    if not front_in_kernel(population, inputs, front):
        return population_forward(population, inputs, functools.partial(lite_recurrence, block_n=block_n))
    neuron = population.neuron
    time_steps = inputs.shape[-2]
    forecast = lite_front_recurrence(
        neuron, population_front(population), _rows(inputs), adaptation_banks(population), block_n=block_n
    )
    return assemble_output(neuron, forecast, time_steps).reshape(*inputs.shape[:-1], neuron.config.output_dim)


def fused_population_loss(
    population: AxoSimPopulation,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss: KernelLoss,
    *,
    length: torch.Tensor | None = None,
    block_n: int | None = None,
    front: bool = True,
) -> torch.Tensor:
    """``loss`` between ``population(inputs)`` (``forward_batch`` for batched streams, whose loss is
    then the mean over streams) and ``targets``, over the steps before ``length`` where given (padded
    batches), with the recurrence, the error and its gradient in the fused kernels. The output
    itself is never assembled, so ``base_soma_prediction`` is not kept. Needs at least one patch of
    steps. With ``front`` the tokens and the cache are computed in the kernels too
    (:func:`front_in_kernel`)."""
    reason = unsupported_reason(population, inputs.dtype)
    if reason is not None:
        raise ValueError(reason)
    from axoexp.kernels.lite_recurrence import lite_front_recurrence_loss, lite_recurrence_loss

    if front_in_kernel(population, inputs, front):
        flat = _rows(inputs)
        return lite_front_recurrence_loss(
            population.neuron,
            population_front(population),
            flat,
            adaptation_banks(population),
            targets.reshape(flat.shape[0], *targets.shape[-2:]),
            loss,
            length=length,
            block_n=block_n,
        )
    tokens, cache = lite_tokens(population, inputs)
    if tokens.shape[0] == 0:
        raise ValueError(f"the fused loss needs at least {population.neuron.patch_size} steps, got {inputs.shape[-2]}")
    rows = tokens.shape[1]
    return lite_recurrence_loss(
        population.neuron,
        tokens,
        cache,
        targets.reshape(rows, *targets.shape[-2:]),
        loss,
        length=length,
        block_n=block_n,
    )


def fused_population_loss_and_gradients(
    population: AxoSimPopulation,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    loss: KernelLoss,
    *,
    length: torch.Tensor | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """:func:`fused_population_loss` with the front in the kernels, and its backward with no autograd:
    returns the loss (0-dim, no graph), having added the gradients of the behaviour, morphology and
    log-efficacy banks into their ``.grad``, which must exist, zeroed (two launches in all:
    :func:`axoexp.kernels.lite_recurrence.lite_front_loss_and_gradients`). Needs at least one patch of
    steps and inputs that need no gradient (:func:`front_in_kernel`)."""
    reason = unsupported_reason(population, inputs.dtype)
    if reason is not None:
        raise ValueError(reason)
    if not front_in_kernel(population, inputs, True):
        raise ValueError(
            f"the kernels' gradients need at least {population.neuron.patch_size} steps of inputs that need no gradient"
        )
    banks = adaptation_banks(population)
    grads = tuple(bank.grad for bank in banks)
    if any(grad is None for grad in grads):
        raise ValueError("the banks' gradients must exist (zeroed) before the kernels add into them")
    from axoexp.kernels.lite_recurrence import lite_front_loss_and_gradients

    flat = _rows(inputs)
    return lite_front_loss_and_gradients(
        population.neuron,
        population_front(population),
        flat,
        banks,
        cast(tuple[torch.Tensor, torch.Tensor, torch.Tensor], grads),
        targets.reshape(flat.shape[0], *targets.shape[-2:]),
        loss,
        length=length,
        block_n=block_n,
    )
