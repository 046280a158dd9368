"""The reference executor: plain PyTorch, one kernel launch at a time."""

from __future__ import annotations

import torch

from axoexp.executors.base import UPDATE_STAGES, eager_update
from axoexp.interfaces import Executor
from axoexp.registry import component


@component("executor", "eager")
class EagerExecutor(Executor):
    """Runs the update eagerly on the inputs as given (no copy into static buffers)."""

    update_includes = UPDATE_STAGES + ("synchronize",)

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return eager_update(self.module, self.optimizer, self.loss_fn, self.gradient_transform, inputs, targets)
