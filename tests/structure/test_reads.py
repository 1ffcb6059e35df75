"""The dashboard reads through selectors: no page view, Dash app or consumer runs a query of its own (a model
manager, `visible_to`, or a database cursor). What a page shows is then decided where the other pages and the
API decide it, and scoped there. Management commands (account set-up) are left out."""

from __future__ import annotations

import ast

from tests.structure.imports import REPO

EXEMPT = ("dashboard/management/", "dashboard/migrations/", "dashboard/settings.py")


def reads_in_dashboard() -> list[str]:
    out = []
    for path in sorted((REPO / "dashboard").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel.startswith(EXEMPT):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("objects", "visible_to", "cursor", "raw"):
                if node.attr == "raw" and not (isinstance(node.value, ast.Attribute) and node.value.attr == "objects"):
                    continue
                out.append(f"{rel}:{node.lineno}: .{node.attr}")
    return out


def test_the_dashboard_runs_no_query_of_its_own():
    found = reads_in_dashboard()
    assert not found, "queries in the dashboard; read through a selector instead:\n" + "\n".join(found)


def test_the_check_finds_a_query(tmp_path, monkeypatch):
    (tmp_path / "dashboard").mkdir()
    (tmp_path / "dashboard" / "view.py").write_text("def v():\n    return Gpu.objects.filter(pk=1)\n")
    monkeypatch.setattr("tests.structure.test_reads.REPO", tmp_path)
    assert reads_in_dashboard() == ["dashboard/view.py:2: .objects"]
