"""The Jobs pages' consumer: the job list's row changes and one job's rank and step changes.

A page subscribes by message after each (re)connect, and again when its filters change:

    {"subscribe": "list", "sub": 3, "state": "running", "account": "", "user": "", "partition": "",
     "q": "", "limit": 50, "offset": 0}
    {"subscribe": "job", "sub": 1, "key": "slurm:4242", "since": "<ISO time>", "bucket_s": 15}

Every message echoes `sub`, so a page drops what was computed for a subscription it has left.
The first message after a subscription is the whole state ("full": true); on each telemetry
tick after that only what changed goes out:

- list: {"type": "list", "rows": [rows changed or new], "removed": [keys], "order": [keys] when
  the page's order changed, "total"}. Durations (queued, runtime) are derived from the times
  in the browser, so the clock alone never makes a row "changed".
- job: {"type": "job", "job": fields if changed, "history" if changed, "ranks": [ranks whose
  place, GPU state, step time or straggler flag changed], "removed": [ranks gone], "gang",
  "locality" if changed, "steps": step-time buckets from the page's last bucket on}. With
  `since` and `bucket_s` the step points come in the page's own bucket width, so they line up
  with what the page drew. The last bucket sent is read again, as it may have filled since, and
  goes out again only if its value changed; the page replaces its points from the first one on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from dashboard.consumers.base import LiveConsumer, TickMemo
from telemetry.selectors import job_detail, job_list, job_step_series

MAX_LIST_LIMIT = 200
MAX_STEP_BUCKETS = 2000  # a page away for days asks for at most this many buckets at once
# Compared to decide whether a row or rank changed; derived from the clock or never shown live.
_ROW_VOLATILE = frozenset({"queued_s", "runtime_s"})
_RANK_VOLATILE = frozenset({"sample_time"})
_LIST_FILTERS = ("state", "account", "user", "partition", "q")
# Pages on the same job, or the same list filters, share one read per tick.
_shared = TickMemo()


def now() -> datetime:
    """The consumer's clock (tests pin it)."""
    return timezone.now()


@dataclass
class Sent:
    """What one subscription has sent so far; a new subscription starts a new one, so a pass
    still computing for the old subscription cannot leave its state behind."""

    full: bool = True  # nothing sent yet: the next message carries everything
    rows: dict[str, dict] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    total: int | None = None
    parts: dict[str, object] = field(default_factory=dict)  # job, history, gang, locality
    ranks: dict[int, dict] = field(default_factory=dict)
    tails: dict[int | str, tuple[str, float]] = field(default_factory=dict)  # last step point per series


class JobConsumer(LiveConsumer):
    """The job list and the job page; see the module docstring for the messages."""

    pace_memo = _shared  # passes paced by what its shared reads cost (LiveConsumer)

    async def connect(self) -> None:
        self.sub: dict | None = None
        self.seq = 0
        await super().connect()

    async def receive_json(self, content, **kwargs) -> None:
        sub = parse_subscription(content)
        if isinstance(sub, str):
            await self.send_json({"type": "error", "message": sub})
            return
        self.sub = sub
        self.tick = None  # a fresh read, not the last tick's
        self.refresh()

    async def push(self) -> None:
        sub = self.sub
        if sub is None:
            return
        change = list_change if sub["kind"] == "list" else job_change
        msg = await _shared.run(change, sub, self.tick)
        if msg is None or sub is not self.sub:
            return  # nothing new, or the page subscribed anew while we read: its refresh follows
        self.seq += 1
        sub["sent"].full = False
        await self.send_json({**msg, "sub": sub["sub"], "seq": self.seq})


def list_change(sub: dict, tick: str | None = None) -> dict | None:
    """The job list's message for this pass, recording what it sends."""
    sent: Sent = sub["sent"]
    key = ("list", tuple(sorted(sub["filters"].items())), sub["limit"], sub["offset"])
    data = _shared.get(
        key, tick, lambda: job_list(**sub["filters"], limit=sub["limit"], offset=sub["offset"], now=now())
    )
    msg = list_diff(sent.rows, sent.order, sent.total, data, full=sent.full)
    sent.rows = {row["key"]: row for row in data["jobs"]}
    sent.order, sent.total = [row["key"] for row in data["jobs"]], data["total"]
    return msg


def job_change(sub: dict, tick: str | None = None) -> dict | None:
    """The job page's message for this pass, recording what it sends."""
    sent: Sent = sub["sent"]
    detail = _shared.get(("job", sub["key"]), tick, lambda: job_detail(sub["key"], now=now()))
    if detail is None:
        return {"type": "error", "message": f"unknown job: {sub['key']!r}"} if sent.full else None
    msg = job_diff(sent.parts, sent.ranks, detail, full=sent.full)
    sent.parts = {name: detail[name] for name in ("job", "history", "gang", "locality")}
    sent.ranks = {r["rank"]: r for r in detail["ranks"]}
    steps = new_steps(sub, detail["job"]["id"])
    if steps is not None:
        msg = msg or {"type": "job", "key": sub["key"], "full": False}
        msg["steps"] = steps
    return msg


