"""axoexp: plugin-driven experiments on inference-time adaptation of AxoSim populations.

``from axoexp import component`` is all a plugin needs. Every name is imported on first use, so
that loading plugins or printing help does not import MLflow, and ``python -m axoexp`` reaches
its Ctrl-C handler (:func:`axoexp.signals.run_command`) before it imports anything.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what plugins' type checkers see; at run time __getattr__ imports each on first use
    from axoexp.errors import AxoexpError as AxoexpError
    from axoexp.errors import ConfigError as ConfigError
    from axoexp.plugins import load_plugins as load_plugins
    from axoexp.registry import REGISTRY as REGISTRY
    from axoexp.registry import Registry as Registry
    from axoexp.registry import component as component

_LAZY = {
    "AxoexpError": "axoexp.errors",
    "ConfigError": "axoexp.errors",
    "REGISTRY": "axoexp.registry",
    "Registry": "axoexp.registry",
    "component": "axoexp.registry",
    "load_plugins": "axoexp.plugins",
    "run_experiment": "axoexp.experiment",
    "ExperimentResult": "axoexp.experiment",
    "plan_experiment": "axoexp.plan",
    "Plan": "axoexp.plan",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule: axoexp.errors
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'axoexp' has no attribute {name!r}")
