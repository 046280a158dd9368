"""The module map stays acyclic: no module of axoexp imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

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


def test_axoexp_has_no_import_cycles() -> None:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}
    # a package's __init__ re-exporting its submodules is not a dependency of theirs
    graph = {
        name: {target for target in targets if not name.startswith(f"{target}.")} for name, targets in graph.items()
    }
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
