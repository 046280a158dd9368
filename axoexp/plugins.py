"""Plugin discovery: built-ins, the ``axoexp.plugins`` entry points and a plugins directory.

A plugin is a Python file in the plugins directory (``$AXOEXP_PLUGINS_DIR``, default
``./plugins``) or a module named by an installed package's ``axoexp.plugins`` entry point;
importing it registers components with :func:`axoexp.registry.component`. Plugins are code
that runs on import: keep only trusted files there.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

from axoexp.errors import AxoexpError, PluginLoadError, RegistryError, first_line
from axoexp.registry import REGISTRY, Registry, registering_from

ENTRY_POINT_GROUP = "axoexp.plugins"
PLUGINS_DIR_ENV = "AXOEXP_PLUGINS_DIR"
DEFAULT_PLUGINS_DIR = "plugins"
BUILTIN_MODULES = (
    "axoexp.components.population",
    "axoexp.components.losses",
    "axoexp.components.optimizers",
    "axoexp.components.gradient_transforms",
    "axoexp.executors.eager",
    "axoexp.executors.cudagraph",
    "axoexp.executors.compiled",
    "axoexp.executors.reduce_overhead",
    "axoexp.executors.regional",
    "axoexp.executors.fused",
)

_loaded_sources: set[str] = set()
_plugin_files: list[Path] = []


def load_plugins(
    plugins_dir: str | os.PathLike[str] | None = None, on_error: Callable[[AxoexpError], None] | None = None
) -> Registry:
    """Register built-ins and entry-point plugins (once), then the plugin files of a directory.

    The directory is ``plugins_dir``, else ``$AXOEXP_PLUGINS_DIR``, else ``./plugins``;
    a directory named explicitly (argument or variable) must exist. Each directory is
    loaded once per process; a later call naming another directory loads that one too.
    A plugin that fails to load raises, naming its file; with ``on_error`` it is passed
    there instead and the others still load (so ``--help`` works despite a broken plugin).
    """
    if "builtins" not in _loaded_sources:
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        for entry_point in entry_points(group=ENTRY_POINT_GROUP):
            _import_as_plugin(f"entry point {entry_point.name} ({entry_point.value})", entry_point.load, on_error)
        _loaded_sources.add("builtins")
    named = plugins_dir or os.environ.get(PLUGINS_DIR_ENV)
    directory = Path(named or DEFAULT_PLUGINS_DIR).resolve()
    if str(directory) in _loaded_sources:
        return REGISTRY
    if named and not directory.is_dir():
        source = "the plugins_dir argument" if plugins_dir else f"${PLUGINS_DIR_ENV}"
        raise PluginLoadError(f"plugins directory {named} (from {source}) does not exist or is not a directory")
    if directory.is_dir():
        for path in sorted(directory.glob("*.py")):
            if not path.name.startswith("_"):
                _import_as_plugin(str(path), functools.partial(_import_file, path), on_error)
    _loaded_sources.add(str(directory))
    return REGISTRY


def loaded_plugin_files() -> list[Path]:
    """The source files of every plugin loaded so far (files and entry-point modules), for
    the code hash that decides whether an earlier run's result can be reused."""
    return sorted(set(_plugin_files))


def _import_as_plugin(
    source: str, load: Callable[[], Any], on_error: Callable[[AxoexpError], None] | None = None
) -> None:
    try:
        with registering_from(source):
            try:
                module = load()
            except RegistryError:
                raise
            except SystemExit as error:  # a plugin must not end the program, nor silently
                raise PluginLoadError(f"plugin {source} called sys.exit({error.code!r}) while importing") from error
            except Exception as error:
                raise PluginLoadError(f"plugin {source} failed to import: {import_failure(error, source)}") from error
    except (RegistryError, PluginLoadError) as error:
        if on_error is None:
            raise
        on_error(error)
        return
    file = getattr(module, "__file__", None)
    if file:
        _plugin_files.append(Path(file).resolve())


def import_failure(error: Exception, source: str) -> str:
    """Why a plugin failed to import, in one line: a syntax error as ``FILE:LINE:COLUMN: SyntaxError:
    MESSAGE``, anything else as its type and message's first line, with the plugin file's line that
    raised it where the traceback passes through that file."""
    if isinstance(error, SyntaxError):
        return f"{error.filename}:{error.lineno}:{error.offset}: {type(error).__name__}: {error.msg}"
    lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__) if frame.filename == source]
    return first_line(error) + (f" (at {source}:{lines[-1]})" if lines else "")


def _import_file(path: Path) -> ModuleType:
    module_name = f"axoexp_plugins.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise PluginLoadError(f"cannot import plugin file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
