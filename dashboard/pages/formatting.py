"""Times and durations as every page writes them (drilldown.js renders pushed events the same way)."""

from __future__ import annotations


def when(iso: str | None) -> str:
    """"2026-11-30 12:00:00 UTC" from a selector's ISO 8601 UTC string; "—" for None."""
    return "—" if not iso else f"{iso[:10]} {iso[11:19]} UTC"


def duration(seconds: float | None) -> str:
    """"45 s", "12 min", "3 h 5 min", "2 d 4 h"."""
    if seconds is None:
        return "—"
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{int(seconds)} s"
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours < 48 else f"{hours // 24} d {hours % 24} h"
