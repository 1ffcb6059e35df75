"""The facility pages' consumer: NVLink domains and power and cooling.

A page subscribes after each (re)connect, one subscription per connection:

    {"subscribe": "nvlink", "layout": "<the layout id of the payload the page drew>"}
    {"subscribe": "power"}

The first pass after a subscription sends the whole state ("full": true); each telemetry tick after
that sends only what changed, and nothing when nothing did.

- nvlink. Daphne refuses websocket messages over 1 MiB, and at 16,384 GPUs every value is ~1.4 MB
  of JSON, so values go in parts. Full: {"type": "nvlink", "full": true, "layout", "offset",
  "state": [...], "v": [[...] per field]} for the GPUs from `offset` on (`FULL_CHUNK` at a time),
  the first part also carrying "generated_at", "by_state" and "domains" (all of them), the last
  one "last": true. Changes: {"type": "nvlink", "full": false, "layout", "gpus": {"state" or a
  field: [[positions], [values]]}} in parts of at most `MAX_ENTRIES` values, the first part also
  carrying "generated_at", "by_state" and "domains": {position: domain} for the domains that
  changed. Positions index the columns of the layout the page drew (`nvlink_payload`). When the
  layout is not the page's (GPUs or domains appeared, left or moved), the one message is
  {"type": "nvlink", "reload": true, "layout"}: the page reloads through its Dash callback, which
  has no size limit, and subscribes again with the new layout.
- power, full: `power_overview()`. Changes: {"type": "power", "full": false, "generated_at",
  "racks": [racks whose draw, source or reporting changed], "rows", "halls", "total" and
  "cooling_loops" (whole, each only when any of it changed), "pue": {pue, facility_w, it_w,
  pue_devices, pue_devices_reporting} when changed}. Racks or loops added or removed: full.

On one tick every open page in this process shares one read per kind (`SharedRead`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from dashboard.consumers.base import LiveConsumer, TickMemo
from dashboard.dash_apps.facility import nvlink_payload
from telemetry.selectors import nvlink_domains, power_overview

KINDS = ("nvlink", "power")
FULL_CHUNK = 2048  # GPUs per full-values part: ~250 kB of JSON
MAX_ENTRIES = 32_768  # changed values per part: ~650 kB of JSON at worst
PUE_KEYS = ("pue", "facility_w", "it_w", "pue_devices", "pue_devices_reporting")
POWER_PARTS = ("rows", "halls", "total", "cooling_loops")


def now() -> datetime:
    """The consumer's clock (tests pin it)."""
    return timezone.now()


def read(kind: str) -> dict:
    """The page's whole state now."""
    if kind == "nvlink":
        return nvlink_payload(nvlink_domains(now()))
    return power_overview(now())


_shared = TickMemo()  # one read per kind and tick, for every page in the process


@dataclass
class Sent:
    """What one subscription has sent; a new subscription starts a new one."""

    kind: str
    page_layout: str | None = None  # the layout the page drew (nvlink)
    full: bool = True
    reload_sent: str | None = None  # the layout the page was told to reload for
    states: list[int] = field(default_factory=list)
    columns: list[list] = field(default_factory=list)
    domains: list[dict] = field(default_factory=list)
    by_state: dict | None = None
    racks: dict[int, dict] = field(default_factory=dict)
    loop_ids: list[int] = field(default_factory=list)
    parts: dict[str, object] = field(default_factory=dict)


class FacilityConsumer(LiveConsumer):
    """The NVLink and power pages; see the module docstring for the messages."""

    pace_memo = _shared  # passes paced by what its shared reads cost (LiveConsumer)

    async def connect(self) -> None:
        self.sent: Sent | None = None
        self.seq = 0
        await super().connect()

    async def receive_json(self, content, **kwargs) -> None:
        kind = content.get("subscribe") if isinstance(content, dict) else None
        if kind not in KINDS:
            await self.send_json({"type": "error", "message": f"expected {{\"subscribe\": \"nvlink\" | \"power\"}}, "
                                                              f"got {kind!r}"})
            return
        layout = content.get("layout")
        self.sent = Sent(kind=kind, page_layout=layout if isinstance(layout, str) else None)
        self.tick = None  # a fresh read, not the last tick's
        self.refresh()

    async def push(self) -> None:
        sent = self.sent
        if sent is None:
            return
        data = await _shared.run(_shared.get, sent.kind, self.tick, read, sent.kind)
        if sent is not self.sent:
            return  # the page subscribed anew while we read: its own refresh follows
        msgs = nvlink_change(sent, data) if sent.kind == "nvlink" else power_change(sent, data)
        for msg in msgs:
            self.seq += 1
            await self.send_json({**msg, "seq": self.seq})


