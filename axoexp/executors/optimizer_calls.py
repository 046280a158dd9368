"""torch.optim's calls, without importing ``torch._dynamo`` while nothing can be compiling.

torch wraps ``Optimizer.add_param_group`` (which every optimizer's constructor calls) and
``Optimizer.zero_grad`` in ``torch._disable_dynamo``, and each built-in optimizer's ``step`` in
``_use_grad_for_differentiable``: on their first call both import ``torch._dynamo`` (1.3 s on an idle
core, several on a loaded one), only to tell the compiler not to trace them (or to break its graph
there). Until ``torch._dynamo`` is imported no frame can be compiling, so these directives have nothing
to direct, and the calls here run torch's own code without them. Once it is imported (a compiled
executor), or where an optimizer is not as torch builds its own (step hooks, its own ``step``), they
are torch's plain calls.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer

DYNAMO = "torch._dynamo"
_DISABLED_CACHE = "__dynamo_disable"
"""Where ``torch._compile._disable_dynamo`` keeps, on the function it wraps, what it built on the first call."""
_USE_GRAD_CODE = torch_optimizer._use_grad_for_differentiable(lambda: None).__code__
_STEP_HOOKS = ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")


def compiler_loaded() -> bool:
    """Whether ``torch._dynamo`` is imported (only then can anything be compiling)."""
    return DYNAMO in sys.modules


@contextmanager
def _without_compiler_directive(method: Callable[..., Any]) -> Iterator[None]:
    """Within, ``method`` (wrapped in ``torch._disable_dynamo``) runs as the function it wraps."""
    function = getattr(method, "__wrapped__", None)
    if compiler_loaded() or function is None or hasattr(function, _DISABLED_CACHE):
        yield
        return
    setattr(function, _DISABLED_CACHE, function)
    try:
        yield
    finally:
        delattr(function, _DISABLED_CACHE)


@contextmanager
def constructing() -> Iterator[None]:
    """Optimizers constructed within add their parameter groups without importing the compiler."""
    with _without_compiler_directive(torch.optim.Optimizer.add_param_group):
        yield


def zero_grad(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.zero_grad(set_to_none=False)``: every gradient zeroed in place (a captured graph
    keeps pointing at the same tensors)."""
    with _without_compiler_directive(torch.optim.Optimizer.zero_grad):
        optimizer.zero_grad(set_to_none=False)


def step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()``: what torch's step wrappers do when no hook is registered (the profiler's
    label, grad mode as ``differentiable`` says), around the optimizer's own ``step``."""
    body = _plain_step(optimizer)
    if body is None:
        optimizer.step()
        return
    label = f"Optimizer.step#{type(optimizer).__name__}.step"
    with torch.autograd.profiler.record_function(label), torch.set_grad_enabled(optimizer.defaults["differentiable"]):
        body(optimizer)
        optimizer._optimizer_step_code()


def _plain_step(optimizer: torch.optim.Optimizer) -> Callable[[torch.optim.Optimizer], Any] | None:
    """The optimizer's own ``step`` under torch's two wrappers (the hooks' and the grad mode's),
    where nothing needs them; else None."""
    hooked = type(optimizer).step
    use_grad = getattr(hooked, "__wrapped__", None)
    if (
        compiler_loaded()
        or "step" in vars(optimizer)
        or not getattr(hooked, "hooked", False)
        or getattr(use_grad, "__code__", None) is not _USE_GRAD_CODE
        or "differentiable" not in optimizer.defaults
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or any(getattr(torch_optimizer, hooks, True) for hooks in _STEP_HOOKS)
    ):
        return None
    return getattr(use_grad, "__wrapped__", None)
