"""The project's module import graph: cycles, largest modules, who imports whom.

Every import counts, lazy ones inside functions and ``TYPE_CHECKING`` ones included: a cycle
hidden behind a function-level import is still a cycle for a reader.

    python scripts/module_graph.py            # a summary
    python scripts/module_graph.py --json     # the graph itself
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "producer", "broker", "worker", "collector", "simulator", "training", "cli")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every module of the project's packages."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules ``path`` imports, wherever the import statement sits."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(_resolve(alias.name, known) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            for alias in node.names:
                out.add(_resolve(f"{base}.{alias.name}", known) or _resolve(base, known))
    out.discard("")
    out.discard(name)
    return out


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _resolve(dotted: str, known: set[str]) -> str:
    # The longest known prefix: ``from worker import app`` is worker.app, not worker.
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return ""


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    mods = modules(root)
    known = set(mods)
    return {name: imports_of(path, name, known) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the graph as JSON")
    args = parser.parse_args()
    edges = graph()
    if args.json:
        print(json.dumps({k: sorted(v) for k, v in sorted(edges.items())}, indent=1))
        return
    found = cycles(edges)
    print(f"modules: {len(edges)}, import edges: {sum(len(v) for v in edges.values())}")
    print(f"cycles: {len(found)}")
    for component in found:
        print("  " + " <-> ".join(component))
    sizes = sorted(
        ((len(p.read_text().splitlines()), n) for n, p in modules().items()), reverse=True
    )
    print("largest modules: " + ", ".join(f"{n} {lines}" for lines, n in sizes[:6]))


if __name__ == "__main__":
    main()
