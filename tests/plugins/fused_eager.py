"""An executor with preconditions that runs on the CPU: eager updates whose forward is the fused
AxoSim-Lite kernel (in Triton's CPU interpreter without a GPU), with the loss in the kernels as
``fused_cudagraph`` runs it, and with ``fused_step`` the fused gradient transform and optimizer
step too (then, as there, the backward kernel adds the banks' gradients with no autograd). Its
refusals are the fused executor's, so planning judges a population and a fused step for it
exactly as for ``fused_cudagraph``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from axoexp import component
from axoexp.executors.base import eager_update
from axoexp.executors.eager import EagerExecutor
from axoexp.executors.fused import (
    FusedLiteForward,
    FusedStepOption,
    GradientsInKernelOption,
    LossInKernelOption,
    fused_step_config_problems,
    fused_step_for,
    gradients_for,
)
from axoexp.kernels.lite_population import fused_refusal


@component("executor", "fused_eager")
class FusedEagerExecutor(EagerExecutor):
    """Eager updates through the fused kernel's forward and backward (and, optionally, fused step)."""

    def __init__(
        self,
        *,
        fused_step: FusedStepOption = "auto",
        loss_in_kernel: LossInKernelOption = True,
        gradients_in_kernel: GradientsInKernelOption = True,
        **components: Any,
    ) -> None:
        super().__init__(**components)
        self.forward = FusedLiteForward(self.module)  # type: ignore[arg-type]
        self.objective = self.forward.objective(self.loss_fn) if loss_in_kernel else None
        self.fused_step, _ = fused_step_for(fused_step, self.optimizer, self.gradient_transform)
        self.loss_and_gradients, _ = gradients_for(
            gradients_in_kernel,
            self.forward,
            self.loss_fn,
            self.optimizer,
            self.fused_step,
            loss_in_kernel=loss_in_kernel,
        )

    @classmethod
    def refusal(cls, *, module: torch.nn.Module, dtype: torch.dtype) -> str | None:
        return fused_refusal(module, dtype)

    @staticmethod
    def config_problems(params: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
        return fused_step_config_problems(params, config)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return eager_update(
            self.forward,
            self.optimizer,
            self.loss_fn,
            self.gradient_transform,
            inputs,
            targets,
            fused_step=self.fused_step,
            objective=self.objective,
            loss_and_gradients=self.loss_and_gradients,
        )
