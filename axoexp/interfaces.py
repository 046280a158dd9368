"""What components hand each other: batches, losses, gradient transforms, a ready population.

Kept apart from the components themselves so that the registry, the executors and the
components can all name these types without importing one another.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:  # annotations only: importing MLflow costs over a second
    from mlflow.data.dataset import Dataset

Batch = tuple[torch.Tensor, torch.Tensor]
"""Contact inputs (neurons, time, contacts) and targets (neurons, time, outputs)."""

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(prediction, target)``: a scalar loss tensor."""

GradientTransform = Callable[[], None] | None
"""Called between backward and the optimizer step (graph-safe: no host reads), or ``None``."""


@dataclass
class PopulationSetup:
    """What a ``population`` factory returns: a module to adapt and fixed-shape batches."""

    module: torch.nn.Module
    batches: list[Batch]
    description: dict[str, object] = field(default_factory=dict)


class RunLog(Protocol):
    """Where one experiment's params, tags, metrics and artifacts go (``axoexp.journal``'s
    journaled MLflow run)."""

    run_id: str

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None: ...
    def log_series(self, name: str, values: list[float], first_step: int = 0) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def log_artifact(self, path: str) -> None: ...
    def log_dataset(self, dataset: Dataset, context: str) -> None: ...
