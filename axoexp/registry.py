"""The plugin registry: every component is found by (group, name), never by import path.

Built-ins live in :mod:`axoexp.components` and :mod:`axoexp.executors`. User plugins are
Python files in a plugins directory (``$AXOEXP_PLUGINS_DIR``, default ``./plugins``) and
modules named by the ``axoexp.plugins`` entry-point group of installed packages. A plugin
registers components with :func:`component`; each plugin component also gets a Hydra
config node (its factory's keyword defaults), so ``loss=my_loss`` works without a YAML file.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

GROUPS: tuple[str, ...] = ("population", "loss", "optimizer", "gradient_transform", "executor")
ENTRY_POINT_GROUP = "axoexp.plugins"
PLUGINS_DIR_ENV = "AXOEXP_PLUGINS_DIR"
BUILTIN = "builtin"

# Arguments the framework supplies to each group's factory; a config may not set them.
CONTEXT_ARGUMENTS: dict[str, frozenset[str]] = {
    "population": frozenset({"device", "dtype", "seed"}),
    "loss": frozenset(),
    "optimizer": frozenset({"parameters", "capturable"}),
    "gradient_transform": frozenset({"parameters"}),
    "executor": frozenset({"module", "optimizer", "loss_fn", "gradient_transform"}),
}


class RegistryError(LookupError):
    """An unknown group or component name, a duplicate, or bad component parameters."""


class PluginLoadError(ImportError):
    """A plugin file or entry point failed to import."""


@dataclass(frozen=True)
class Component:
    """A registered factory and where it came from."""

    group: str
    name: str
    factory: Callable[..., Any]
    source: str

    def parameters(self) -> dict[str, inspect.Parameter]:
        """Keyword parameters a config may set (the framework's context arguments excluded)."""
        signature = inspect.signature(self.factory)
        return {
            name: parameter
            for name, parameter in signature.parameters.items()
            if name not in CONTEXT_ARGUMENTS[self.group]
            and name != "self"
            and parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)
        }

    def defaults(self) -> dict[str, Any]:
        """The factory's keyword defaults: the config a plugin component gets for free."""
        return {
            name: parameter.default
            for name, parameter in self.parameters().items()
            if parameter.default is not inspect.Parameter.empty
        }

    def check_params(self, params: Mapping[str, Any]) -> None:
        """Raise :class:`RegistryError` for config keys the factory does not accept."""
        accepted = self.parameters()
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise RegistryError(
                f"{self.group}={self.name} does not accept {', '.join(map(repr, unknown))}; "
                f"its parameters are: {', '.join(sorted(accepted)) or '(none)'}"
            )
        missing = sorted(
            name
            for name, parameter in accepted.items()
            if parameter.default is inspect.Parameter.empty and name not in params
        )
        if missing:
            raise RegistryError(f"{self.group}={self.name} needs {', '.join(missing)}")

    def build(self, params: Mapping[str, Any], **context: Any) -> Any:
        """Check ``params`` and call the factory with them and the framework's context."""
        self.check_params(params)
        return self.factory(**context, **params)


@dataclass
class Registry:
    """Components by group and name."""

    _components: dict[str, dict[str, Component]] = field(
        default_factory=lambda: {group: {} for group in GROUPS}
    )

    def register(self, group: str, name: str, factory: Callable[..., Any], *, source: str) -> None:
        """Add a component; a name already taken in its group is an error, not a shadow."""
        entries = self._group(group)
        if name in entries:
            raise RegistryError(
                f"{group}={name} is registered twice: by {entries[name].source} and by {source}"
            )
        entries[name] = Component(group, name, factory, source)

    def get(self, group: str, name: str) -> Component:
        """The component, or an error naming the bad value and the valid choices."""
        entries = self._group(group)
        if name not in entries:
            raise RegistryError(
                f"unknown {group} {name!r}; valid {group} names: {', '.join(sorted(entries))}"
            )
        return entries[name]

    def names(self, group: str) -> list[str]:
        return sorted(self._group(group))

    def components(self) -> list[Component]:
        return [entry for group in GROUPS for entry in self._components[group].values()]

    def _group(self, group: str) -> dict[str, Component]:
        if group not in self._components:
            raise RegistryError(f"unknown component group {group!r}; groups: {', '.join(GROUPS)}")
        return self._components[group]


REGISTRY = Registry()
_current_source = BUILTIN


def component(group: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a factory (function or class) in :data:`REGISTRY`."""

    def decorate(factory: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY.register(group, name, factory, source=_current_source)
        return factory

    return decorate


_loaded = False


def load_plugins(plugins_dir: str | os.PathLike[str] | None = None) -> Registry:
    """Import built-ins, entry-point plugins and plugin files (once per process)."""
    global _loaded
    if _loaded:
        return REGISTRY
    importlib.import_module("axoexp.components")
    importlib.import_module("axoexp.executors")
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        _import_as_plugin(f"entry point {entry_point.name} ({entry_point.value})", entry_point.load)
    directory = Path(plugins_dir or os.environ.get(PLUGINS_DIR_ENV) or "plugins")
    if directory.is_dir():
        for path in sorted(directory.glob("*.py")):
            if not path.name.startswith("_"):
                _import_as_plugin(str(path), lambda path=path: _import_file(path))
    _register_plugin_configs()
    _loaded = True
    return REGISTRY


def _import_as_plugin(source: str, load: Callable[[], Any]) -> None:
    global _current_source
    _current_source = source
    try:
        load()
    except RegistryError:
        raise
    except Exception as error:
        raise PluginLoadError(f"plugin {source} failed to import: {error!r}") from error
    finally:
        _current_source = BUILTIN


def _import_file(path: Path) -> None:
    module_name = f"axoexp_plugins.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginLoadError(f"cannot import plugin file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)


def _register_plugin_configs() -> None:
    """Give each plugin component a Hydra config node: ``name`` plus its factory's defaults."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for entry in REGISTRY.components():
        if entry.source != BUILTIN:
            store.store(group=entry.group, name=entry.name, node={"name": entry.name, **entry.defaults()})
