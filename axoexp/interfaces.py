"""What components hand each other: batches, losses, gradient transforms, a ready population.

Kept apart from the components themselves so that the registry, the executors and the
components can all name these types without importing one another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

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
