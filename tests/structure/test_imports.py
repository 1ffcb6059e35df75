"""The import graph holds its shape: imports run one way (core ← telemetry ← anomaly ← tenancy ← alerts ←
dashboard), no circle of more than two modules (imports inside functions count), and an import inside a function
says why it is there (the start-up order it waits for, or the heavy import it delays), in a comment on its line.
"""

from __future__ import annotations

from tests.structure.imports import Import, all_imports, circles, report, upward


def test_no_import_runs_upward():
    up = upward(all_imports())
    assert not up, "imports against the layering (core ← telemetry ← anomaly ← tenancy ← alerts ← dashboard):\n" + \
        "\n".join(f"{i.source}:{i.line} -> {i.target}" for i in up)


def test_no_circle_of_more_than_two_modules():
    big = [c for c in circles(all_imports()) if len(c) > 2]
    assert not big, "import circles:\n" + "\n".join(" ".join(c) for c in big)


def test_function_level_imports_say_why():
    unexplained = [f"{i.source}:{i.line} -> {i.target}" for i in all_imports() if i.in_function and not i.reason]
    assert not unexplained, ("imports inside functions without a comment saying why (a real cycle it breaks, or a "
                             "heavy import it delays); import at the top, or say why:\n" + "\n".join(unexplained))


def test_the_checks_catch_an_upward_import_and_a_circle():
    def imp(a, b, fn=False):
        return Import(a, b, 1, fn, "")

    assert [i.target for i in upward([imp("telemetry.x", "alerts.y"), imp("alerts.y", "telemetry.x")])] == ["alerts.y"]
    assert upward([imp("dashboard.a", "core.api"), imp("tenancy.a", "anomaly.b")]) == []
    three = [imp("alerts.a", "alerts.b"), imp("alerts.b", "alerts.c"), imp("alerts.c", "alerts.a")]
    assert circles(three) == [["alerts.a", "alerts.b", "alerts.c"]]
    # A function-level import closes a circle too: deferring it hides the dependency, it does not remove it...
    assert circles([*three[:2], imp("alerts.c", "alerts.a", fn=True)]) == [["alerts.a", "alerts.b", "alerts.c"]]
    # ...and two modules importing each other are allowed (a model and its manager, say).
    assert circles(three[:1] + [imp("alerts.b", "alerts.a")]) == [["alerts.a", "alerts.b"]]


def test_the_report_reads_the_real_tree():
    first = report().splitlines()[0]
    assert first.startswith("largest_circle=") and "upward=" in first
    assert len(all_imports()) > 500
