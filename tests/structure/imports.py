"""The project's import graph, read from the source with `ast` (nothing is imported).

Layers, lowest first: core ← telemetry ← anomaly ← tenancy ← alerts ← dashboard. An app may import its own
modules and those of lower layers; an import of a higher layer is "upward".
Imports under `if TYPE_CHECKING:` are left out (they never run).
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = {"core": 0, "telemetry": 1, "anomaly": 2, "tenancy": 3, "alerts": 4, "dashboard": 5}


@dataclass(frozen=True)
class Import:
    source: str  # module that imports
    target: str  # project module imported
    line: int
    in_function: bool
    reason: str  # the comment on the import's line (function-level imports must say why)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    out = {}
    for app in LAYERS:
        for path in sorted((REPO / app).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that `name` names or lies in."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, known: dict[str, Path]) -> list[Import]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []

    def comment(lineno: int, end: int) -> str:
        for ln in range(lineno, end + 1):
            _, hash_, rest = lines[ln - 1].partition("#")
            if hash_:
                return rest.strip()
        return ""

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            fn = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (child.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in child.names]
            for name in dict.fromkeys(names):
                target = _resolve(name, known)
                if target and target != module:
                    out.append(Import(module, target, child.lineno, in_function,
                                      comment(child.lineno, getattr(child, "end_lineno", child.lineno))))
            visit(child, fn)

    visit(tree, False)
    return out


@functools.cache
def all_imports() -> list[Import]:
    known = modules()
    return [imp for mod, path in known.items() for imp in imports_of(mod, path, known)]


def app_of(module: str) -> str:
    return module.split(".")[0]


def upward(imports: list[Import]) -> list[Import]:
    out = []
    for imp in imports:
        a, b = app_of(imp.source), app_of(imp.target)
        if LAYERS[b] > LAYERS[a]:
            out.append(imp)
    return out


def circles(imports: list[Import]) -> list[list[str]]:
    """Strongly connected sets of modules, largest first (Tarjan, iterative). An import inside a function is an
    edge like any other: it runs later, but the two modules still depend on each other."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.source, set()).add(imp.target)
        graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out, key=len, reverse=True)


def report() -> str:
    imps = all_imports()
    circ = circles(imps)
    up = upward(imps)
    fn = [i for i in imps if i.in_function]
    lines = [f"largest_circle={len(circ[0]) if circ else 0} circles_over_2={sum(len(c) > 2 for c in circ)} "
             f"upward={len(up)} function_imports={len(fn)} function_imports_without_reason="
             f"{sum(not i.reason for i in fn)}"]
    lines += [f"circle ({len(c)}): {' '.join(c)}" for c in circ]
    lines += [f"upward: {i.source}:{i.line} -> {i.target}{' (in a function)' if i.in_function else ''}" for i in up]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(report() + "\n")
