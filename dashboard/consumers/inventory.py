"""The drill-down plots' consumer: new points of one field of one GPU or port, and a GPU's faults."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from dashboard.consumers.base import LiveConsumer
from dashboard.dash_apps.inventory import MAX_POINTS, parse_time, series_points
from dashboard.pages.inventory import event_rows
from telemetry.fields import KINDS
from telemetry.selectors import gpu_events, inventory
from telemetry.series import RESOLUTIONS, Series, series

LIVE_KINDS = ("gpu", "port")  # what a drill-down page follows live
# A raw read newer than `since` past this many samples means the page fell far behind (a long
# disconnect on a fast-sampling entity): it reloads its window rather than take a flood.
LIVE_MAX_POINTS = 5000
# The rollup beat runs every 30 s: a bucket is read once it ended this long ago.
ROLLUP_SETTLE = timedelta(seconds=45)
EVENTS_LIMIT = 50
_TICK = timedelta(microseconds=1)


@dataclass
class Subscription:
    """What one page plots, and how far it has been sent."""

    kind: str
    entity_id: int
    field: str
    since: datetime  # the newest point the page holds (or the start of its window)
    resolution: str = "raw"
    step: timedelta | None = None  # the page's point spacing, for rollup resolutions
    span: timedelta | None = None  # the page's window length
    tag: object = None  # echoed back, so the page can drop messages meant for its last subscription
    gpu_uuid: str | None = None  # set when the page asked for the GPU's fault events too
    events_seen: tuple | None = None


class SeriesConsumer(LiveConsumer):
    """New points of the field a drill-down page plots, and for a GPU its fault events.

    The page sends {"subscribe": {"kind": "gpu" | "port", "id": ..., "field": ..., "since": iso,
    "resolution": "raw" | "1m" | "1h", "range_s": ..., "step_s": ..., "events": bool, "tag": ...}}
    after each (re)connect and each new window; only kind, id, field and since are required. On
    that and on every telemetry tick it sends {"type": "points", ...} with the points newer than
    the last one sent (raw samples, counters as rates; at a rollup resolution only buckets that
    are complete), and with "events" for a GPU {"type": "events", ...} with its fault events
    (the first time, then whenever they change). Every message echoes the subscription's tag.
    """

    async def connect(self) -> None:
        self.sub: Subscription | None = None
        await super().connect()

    async def receive_json(self, content, **kwargs) -> None:
        raw = content.get("subscribe") if isinstance(content, dict) else None
        sub = await database_sync_to_async(parse_subscription)(raw)
        if isinstance(sub, str):
            await self.send_json({"type": "error", "message": sub})
            return
        self.sub = sub
        self.refresh()

    async def push(self) -> None:
        sub = self.sub
        if sub is None:
            return
        messages = await database_sync_to_async(changes)(sub, timezone.now())
        if sub is not self.sub:
            return  # the page subscribed anew while we read: its own refresh follows
        for message in messages:
            await self.send_json({**message, "tag": sub.tag})


def parse_subscription(raw) -> Subscription | str:
    """The subscription a page asked for, or what is wrong with it."""
    if not isinstance(raw, dict):
        return "expected {\"subscribe\": {\"kind\", \"id\", \"field\", \"since\"}}"
    kind, field = raw.get("kind"), raw.get("field")
    if kind not in LIVE_KINDS:
        return f"unknown kind: {kind!r}; expected one of {sorted(LIVE_KINDS)}"
    if field not in KINDS[kind].by_name:
        return f"unknown {kind} field: {field!r}"
    since = parse_time(raw.get("since")) if isinstance(raw.get("since"), str) else None
    if since is None:
        return f"since must be an ISO 8601 time, got {raw.get('since')!r}"
    resolution = raw.get("resolution") or "raw"
    if resolution not in RESOLUTIONS:
        return f"unknown resolution: {resolution!r}"
    try:
        entity_id = int(raw.get("id"))
        span = _seconds(raw.get("range_s"))
        step = _seconds(raw.get("step_s"))
    except (TypeError, ValueError, OverflowError):
        return "id must be an integer; range_s and step_s positive numbers of seconds"
    uuid = inventory.gpu_uuid(entity_id) if kind == "gpu" else None
    if (uuid if kind == "gpu" else inventory.entity_id("port", str(entity_id))) is None:
        return f"no {kind} with id {raw.get('id')!r}"
    if resolution != "raw" and (span is None or step is None):
        return "a rollup subscription needs range_s and step_s"
    events_of = uuid if kind == "gpu" and raw.get("events") else None
    return Subscription(kind, entity_id, field, since, resolution, step, span, raw.get("tag"), events_of)


def _seconds(value) -> timedelta | None:
    if value is None:
        return None
    seconds = float(value)
    if not seconds > 0:
        raise ValueError(value)
    return timedelta(seconds=seconds)


def changes(sub: Subscription, now: datetime) -> list[dict]:
    """The messages this subscription is owed now; advances `sub` past what they carry."""
    out = []
    points = _new_points(sub, now)
    if points is not None:
        out.append(points)
    if sub.gpu_uuid is not None:
        rows = event_rows(gpu_events(gpu_uuid=sub.gpu_uuid, limit=EVENTS_LIMIT))
        seen = tuple((e["kind"], e["code"], e["first_seen"], e["last_seen"], e["count"], e["open"]) for e in rows)
        if seen != sub.events_seen:
            sub.events_seen = seen
            out.append({"type": "events", "events": rows})
    return out


def _new_points(sub: Subscription, now: datetime) -> dict | None:
    s = _read_raw(sub, now) if sub.resolution == "raw" else _read_rollup(sub, now)
    if s is None or isinstance(s, dict):
        return s
    # The page draws its own gap before the first new point (it knows its step); a trailing
    # marker would only precede a bucket that is not complete yet.
    keep = [i for i, (_, v) in enumerate(s.points) if v is not None]
    if not keep:
        return None
    keep = range(keep[0], keep[-1] + 1)
    s = replace(s, points=[s.points[i] for i in keep], band=s.band and [s.band[i] for i in keep])
    sub.since = s.points[-1][0]
    return {"type": "points", "kind": sub.kind, "id": sub.entity_id, "field": sub.field,
            "resolution": s.resolution, **series_points(s)}


def _read_raw(sub: Subscription, now: datetime) -> Series | dict:
    start = sub.since + _TICK
    if sub.span is not None:
        start = max(start, now - sub.span)
    # Ingest accepts samples up to INGEST_MAX_FUTURE_SKEW ahead of the server's clock.
    end = max(now, start) + settings.INGEST_MAX_FUTURE_SKEW
    try:
        return series(sub.kind, sub.entity_id, sub.field, start, end, resolution="raw", max_points=LIVE_MAX_POINTS)
    except ValueError:
        return {"type": "reload"}


def _read_rollup(sub: Subscription, now: datetime) -> Series | None:
    # The next bucket is complete once it has ended and the rollup beat has run after it.
    if now < sub.since + 2 * sub.step + ROLLUP_SETTLE:
        return None
    s = series(sub.kind, sub.entity_id, sub.field, now - sub.span, now, resolution=sub.resolution,
               max_points=MAX_POINTS)
    if s.step != sub.step:
        return None  # the window's bucket width moved: the page keeps its own until it reloads
    keep = [i for i, (t, _) in enumerate(s.points) if t > sub.since and t + s.step + ROLLUP_SETTLE <= now]
    return replace(s, points=[s.points[i] for i in keep], band=s.band and [s.band[i] for i in keep])
