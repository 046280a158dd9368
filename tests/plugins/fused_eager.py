"""An executor with preconditions that runs on the CPU: eager updates whose forward is the fused
AxoSim-Lite kernel (in Triton's CPU interpreter without a GPU). Its refusal is the fused kernel's,
so planning judges a population for it exactly as for ``fused_cudagraph``."""

from __future__ import annotations

import torch

from axoexp import component
from axoexp.executors.base import eager_update
from axoexp.executors.eager import EagerExecutor
from axoexp.executors.fused import FusedLiteForward
from axoexp.kernels.lite_population import fused_refusal


@component("executor", "fused_eager")
class FusedEagerExecutor(EagerExecutor):
    """Eager updates through the fused kernel's forward and backward."""

    @classmethod
    def refusal(cls, *, module: torch.nn.Module, dtype: torch.dtype) -> str | None:
        return fused_refusal(module, dtype)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        forward = FusedLiteForward(self.module)  # type: ignore[arg-type]
        return eager_update(forward, self.optimizer, self.loss_fn, self.gradient_transform, inputs, targets)
