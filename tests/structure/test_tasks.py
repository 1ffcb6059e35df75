"""Every task queued by name (`core.queue.enqueue("app.tasks.x", ...)`) is one that a `tasks.py` registers under
that name, and every task the beat schedule names exists: a typo would otherwise be found by the worker, which
drops an unknown task with only a log line."""

from __future__ import annotations

import ast
import re

from tests.structure.imports import LAYERS, REPO


def registered() -> set[str]:
    names = set()
    for app in LAYERS:
        for path in (REPO / app).rglob("tasks.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "shared_task":
                    names |= {kw.value.value for kw in node.keywords if kw.arg == "name"}
    return names


def queued() -> list[tuple[str, int, str]]:
    out = []
    for app in LAYERS:
        for path in (REPO / app).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "enqueue":
                    first = node.args[0] if node.args else None
                    name = first.value if isinstance(first, ast.Constant) else None
                    out.append((str(path.relative_to(REPO)), node.lineno, name))
    return out


def test_every_task_has_an_explicit_name():
    for app in LAYERS:
        for path in (REPO / app).rglob("tasks.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "shared_task":
                    assert any(kw.arg == "name" for kw in node.keywords), f"{path}:{node.lineno}: no name="


def test_every_queued_name_is_a_registered_task():
    names, calls = registered(), queued()
    assert len(calls) >= 8  # routing, delivery, the lifecycle, remediation and evaluation all queue by name
    wrong = [f"{p}:{line}: {name!r}" for p, line, name in calls if name not in names]
    assert not wrong, "enqueue() with a name no tasks.py registers (or not a string literal):\n" + "\n".join(wrong)


def test_every_scheduled_task_exists():
    settings = (REPO / "dashboard" / "settings.py").read_text()
    scheduled = set(re.findall(r'"task":\s*"([^"]+)"', settings))
    assert scheduled and scheduled <= registered(), sorted(scheduled - registered())
