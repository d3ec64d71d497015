"""The project's module import graph: cycles, largest modules, who imports whom.

Every import counts, lazy ones inside functions and ``TYPE_CHECKING`` ones included: a cycle
hidden behind a function-level import is still a cycle for a reader.

    python scripts/module_graph.py            # a summary
    python scripts/module_graph.py --json     # the graph itself
    python scripts/module_graph.py --packages # modules per package, arrows between packages
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "common",
    "producer",
    "broker",
    "worker",
    "collector",
    "simulator",
    "training",
    "cli",
    "capture",
)


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


def outside_imports(path: Path) -> set[str]:
    """Top-level names of the non-project packages ``path`` imports (``celery``, ``redis``...)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.partition(".")[0])
    return out - set(PACKAGES)


def package_of(module: str) -> str:
    """``worker.chat.client`` -> ``worker.chat``; a top-level package's own modules -> it."""
    parts = module.split(".")
    return ".".join(parts[:-1]) if len(parts) > 1 else module


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import."""
    arrows: dict[str, set[str]] = {package_of(m): set() for m in edges}
    for module, deps in edges.items():
        arrows[package_of(module)].update(package_of(d) for d in deps)
    return {package: deps - {package} for package, deps in arrows.items()}


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
    parser.add_argument("--packages", action="store_true", help="print the package graph")
    args = parser.parse_args()
    edges = graph()
    if args.json:
        print(json.dumps({k: sorted(v) for k, v in sorted(edges.items())}, indent=1))
        return
    if args.packages:
        _print_packages(edges)
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


def _print_packages(edges: dict[str, set[str]]) -> None:
    sizes: dict[str, int] = {}
    for name, path in modules().items():
        if path.name != "__init__.py":
            sizes[package_of(name)] = sizes.get(package_of(name), 0) + 1
    for package, deps in sorted(package_graph(edges).items()):
        arrow = f" -> {', '.join(sorted(deps))}" if deps else ""
        print(f"{package} ({sizes.get(package, 0)} modules){arrow}")


if __name__ == "__main__":
    main()