# --- pure parts, tested on their own -------------------------------------------------------------

def nvlink_change(sent: Sent, payload: dict) -> list[dict]:
    """The NVLink page's messages for this pass, recording what they send; [] when nothing."""
    if payload["layout"] != sent.page_layout:
        if sent.reload_sent == payload["layout"]:
            return []  # told already: the page's new subscription starts afresh
        sent.reload_sent = payload["layout"]
        return [{"type": "nvlink", "reload": True, "layout": payload["layout"]}]
    head = {"type": "nvlink", "full": sent.full, "layout": payload["layout"]}
    first = {"generated_at": payload["generated_at"], "by_state": payload["by_state"]}
    states, columns = payload["gpus"]["state"], payload["gpus"]["v"]
    if sent.full:
        msgs = [{**head, "offset": o, "state": states[o:o + FULL_CHUNK], "v": [c[o:o + FULL_CHUNK] for c in columns]}
                for o in range(0, len(states), FULL_CHUNK)] or [{**head, "offset": 0, "state": [], "v": []}]
        msgs[0].update(first, domains=payload["domains"])
        msgs[-1]["last"] = True
    else:
        changes = {"state": _changed(sent.states, states)}
        changes.update({f: _changed(old, new) for f, old, new in zip(payload["fields"], sent.columns, columns,
                                                                        strict=True)})
        domains = {str(i): d for i, d in enumerate(payload["domains"]) if d != sent.domains[i]}
        if not domains and payload["by_state"] == sent.by_state and not any(p for p, _ in changes.values()):
            return []
        msgs = [{**head, "gpus": part} for part in _parts(changes)] or [{**head, "gpus": {}}]
        msgs[0].update(first, domains=domains)
    sent.full, sent.states, sent.columns = False, states, columns
    sent.domains, sent.by_state = payload["domains"], payload["by_state"]
    return msgs


def _changed(old: list, new: list) -> tuple[list[int], list]:
    """(positions, new values) where `new` differs from `old`."""
    pos = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
    return pos, [new[i] for i in pos]


def _parts(changes: dict[str, tuple[list[int], list]]) -> list[dict]:
    """{name: [[positions], [values]]} split so that no part holds more than MAX_ENTRIES values."""
    parts: list[dict] = []
    room = 0
    for name, (pos, values) in changes.items():
        start = 0
        while start < len(pos):
            if room == 0:
                parts.append({})
                room = MAX_ENTRIES
            take = min(room, len(pos) - start)
            parts[-1][name] = [pos[start:start + take], values[start:start + take]]
            start, room = start + take, room - take
    return parts


_RACK_LIVE = ("draw_w", "source", "cap_w", "pct_of_cap", "pdus", "pdus_reporting", "gpus", "gpus_reporting")


def power_change(sent: Sent, data: dict) -> list[dict]:
    """The power page's message for this pass (one at most), recording what it sends."""
    racks = {r["id"]: r for r in data["racks"]}
    loop_ids = [loop["id"] for loop in data["cooling_loops"]]
    parts = {name: data[name] for name in POWER_PARTS} | {"pue": {k: data[k] for k in PUE_KEYS}}
    if sent.full or list(racks) != list(sent.racks) or loop_ids != sent.loop_ids:
        sent.full, sent.racks, sent.loop_ids, sent.parts = False, racks, loop_ids, parts
        return [{**data, "type": "power", "full": True}]
    changed = [r for rid, r in racks.items() if _rack(r) != _rack(sent.racks[rid])]
    msg: dict = {"type": "power", "full": False, "generated_at": data["generated_at"]}
    if changed:
        msg["racks"] = changed
    msg.update({name: value for name, value in parts.items() if value != sent.parts.get(name)})
    sent.racks, sent.parts = racks, parts
    return [msg] if len(msg) > 3 else []


def _rack(rack: dict) -> tuple:
    return tuple(rack[k] for k in _RACK_LIVE)
