"""Overrides instantiate only what axoexp ships: every class the composed config names is checked.

Hydra instantiates each ``_target_`` under ``hydra.callbacks`` (and the launcher's and the
sweeper's) right after composing the config, and Python's logging calls the ``()`` factories
and handler ``class``es of ``hydra.job_logging`` and ``hydra.hydra_logging``; an override such
as ``+hydra.callbacks.x._target_=builtins.open`` would therefore call anything. Each such name
must be a class of its place's kind from a module axoexp ships or supports (:data:`ALLOWED`);
anywhere else a ``_target_`` must be an axoexp or Hydra class. axoexp's sweep callback cannot
be removed or replaced. :class:`CheckedCallbacks` checks the composed config before Hydra
instantiates anything from it (exit status 2, no run); a sweep's job checks its own config (its
sweep values) too and is refused like any job with a bad value.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra._internal.callbacks import Callbacks
from hydra.experimental.callback import Callback
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf

from axoexp.errors import RefusedTargetError

TARGET_KEYS = ("_target_", "()", "class")
SWEEP_CALLBACK_KEY = "hydra.callbacks.mlflow_sweep._target_"
SWEEP_CALLBACK = "axoexp.sweep.MlflowSweepCallback"
LOGGING = (("logging.", "colorlog.", "axoexp."), (logging.Formatter, logging.Handler, logging.Filter))
"""What logging's configs may name: axoexp's own too, its console handler (:class:`axoexp.stdout.ConsoleHandler`)."""
ALLOWED: dict[str, tuple[tuple[str, ...], tuple[type, ...]]] = {
    # place (key prefix): (module prefixes, what the class must be)
    "hydra.callbacks.": (("axoexp.", "hydra."), (Callback,)),
    "hydra.launcher.": (("hydra.", "hydra_plugins."), (Launcher,)),
    "hydra.sweeper.": (("hydra.", "hydra_plugins."), (Sweeper,)),
    "hydra.job_logging.": LOGGING,
    "hydra.hydra_logging.": LOGGING,
    "": (("axoexp.", "hydra."), (object,)),  # anywhere else (axoexp itself instantiates nothing)
}


def check_targets(config: DictConfig) -> str | None:
    """What is wrong with the config's classes, in one line naming the first key refused; ``None`` if nothing."""
    found = dict(_targets(config, ""))
    if OmegaConf.select(config, "hydra") is not None and found.get(SWEEP_CALLBACK_KEY) != SWEEP_CALLBACK:
        named = (
            f"{SWEEP_CALLBACK_KEY}={found[SWEEP_CALLBACK_KEY]}" if SWEEP_CALLBACK_KEY in found else SWEEP_CALLBACK_KEY
        )
        return f"{named}: axoexp's sweep callback cannot be removed or replaced; it must be {SWEEP_CALLBACK}"
    for key, name in found.items():
        problem = _problem(key, name)
        if problem:
            return f"{key}={name}: {problem}"
    return None


def _targets(node: Any, path: str) -> list[tuple[str, str]]:
    """``(dotted key, class name)`` of every ``_target_``, ``()`` and ``class`` key below ``node``."""
    found: list[tuple[str, str]] = []
    items: list[tuple[str, Any]]
    if isinstance(node, DictConfig):
        items = [(str(key), node._get_node(key)) for key in node.keys()]
    elif isinstance(node, ListConfig):
        items = [(str(index), node._get_node(index)) for index in range(len(node))]
    else:
        return found
    for key, child in items:
        dotted = f"{path}.{key}" if path else key
        if key in TARGET_KEYS and not isinstance(child, DictConfig | ListConfig):
            found.append((dotted, _value(node, key)))
        else:
            found += _targets(child, dotted)
    return found


def _value(node: Any, key: str) -> str:
    try:
        return str(node[key])
    except Exception:  # an interpolation that does not resolve: judged by what it says
        return str(node._get_node(key)._value())


def _problem(key: str, name: str) -> str | None:
    place = next(place for place in ALLOWED if key.startswith(place))
    if key.rsplit(".", 1)[-1] == "class" and place not in ("hydra.job_logging.", "hydra.hydra_logging."):
        return None  # an ordinary key named "class" outside logging's configs instantiates nothing
    modules, kinds = ALLOWED[place]
    what = " or ".join(kind.__name__ for kind in kinds if kind is not object)
    where = ", ".join(module + "*" for module in modules)
    allowed = f"only {what + ' ' if what else ''}classes from {where} may be named here"
    if not name.startswith(modules):
        return f"refused: {allowed}"
    try:
        cls = get_class(name)
    except Exception:
        return f"refused: not a class that can be imported; {allowed}"
    if not issubclass(cls, kinds):
        return f"refused: {allowed}"
    return None


class CheckedCallbacks(Callbacks):
    """Hydra's callbacks, made only after the composed config passed :func:`check_targets`."""

    def __init__(self, config: DictConfig | None = None) -> None:
        problem = check_targets(config) if config is not None else None
        if problem:
            raise RefusedTargetError(problem)
        super().__init__(config)


def install() -> None:
    """Make Hydra check every composed config before it instantiates anything from it."""
    from hydra._internal import hydra as hydra_internal

    hydra_internal.Callbacks = CheckedCallbacks  # type: ignore[misc]
