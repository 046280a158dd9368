"""The gradient transform and the optimizer step over all adaptation banks in one Triton launch
(two with ``clip_norm``: a reduction first), CUDA-graph capturable.

The kernels work on flat float32 buffers of all banks, their gradients and the optimizer's
state (:class:`axoexp.executors.fused_step.FusedStep` makes them and launches these). A
launch updates every element of every bank with the arithmetic of torch's capturable
(foreach) implementation, in the same order (:class:`axoexp.executors.step_rule.StepRule`):

- ``clip_norm``: one program per block of ``BLOCK`` elements sums ``|g|`` or ``g^2`` (or takes
  the max of ``|g|``) into a partial; in the step launch every program adds all partials in the
  same order, so all agree on the total norm; coefficient ``min(max_norm / (norm + 1e-6), 1)``.
- ``clip_value``: ``g`` clamped to ``[-clip_value, clip_value]`` (NaN stays NaN, as in torch).
- Adam/AdamW: step ``t += 1``, ``m = lerp(m, g, 1 - beta1)``, ``v = beta2 v + (1 - beta2) g^2``,
  ``p += m / ((sqrt(v) / sqrt(1 - beta2^t) + eps) / (lr / (beta1^t - 1)))``; L2 decay added to
  ``g`` (Adam) or ``p *= 1 - lr wd`` first (AdamW).
- SGD: L2 decay, ``buf = momentum buf + g`` (a fresh buffer is zeros, so the first step gives
  ``buf = g`` as torch's clone does), Nesterov ``g + momentum buf``, ``p += -lr g``.

The clipped gradients are written back, as the eager transform leaves them. Adam's step
count lives on the device: each program reads it, and the last program to finish (an atomic
ticket) writes ``t + 1`` to every bank's ``step``, so one launch needs no second kernel.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

BLOCK = 1024
"""Elements per program (8 a thread at 4 warps)."""
PARTIALS_BLOCK = 256
"""Partial norms each step program adds at a time."""
NUM_WARPS = 4

OPTIMIZER_CODES = {"adam": 0, "adamw": 1, "sgd": 2}
TRANSFORM_CODES = {"none": 0, "clip_norm": 1, "clip_value": 2}
NORM_CODES = {1.0: 1, 2.0: 2, math.inf: 0}


@triton.jit
def _nan_of(values):
    """0 where ``values`` has no NaN, else NaN: added to a max, it propagates NaN as torch's max does."""
    return tl.sum(tl.where(values == values, 0.0, values), axis=0)


