"""The module map: acyclic, layered (no module imports one of a higher layer), and the
read-only commands (report, sync, compare) start without torch or the executors."""

from __future__ import annotations

import ast
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "axoexp"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """axoexp modules ``path`` imports anywhere (TYPE_CHECKING blocks and functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name in modules}


# Lowest first. A module may import modules of its own layer or below, never above.
LAYERS = (
    # vocabulary and leaf helpers: no axoexp imports beyond this layer
    (
        "axoexp.names",
        "axoexp.errors",
        "axoexp.statistics",
        "axoexp.processes",
        "axoexp.interfaces",
        "axoexp.timing",
        "axoexp.wallclock",
        "axoexp.collector",
        "axoexp.nvml",
        "axoexp.signals",
        "axoexp.lengths",
        "axoexp.stdout",
        "axoexp.redact",
        "axoexp.databases",
        "axoexp.versions",
    ),
    # the registry, the store, the output folders, the process's runtime, the windows of a run, the kernels
    (
        "axoexp.registry",
        "axoexp.runtime",
        "axoexp.tracking",
        "axoexp.readers",
        "axoexp.outputs",
        "axoexp.windows",
        "axoexp.kernels*",
        "axoexp.executors.matmul_decomposition",
        "axoexp.executors.compiler_startup",
    ),
    # what plugs in and what a run holds: components, executors, plugins, config, leases, journal
    (
        "axoexp",
        "axoexp.plugins",
        "axoexp.config",
        "axoexp.targets",
        "axoexp.lease",
        "axoexp.metadata",
        "axoexp.journal",
        "axoexp.components*",
        "axoexp.executors*",
        "axoexp.conf*",
    ),
    # the parts of a run and of its recovery
    (
        "axoexp.measure",
        "axoexp.contention",
        "axoexp.guard",
        "axoexp.progress",
        "axoexp.verification",
        "axoexp.plan",
        "axoexp.sweep_plan",
        "axoexp.banks",
        "axoexp.sync",
        "axoexp.job_process",
        "axoexp.worker_pool",
    ),
    # whole flows
    (
        "axoexp.describe",
        "axoexp.experiment",
        "axoexp.sweep",
        "axoexp.report*",
        "axoexp.compare",
        "axoexp.search",
        "axoexp.parallel_launcher",
    ),
    # the command line
    ("axoexp.console", "axoexp.cli", "axoexp.compose_once", "axoexp.__main__"),
)


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}
    # a package's __init__ re-exporting its submodules is not a dependency of theirs
    return {
        name: {target for target in targets if not name.startswith(f"{target}.")} for name, targets in graph.items()
    }


def _layer(module: str) -> int:
    matches = [index for index, layer in enumerate(LAYERS) for pattern in layer if fnmatch(module, pattern)]
    assert matches, f"{module} is in no layer of tests/test_architecture.py: place it"
    return max(matches)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{name} (layer {_layer(name)}) -> {target} (layer {_layer(target)})"
        for name, targets in sorted(_graph().items())
        for target in sorted(targets)
        if _layer(target) > _layer(name)
    ]
    assert not upward, "upward imports: " + "; ".join(upward)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["axoexp.report", "axoexp.sync", "axoexp.compare"])
def test_read_only_commands_import_neither_torch_nor_the_executors(command: str) -> None:
    """``python -m axoexp.report --help`` (and sync) start without torch: seconds saved, nothing to break."""
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['{command}', '--help']\n"
        "try:\n"
        f"    runpy.run_module('{command}', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('axoexp.executors'))\n"
        "print('LOADED', loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "LOADED []" in out, out


def test_axoexp_has_no_import_cycles() -> None:
    graph = _graph()
    cycles = []

    def visit(node: str, stack: list[str], done: set[str]) -> None:
        if node in stack:
            cycles.append(stack[stack.index(node) :] + [node])
            return
        if node in done:
            return
        for target in sorted(graph[node]):
            visit(target, [*stack, node], done)
        done.add(node)

    done: set[str] = set()
    for name in sorted(graph):
        visit(name, [], done)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in cycles)
