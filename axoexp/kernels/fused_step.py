"""The gradient transform and the optimizer step over all adaptation banks in one Triton launch
(two with ``clip_norm``: a reduction first), CUDA-graph capturable.

:class:`FusedStep` moves the banks, their gradients and the optimizer's state into flat
float32 buffers, once: each parameter's ``data``, ``grad`` and ``optimizer.state`` entries
become views of them, so the module, autograd (which accumulates into the existing
gradients in place), ``zero_grad``, the capture's state snapshot and torch's own
``optimizer.step`` keep working on the same memory. A launch then updates every element of
every bank with the arithmetic of torch's capturable (foreach) implementation, in the same
order (:class:`axoexp.kernels.step_rule.StepRule`):

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

import torch
import triton
import triton.language as tl

from axoexp.errors import IncompatibleComponentsError
from axoexp.interfaces import GradientTransform
from axoexp.kernels.step_rule import FUSED_STEP_KEY, StepRule, step_rule

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
def _norm_partials_kernel(grads, partials, numel, NORM: tl.constexpr, BLOCK: tl.constexpr):
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
def _step_kernel(
    params,
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
    param = tl.load(params + offsets, mask=mask, other=0.0)
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
    tl.store(params + offsets, param, mask=mask)


def _flatten(tensors: list[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One flat float32 buffer holding ``tensors``' values, and views of it shaped as each."""
    flat = torch.cat([tensor.detach().reshape(-1) for tensor in tensors]) if tensors else torch.zeros(0)
    flat = flat.to(device=device, dtype=torch.float32).contiguous()
    views, offset = [], 0
    for tensor in tensors:
        views.append(flat[offset : offset + tensor.numel()].view(tensor.shape))
        offset += tensor.numel()
    return flat, views


class FusedStep:
    """``transform()`` then ``optimizer.step()`` as one call: one launch (two with ``clip_norm``)
    over flat views of the optimizer's parameters (float32, one device, one parameter group)."""

    def __init__(self, optimizer: torch.optim.Optimizer, transform: GradientTransform) -> None:
        self.rule: StepRule = step_rule(optimizer, transform)
        parameters: list[torch.nn.Parameter] = list(optimizer.param_groups[0]["params"])
        devices = {parameter.device for parameter in parameters}
        if not parameters or len(devices) != 1 or any(p.dtype != torch.float32 for p in parameters):
            raise IncompatibleComponentsError(
                f"executor.{FUSED_STEP_KEY}=true needs float32 parameters on one device, got "
                f"{sorted({str(p.dtype) for p in parameters})} on {sorted(map(str, devices))}"
            )
        device = devices.pop()
        self.numel = sum(parameter.numel() for parameter in parameters)
        self.params, views = _flatten(parameters, device)
        self.grads, grad_views = _flatten(
            [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters], device
        )
        with torch.no_grad():
            for parameter, view, grad in zip(parameters, views, grad_views, strict=True):
                parameter.data = view
                parameter.grad = grad
        self.state: dict[str, torch.Tensor] = {}
        state_views: dict[str, list[torch.Tensor]] = {}
        for key in self.rule.state_keys:
            existing = [optimizer.state.get(p, {}).get(key) for p in parameters]
            self.state[key], state_views[key] = _flatten(
                [
                    torch.zeros_like(p) if value is None else value
                    for p, value in zip(parameters, existing, strict=True)
                ],
                device,
            )
        self.steps = torch.zeros(len(parameters), device=device)
        adam = self.rule.optimizer != "sgd"
        if adam:
            self.steps.copy_(torch.tensor([float(optimizer.state.get(p, {}).get("step", 0.0)) for p in parameters]))
        for index, parameter in enumerate(parameters):  # torch's own step() keeps working on these
            state = {"step": self.steps[index]} if adam else {}
            state.update({key: state_views[key][index] for key in self.rule.state_keys})
            optimizer.state[parameter] = state
        self.partials = torch.zeros(triton.cdiv(self.numel, BLOCK), device=device)
        self.tickets = torch.zeros(1, dtype=torch.int32, device=device)

    @property
    def launches(self) -> int:
        """Kernel launches per call."""
        return 2 if self.rule.transform == "clip_norm" else 1

    def __call__(self) -> None:
        rule = self.rule
        grid = (triton.cdiv(self.numel, BLOCK),)
        norm = NORM_CODES.get(rule.norm_type, 2)
        if rule.transform == "clip_norm":
            _norm_partials_kernel[grid](
                self.grads, self.partials, self.numel, NORM=norm, BLOCK=BLOCK, num_warps=NUM_WARPS
            )
        first = self.state.get("exp_avg", self.state.get("momentum_buffer", self.params))
        _step_kernel[grid](
            self.params,
            self.grads,
            first,
            self.state.get("exp_avg_sq", self.params),
            self.steps,
            self.partials,
            self.tickets,
            self.numel,
            self.partials.numel(),
            rule.lr,
            rule.weight_decay,
            1.0 - rule.lr * rule.weight_decay,
            1.0 - rule.beta1,
            rule.beta2,
            1.0 - rule.beta2,
            _log2(rule.beta1),
            _log2(rule.beta2),
            rule.eps,
            rule.momentum,
            rule.max_norm,
            rule.clip_value,
            OPTIMIZER=OPTIMIZER_CODES[rule.optimizer],
            TRANSFORM=TRANSFORM_CODES[rule.transform],
            NORM=norm,
            WEIGHT_DECAY=rule.weight_decay != 0,
            MOMENTUM=rule.momentum != 0,
            NESTEROV=rule.nesterov,
            LERP_FROM_END=1.0 - rule.beta1 >= 0.5,
            BANKS=self.steps.numel(),
            BANKS_PAD=triton.next_power_of_2(self.steps.numel()),
            BLOCK=BLOCK,
            PARTIALS_BLOCK=PARTIALS_BLOCK,
            num_warps=NUM_WARPS,
        )


def _log2(beta: float) -> float:
    """log2(beta) in double precision, -inf for 0 (beta^t = 0 for every step t >= 1)."""
    return math.log2(beta) if beta > 0 else -math.inf
