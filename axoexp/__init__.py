"""axoexp: plugin-driven experiments on inference-time adaptation of AxoSim populations.

``from axoexp import component`` is all a plugin needs; the experiment API
(``run_experiment``, ``plan_experiment``) is imported on first use, so that loading plugins
or printing help does not import MLflow.
"""

from __future__ import annotations

import importlib
from typing import Any

from axoexp.errors import AxoexpError, ConfigError
from axoexp.plugins import load_plugins
from axoexp.registry import REGISTRY, Registry, component

_LAZY = {
    "run_experiment": "axoexp.experiment",
    "ExperimentResult": "axoexp.experiment",
    "plan_experiment": "axoexp.plan",
    "Plan": "axoexp.plan",
}

__all__ = ["REGISTRY", "AxoexpError", "ConfigError", "Registry", "component", "load_plugins", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'axoexp' has no attribute {name!r}")
