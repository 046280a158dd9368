"""Process-wide torch settings, applied once before any device work."""

from __future__ import annotations

import os

import torch
from omegaconf import DictConfig


def configure_determinism(determinism: DictConfig) -> None:
    """Apply the run's determinism settings (``determinism.*``)."""
    if determinism.deterministic_algorithms:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(bool(determinism.deterministic_algorithms))
    torch.backends.cudnn.benchmark = bool(determinism.cudnn_benchmark)
    torch.set_float32_matmul_precision(str(determinism.float32_matmul_precision))