def new_steps(sub: dict, job_id: int) -> dict | None:
    """Step buckets from the page's last one on, in its bucket width; None when none is new."""
    if sub["since"] is None:
        return None
    tails = sub["sent"].tails
    width, start = sub["bucket_s"], sub["since"]
    # An exact multiple of the width, so the selector picks the page's bucket width.
    count = min(MAX_STEP_BUCKETS, math.floor((now() - start).total_seconds() / width) + 2)
    series = job_step_series(job_id, start, start + timedelta(seconds=width * count), max_points=count)
    if series is None:
        return None
    ranks = [r for r in (unsent(tails, r["rank"], r) for r in series["ranks"]) if r]
    gang = unsent(tails, "gang", series["gang_median"])
    if not ranks and gang is None:
        return None
    sub["since"] = max(parse_datetime(t) for t, _ in tails.values())
    return {"bucket_s": series["bucket_s"], "ranks": ranks, "gang_median": gang or {"times": [], "step_time_s": []}}


# --- pure parts, tested on their own -------------------------------------------------------------

def parse_subscription(content) -> dict | str:
    """A subscription message as the consumer keeps it, or the reason it was refused."""
    if not isinstance(content, dict) or content.get("subscribe") not in ("list", "job"):
        return "expected {\"subscribe\": \"list\" | \"job\", ...}"
    sub_id = content.get("sub", 0)
    if content["subscribe"] == "list":
        filters = {name: _text(content.get(name)) for name in _LIST_FILTERS}
        limit, offset = _int(content.get("limit"), 50), _int(content.get("offset"), 0)
        return {"kind": "list", "sub": sub_id, "filters": filters, "sent": Sent(),
                "limit": min(max(limit, 1), MAX_LIST_LIMIT), "offset": max(offset, 0)}
    key = _text(content.get("key"))
    if not key or ":" not in key:
        return f"expected a job key 'source:id', got {content.get('key')!r}"
    since = parse_datetime(content["since"]) if isinstance(content.get("since"), str) else None
    if since is not None and since.tzinfo is None:
        since = None
    return {"kind": "job", "sub": sub_id, "key": key, "since": since, "sent": Sent(),
            "bucket_s": max(1, _int(content.get("bucket_s"), 15))}


def list_diff(rows: dict[str, dict], order: list[str], total: int | None, data: dict, *, full: bool) -> dict | None:
    """What the page must change to show `data`, given what it was sent; None when nothing."""
    new_order = [row["key"] for row in data["jobs"]]
    changed = [row for row in data["jobs"] if full or _row(rows.get(row["key"])) != _row(row)]
    removed = [key for key in order if key not in set(new_order)]
    if not (full or changed or removed or new_order != order or data["total"] != total):
        return None
    msg = {"type": "list", "full": full, "rows": changed, "removed": removed, "total": data["total"]}
    if full or new_order != order:
        msg["order"] = new_order
    return msg


def job_diff(parts: dict, ranks: dict[int, dict], detail: dict, *, full: bool) -> dict | None:
    """The job page's change, given what it was sent; None when nothing changed."""
    msg: dict = {"type": "job", "key": detail["job"]["key"], "full": full}
    if full:
        msg.update(detail)
        return msg
    if _row(parts.get("job")) != _row(detail["job"]):
        msg["job"] = detail["job"]
    for name in ("history", "gang", "locality"):
        if parts.get(name) != detail[name]:
            msg[name] = detail[name]
    changed = [r for r in detail["ranks"] if _rank(ranks.get(r["rank"])) != _rank(r)]
    gone = sorted(set(ranks) - {r["rank"] for r in detail["ranks"]})
    if changed:
        msg["ranks"] = changed
    if gone:
        msg["removed"] = gone
    return msg if len(msg) > 3 else None


def _row(row: dict | None) -> dict | None:
    return None if row is None else {k: v for k, v in row.items() if k not in _ROW_VOLATILE}


def _rank(rank: dict | None) -> dict | None:
    """A rank as compared: step times move a hair with every new step, so to the millisecond."""
    if rank is None:
        return None
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in rank.items() if k not in _RANK_VOLATILE}


def unsent(tails: dict, name, series: dict) -> dict | None:
    """`series` without the point the page already has (the re-read last bucket, unchanged), or
    None when nothing new is left; records the series' new last point in `tails`."""
    times, values = series["times"], series["step_time_s"]
    if times and tails.get(name) == (times[0], values[0]):
        times, values = times[1:], values[1:]
    points = [(t, v) for t, v in zip(times, values, strict=True) if v is not None]
    if not points:
        return None
    tails[name] = points[-1]
    return {**series, "times": times, "step_time_s": values}


def _text(value) -> str:
    return value.strip()[:200] if isinstance(value, str) else ""


def _int(value, default: int) -> int:
    if isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