@triton.jit
def norm_partials_kernel(grads, partials, numel, NORM: tl.constexpr, BLOCK: tl.constexpr):
    """``partials[program]``: the sum of ``|g|`` (NORM 1) or ``g^2`` (2), or the max of ``|g|`` (0), over its block."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    magnitude = tl.abs(tl.load(grads + offsets, mask=offsets < numel, other=0.0))
    if NORM == 0:
        partial = tl.max(magnitude, axis=0) + _nan_of(magnitude)
    elif NORM == 1:
        partial = tl.sum(magnitude, axis=0)
    else:
        partial = tl.sum(magnitude * magnitude, axis=0)
    tl.store(partials + tl.program_id(0) + tl.arange(0, 1), partial + tl.zeros([1], tl.float32))


@triton.jit
def _total_norm(partials, count, NORM: tl.constexpr, PARTIALS_BLOCK: tl.constexpr):
    """The total norm from every partial, added in one fixed order (every program gets the same)."""
    total = tl.zeros([PARTIALS_BLOCK], tl.float32)
    for start in range(0, count, PARTIALS_BLOCK):
        index = start + tl.arange(0, PARTIALS_BLOCK)
        partial = tl.load(partials + index, mask=index < count, other=0.0)
        if NORM == 0:
            total = tl.maximum(total, partial) + tl.where(partial == partial, 0.0, partial)
        else:
            total = total + partial
    if NORM == 0:
        return tl.max(total, axis=0) + _nan_of(total)
    elif NORM == 1:
        return tl.sum(total, axis=0)
    else:
        return tl.sqrt_rn(tl.sum(total, axis=0))


@triton.jit
def step_kernel(
    parameters,  # not `params`: Triton 3.6's generated binder has a local of that name
    grads,
    first,  # exp_avg, or SGD's momentum buffer
    second,  # exp_avg_sq
    steps,  # Adam's step count, one per bank (all equal)
    partials,
    tickets,
    numel,
    partial_count,
    lr,
    weight_decay,
    decay_factor,  # AdamW: 1 - lr * weight_decay
    lerp_weight,  # Adam: 1 - beta1
    beta2,
    one_minus_beta2,
    log2_beta1,
    log2_beta2,
    eps,
    momentum,
    max_norm,
    clip_value,
    OPTIMIZER: tl.constexpr,
    TRANSFORM: tl.constexpr,
    NORM: tl.constexpr,
    WEIGHT_DECAY: tl.constexpr,
    MOMENTUM: tl.constexpr,
    NESTEROV: tl.constexpr,
    LERP_FROM_END: tl.constexpr,
    BANKS: tl.constexpr,
    BANKS_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    PARTIALS_BLOCK: tl.constexpr,
):
    """One block of ``BLOCK`` elements: transform, then step; see the module docstring."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    grad = tl.load(grads + offsets, mask=mask, other=0.0)
    param = tl.load(parameters + offsets, mask=mask, other=0.0)
    if TRANSFORM == 1:  # clip_norm, as torch.nn.utils.clip_grad_norm_
        coefficient = tl.div_rn(max_norm, _total_norm(partials, partial_count, NORM, PARTIALS_BLOCK) + 1e-6)
        coefficient = tl.where(coefficient > 1.0, 1.0, coefficient)  # torch.clamp(max=1.0): NaN stays NaN
        grad = grad * coefficient
        tl.store(grads + offsets, grad, mask=mask)
    elif TRANSFORM == 2:  # clip_value, as torch.nn.utils.clip_grad_value_
        grad = tl.where(grad < -clip_value, -clip_value, grad)
        grad = tl.where(grad > clip_value, clip_value, grad)
        tl.store(grads + offsets, grad, mask=mask)
    if OPTIMIZER == 2:  # SGD, as torch.optim.SGD's foreach path
        if WEIGHT_DECAY:
            grad = grad + weight_decay * param
        if MOMENTUM:
            buffer = tl.load(first + offsets, mask=mask, other=0.0) * momentum + grad
            tl.store(first + offsets, buffer, mask=mask)
            if NESTEROV:
                grad = grad + momentum * buffer
            else:
                grad = buffer
        param = param + (-lr) * grad
    else:  # Adam / AdamW, as torch.optim.Adam's capturable foreach path
        step = tl.load(steps + tl.arange(0, 1)) + 1.0
        if OPTIMIZER == 1:
            param = param * decay_factor
        elif WEIGHT_DECAY:
            grad = grad + weight_decay * param
        exp_avg = tl.load(first + offsets, mask=mask, other=0.0)
        if LERP_FROM_END:  # torch's lerp for weights of 0.5 and more
            exp_avg = grad - (grad - exp_avg) * (1.0 - lerp_weight)
        else:
            exp_avg = exp_avg + lerp_weight * (grad - exp_avg)
        exp_avg_sq = tl.load(second + offsets, mask=mask, other=0.0) * beta2
        exp_avg_sq = exp_avg_sq + one_minus_beta2 * grad * grad
        step_size = tl.div_rn(1.0, tl.div_rn(tl.exp2(step * log2_beta1) - 1.0, lr))  # lr / (beta1^t - 1) < 0
        correction2 = tl.sqrt_rn(-(tl.exp2(step * log2_beta2) - 1.0))  # sqrt(1 - beta2^t)
        denominator = tl.div_rn(tl.div_rn(tl.sqrt_rn(exp_avg_sq), correction2) + eps, step_size)
        param = param + tl.div_rn(exp_avg, denominator)
        tl.store(first + offsets, exp_avg, mask=mask)
        tl.store(second + offsets, exp_avg_sq, mask=mask)
        banks = tl.arange(0, BANKS_PAD)
        ticket = tl.atomic_add(tickets + banks * 0, 1, mask=banks == 0)  # after every read of ``steps`` here
        last = banks * 0 + tl.sum(tl.where(banks == 0, ticket, 0), axis=0) == tl.num_programs(0) - 1
        tl.store(steps + banks, step + tl.zeros([BANKS_PAD], tl.float32), mask=(banks < BANKS) & last)
        tl.store(tickets + banks * 0, banks * 0, mask=(banks == 0) & last)
    tl.store(parameters + offsets, param, mask=mask)
