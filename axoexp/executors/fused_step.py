"""The gradient transform and the optimizer step as one call over flat views of the banks: the host
side of :mod:`axoexp.kernels.fused_step` (whose docstring gives the arithmetic).

:class:`FusedStep` moves the banks, their gradients and the optimizer's state into flat
float32 buffers, once: each parameter's ``data``, ``grad`` and ``optimizer.state`` entries
become views of them, so the module, autograd (which accumulates into the existing
gradients in place), ``zero_grad``, the capture's state snapshot and torch's own
``optimizer.step`` keep working on the same memory. Each call is one launch (two with
``clip_norm``). Imports Triton: import it only to build one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import triton

from axoexp.errors import IncompatibleComponentsError
from axoexp.executors.step_rule import FUSED_STEP_KEY, StepRule, step_rule
from axoexp.interfaces import GradientTransform
from axoexp.kernels.fused_step import (
    BLOCK,
    NORM_CODES,
    NUM_WARPS,
    OPTIMIZER_CODES,
    PARTIALS_BLOCK,
    TRANSFORM_CODES,
    norm_partials_kernel,
    step_kernel,
)


def _flatten(tensors: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One flat float32 buffer holding ``tensors``' values, and views of it shaped as each."""
    flat = torch.cat([tensor.detach().reshape(-1) for tensor in tensors]).to(device=device, dtype=torch.float32)
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

    def zero_grad(self) -> None:
        """Zero every bank's gradient: one fill of the flat buffer they are views of."""
        self.grads.zero_()

    def __call__(self) -> None:
        rule = self.rule
        grid = (triton.cdiv(self.numel, BLOCK),)
        norm = NORM_CODES.get(rule.norm_type, 2)
        if rule.transform == "clip_norm":
            norm_partials_kernel[grid](
                self.grads, self.partials, self.numel, NORM=norm, BLOCK=BLOCK, num_warps=NUM_WARPS
            )
        first = self.state.get("exp_avg", self.state.get("momentum_buffer", self.params))
        step_kernel[grid](
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
