"""Time helpers every app shares."""

from __future__ import annotations

from datetime import UTC, datetime


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC (`2026-11-30T12:00:00+00:00`): the one spelling of a time in every JSON answer."""
    return moment.astimezone(UTC).isoformat()
