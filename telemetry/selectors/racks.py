"""The rack heatmap: where every GPU sits on the floor plan, and one metric's value per GPU.

`rack_grid()` lays the floor out as one grid of cells, so the browser can draw 16k GPUs as a
single heatmap image instead of thousands of shapes:

- a *panel* per hall row, its racks side by side in row order, one blank column between racks;
- a rack is as tall as its U height and the top of the panel is its highest U, as in a rack
  elevation drawing; a node of height h with n GPUs fills ceil(n / h) columns of its U range,
  GPU 0 top left, so an 8-GPU 4U node is a 2 × 4 block at its U position;
- panels flow left to right, `PANELS_PER_LINE` to a line, lines top to bottom;
- GPUs whose node has no rack or no U position go to a last "Unplaced" panel, packed in rows.

The layout carries the static facts of each cell (host, index, UUID, model, current job and
tenant) as parallel arrays with repeated strings interned, which keeps the first page load
small at 16k GPUs. `heatmap_values()` returns one metric for every GPU, keyed by GPU id, which
is also the shape of the live deltas.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from telemetry import health
from telemetry.fields import KINDS
from telemetry.models import Allocation, Gpu, GpuEvent, HealthState, Job, Node, Rack

PANELS_PER_LINE = 4
RACK_GAP = 1  # blank columns between racks of a row
PANEL_GAP = 3  # blank columns between hall rows on one line
LINE_GAP = 4  # blank U rows between lines of panels
UNPLACED_WIDTH = 16  # GPUs per row in the unplaced panel


@dataclass(frozen=True)
class Metric:
    """One choice of the heatmap's metric picker."""

    name: str
    label: str
    unit: str
    scale: str  # "continuous" or "categorical"
    lo: float | None = None  # fixed colour range so colours mean the same on every page
    hi: float | None = None
    slow: bool = False  # read from rollups or events: recomputed at most every SLOW_REFRESH


# clocks_event_reasons bits (nvml.h), most severe first: the category a GPU shows is the first
# bit it has set. Idle and application-clock settings are normal operation: "none".
THROTTLE_CATEGORIES: tuple[tuple[str, int], ...] = (
    ("HW thermal", 0x40), ("HW power brake", 0x80), ("HW slowdown", 0x08), ("SW thermal", 0x20),
    ("SW power cap", 0x04), ("Sync boost", 0x10),
)
THROTTLE_LABELS = ("None", *[label for label, _ in THROTTLE_CATEGORIES])

# The health metric's categories, in `telemetry.health.ORDER` (worst first) with their colours.
HEALTH_LABELS = tuple(HealthState(s).label for s in health.ORDER)
HEALTH_COLOURS = tuple(HealthState.colour(s) for s in health.ORDER)

METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("health", "Health", "", "categorical", 0, len(HEALTH_LABELS) - 1),
    Metric("gpu_util", "GPU utilization", "%", "continuous", 0, 100),
    Metric("gpu_temp", "GPU temperature", "°C", "continuous", 20, 95),
    Metric("memory_temp", "Memory temperature", "°C", "continuous", 20, 105),
    Metric("power_w", "Power draw", "W", "continuous", 0, 700),
    Metric("fb_used", "Memory used", "GiB", "continuous", 0, 80),
    Metric("ecc_rate", "ECC errors, last hour", "errors/h", "continuous", 0, 10, slow=True),
    Metric("throttle", "Throttle reason", "", "categorical", 0, len(THROTTLE_LABELS) - 1),
    Metric("xid_events", "XID events, last 24 h", "events", "continuous", 0, 10, slow=True),
)}  # and the metrics of the apps above telemetry (register_gpu_metric: anomaly's scores)
DEFAULT_METRIC = "health"
SLOW_REFRESH_S = 30.0

_GPU_1M = KINDS["gpu"].rollup_table("1m")


def metric_choices() -> list[dict]:
    """Options for the metric picker."""
    return [{"value": m.name, "label": f"{m.label} ({m.unit})" if m.unit else m.label} for m in METRICS.values()]


# A fingerprint of everything the layout depends on, cheap next to building it (≈5 ms against
# ≈200 ms at 16k GPUs): row counts and a sum of row hashes per table. Any insert, delete, move
# or rename changes it; a collision would need two edits whose hashes cancel exactly.
_LAYOUT_FINGERPRINT_SQL = """
SELECT concat_ws('/',
  (SELECT count(*) || ':' || coalesce(sum(hashtext(concat_ws(':', id, uuid, index, model, node_id))), 0)
     FROM telemetry_gpu),
  (SELECT count(*) || ':' || coalesce(sum(hashtext(concat_ws(':', id, hostname, rack_id, u_position, u_height))), 0)
     FROM telemetry_node),
  (SELECT count(*) || ':' || coalesce(sum(hashtext(concat_ws(':', id, name, row_id, position, u_height))), 0)
     FROM telemetry_rack),
  (SELECT count(*) || ':' || coalesce(sum(hashtext(concat_ws(':', id, name, hall_id))), 0) FROM telemetry_row),
  (SELECT count(*) || ':' || coalesce(sum(hashtext(concat_ws(':', id, name, site_id))), 0) FROM telemetry_hall),
  (SELECT count(*) || ':' || coalesce(sum(hashtext(concat_ws(':', id, name))), 0) FROM telemetry_site))
"""
_layout_cache: dict = {"key": None, "grid": None}
_layout_lock = threading.Lock()


def rack_grid() -> dict:
    """The floor plan as one grid, with every GPU's cell and static facts; see the module doc.

    The layout is memoised per process until the inventory changes; the current job of each
    GPU is read on every call.
    """
    with connection.cursor() as cur:
        cur.execute(_LAYOUT_FINGERPRINT_SQL)
        (key,) = cur.fetchone()
    with _layout_lock:
        if _layout_cache["key"] != key:
            _layout_cache.update(key=key, grid=_build_layout())
        layout = _layout_cache["grid"]
    column, jobs = _jobs_of(layout["gpus"]["id"])
    return {**layout, "gpus": {**layout["gpus"], "job": column}, "jobs": jobs}


def _jobs_of(gpu_ids: list[int]) -> tuple[list[int], list[dict]]:
    """Each GPU's current job as an index into the returned job list (-1 for none)."""
    current = _current_jobs()
    order: dict[int, int] = {}
    column = [-1 if (job := current.get(g)) is None else order.setdefault(job, len(order)) for g in gpu_ids]
    jobs = {j.id: j for j in Job.objects.filter(id__in=list(order))}
    return column, [{"key": f"{jobs[j].source}:{jobs[j].external_id}", "name": jobs[j].name,
                     "tenant": jobs[j].account} for j in order]


def _build_layout() -> dict:
    racks = list(Rack.objects.select_related("row__hall__site")
                 .order_by("row__hall__site__name", "row__hall__name", "row__name", "position", "name"))
    nodes = list(Node.objects.values("id", "hostname", "rack_id", "u_position", "u_height"))
    gpus = list(Gpu.objects.order_by("node_id", "index", "id").values("id", "node_id", "index", "uuid", "model"))
    by_node: dict[int, list[dict]] = {}
    for g in gpus:
        by_node.setdefault(g["node_id"], []).append(g)
    builder = _GridBuilder()
    placed = builder.place_racks(racks, nodes, by_node)
    builder.place_unplaced([n for n in nodes if n["id"] not in placed], by_node)
    return builder.result()


def _current_jobs() -> dict[int, int]:
    """GPU id → job id of its open allocation (the newest, should two overlap)."""
    rows = (Allocation.objects.filter(end__isnull=True, gpu__isnull=False)
            .order_by("gpu_id", "start").values_list("gpu_id", "job_id"))
    return dict(rows)


class _GridBuilder:
    """Accumulates panels, racks and GPU cells; positions in grid units (x column, y row)."""

    def __init__(self):
        self.panels: list[dict] = []
        self.racks: list[dict] = []
        self.cells = {k: [] for k in ("id", "x", "y", "index", "uuid", "host", "model", "rack")}
        self._interned: dict[str, dict[object, int]] = {"host": {}, "model": {}}
        self._rack = -1  # index into self.racks of the rack being filled; -1 for unplaced
        self._line = {"x": 0, "y": 0, "h": 0, "n": 0}
        self.width = 0

    def _intern(self, table: str, value) -> int:
        index = self._interned[table]
        return index.setdefault(value, len(index))

    def _open_panel(self, label: str, width: int, height: int) -> tuple[int, int]:
        line = self._line
        if line["n"] == PANELS_PER_LINE:
            line.update(x=0, y=line["y"] + line["h"] + LINE_GAP, h=0, n=0)
        x0, y0 = line["x"], line["y"]
        self.panels.append({"label": label, "x0": x0, "y0": y0, "w": width, "h": height})
        line.update(x=x0 + width + PANEL_GAP, h=max(line["h"], height), n=line["n"] + 1)
        self.width = max(self.width, x0 + width)
        return x0, y0

    def _add_gpu(self, gpu: dict, host: str, x: int, y: int) -> None:
        c = self.cells
        c["id"].append(gpu["id"])
        c["x"].append(x)
        c["y"].append(y)
        c["index"].append(gpu["index"])
        c["uuid"].append(gpu["uuid"])
        c["host"].append(self._intern("host", host))
        c["model"].append(self._intern("model", gpu["model"] or "unknown model"))
        c["rack"].append(self._rack)

    def place_racks(self, racks: list[Rack], nodes: list[dict], by_node: dict[int, list[dict]]) -> set[int]:
        in_rack: dict[int, list[dict]] = {}
        for n in nodes:
            if n["rack_id"] is not None and n["u_position"] is not None:
                in_rack.setdefault(n["rack_id"], []).append(n)
        rows: dict[int, list[Rack]] = {}
        for rack in racks:
            rows.setdefault(rack.row_id, []).append(rack)
        placed: set[int] = set()
        for row_racks in rows.values():
            row = row_racks[0].row
            widths = [max([1, *(math.ceil(len(by_node.get(n["id"], [])) / max(n["u_height"], 1))
                                for n in in_rack.get(r.id, []))]) for r in row_racks]
            height = max(r.u_height for r in row_racks)
            x0, y0 = self._open_panel(f"{row.hall.name} · row {row.name}",
                                      sum(widths) + RACK_GAP * (len(row_racks) - 1), height)
            for rack, width in zip(row_racks, widths, strict=True):
                self.racks.append({"name": rack.name, "x0": x0, "y0": y0 + height - rack.u_height,
                                   "w": width, "h": rack.u_height})
                self._rack = len(self.racks) - 1
                for node in in_rack.get(rack.id, []):
                    placed.add(node["id"])
                    self._place_node(node, by_node.get(node["id"], []), x0, y0 + height)
                x0 += width + RACK_GAP
        return placed

    def _place_node(self, node: dict, gpus: list[dict], x0: int, bottom: int) -> None:
        h = max(node["u_height"], 1)
        for i, gpu in enumerate(gpus):
            u = node["u_position"] + h - 1 - (i % h)  # GPU 0 at the node's top U
            self._add_gpu(gpu, node["hostname"], x0 + i // h, bottom - u)

    def place_unplaced(self, nodes: list[dict], by_node: dict[int, list[dict]]) -> None:
        gpus = [(g, n["hostname"]) for n in sorted(nodes, key=lambda n: n["hostname"])
                for g in by_node.get(n["id"], [])]
        if not gpus:
            return
        x0, y0 = self._open_panel("Unplaced", UNPLACED_WIDTH, math.ceil(len(gpus) / UNPLACED_WIDTH))
        self._rack = -1
        for i, (gpu, host) in enumerate(gpus):
            self._add_gpu(gpu, host, x0 + i % UNPLACED_WIDTH, y0 + i // UNPLACED_WIDTH)

    def result(self) -> dict:
        height = self._line["y"] + self._line["h"]
        return {
            "width": self.width, "height": height, "panels": self.panels, "racks": self.racks,
            "gpus": self.cells, "hosts": list(self._interned["host"]), "models": list(self._interned["model"]),
        }


def heatmap_values(metric: str, *, now: datetime | None = None, readings: list[tuple] | None = None) -> dict:
    """`metric`'s value for every GPU that has one: {"values": {gpu_id: value}, ...meta}.

    GPUs without a value (never sampled, or a field their model lacks) are absent, and the page
    leaves their cell blank. `readings`: `gpu_readings()` already read for this instant, which the
    health and value metrics then derive from instead of reading again. Raises KeyError for an
    unknown metric.
    """
    m = METRICS[metric]
    now = now or timezone.now()
    derive = _FROM_READINGS.get(metric)
    if derive is not None:
        values, note = derive(gpu_readings(now) if readings is None else readings), None
    else:
        values, note = _READERS[metric](now)
    return {"metric": m.name, "label": m.label, "unit": m.unit, "scale": m.scale, "range": [m.lo, m.hi],
            "categories": list(HEALTH_LABELS) if metric == "health" else list(THROTTLE_LABELS) if metric == "throttle"
            else None,
            "colours": list(HEALTH_COLOURS) if metric == "health" else None,
            "states": list(health.ORDER) if metric == "health" else None,
            "values": values, "note": note}


# The last-value fields the heatmap shows, in the order `gpu_readings()` returns them after the state.
_VALUE_FIELDS = ("gpu_util", "gpu_temp", "memory_temp", "power_w", "fb_used", "throttle_reasons")


def gpu_readings(now: datetime | None = None) -> list[tuple]:
    """(gpu_id, node_id, rack_id, state, fresh, *newest values of the heatmap's fields) for every GPU.

    One statement serves the health metric and every value metric at one instant: the live heatmaps of one
    tick show several metrics, and reading each apart was a whole fleet's health pass apiece (~50 ms at
    16k GPUs, five metrics a tick in the soak).
    """
    return health.gpu_states(now=now or timezone.now(), fields=_VALUE_FIELDS)


def uses_readings(metric: str) -> bool:
    """Whether `metric` derives from `gpu_readings()` (so pages may share one read across metrics)."""
    return metric in _FROM_READINGS


def _value(field: str, convert=None):
    """A value metric from the readings: GPUs whose newest values are current (fresh and not failed,
    `telemetry.health`); a failed or silent GPU shows "no data", never its last reading."""
    col = 5 + _VALUE_FIELDS.index(field)

    def derive(readings: list[tuple]) -> dict:
        out = {}
        for row in readings:
            value = row[col]
            if value is not None and row[4] and row[3] != "failed":
                out[row[0]] = convert(value) if convert else round(float(value), 2)
        return out
    return derive


def _health(readings: list[tuple]) -> dict:
    index = {s: i for i, s in enumerate(health.ORDER)}
    return {row[0]: index[row[3]] for row in readings}


def _throttle_category(mask: int) -> int:
    for code, (_, bit) in enumerate(THROTTLE_CATEGORIES, start=1):
        if mask & bit:
            return code
    return 0


def _ecc_last_hour(now: datetime):
    sql = f"""SELECT gpu_id, sum(coalesce(ecc_sbe_vol_delta, 0) + coalesce(ecc_dbe_vol_delta, 0))
              FROM {_GPU_1M} WHERE bucket > %s AND bucket <= %s GROUP BY gpu_id"""
    with connection.cursor() as cur:
        cur.execute(sql, [now - timedelta(hours=1), now])
        return {gpu_id: float(n) for gpu_id, n in cur.fetchall()}, None


def _xid_last_day(now: datetime):
    sql = f"""SELECT gpu_id, sum(count) FROM {GpuEvent._meta.db_table}
             WHERE kind = 'xid' AND last_seen > %s GROUP BY gpu_id"""
    with connection.cursor() as cur:
        cur.execute(sql, [now - timedelta(hours=24)])
        return {gpu_id: int(n) for gpu_id, n in cur.fetchall()}, None


# Metrics derived from `gpu_readings()`, and those read on their own (rollups, events, apps above telemetry).
_FROM_READINGS: dict[str, Callable[[list[tuple]], dict]] = {
    "health": _health,
    "gpu_util": _value("gpu_util"),
    "gpu_temp": _value("gpu_temp"),
    "memory_temp": _value("memory_temp"),
    "power_w": _value("power_w"),
    "fb_used": _value("fb_used", lambda mib: round(float(mib) / 1024, 2)),
    "throttle": _value("throttle_reasons", lambda mask: _throttle_category(int(mask))),
}
_READERS: dict[str, Callable[[datetime], tuple[dict, str | None]]] = {
    "ecc_rate": _ecc_last_hour,
    "xid_events": _xid_last_day,
}


def register_gpu_metric(metric: Metric, reader: Callable[[datetime], tuple[dict, str | None]]) -> None:
    """Add a per-GPU heatmap metric that an app above telemetry computes (anomaly's scores, from its ready()).

    `reader(now)` answers ({gpu id: value}, None), or ({}, why there is nothing yet).
    """
    METRICS[metric.name] = metric
    _READERS[metric.name] = reader


class SlowCache:
    """Per-process memo for the slow metrics, so many open pages share one rollup scan."""

    def __init__(self, ttl_s: float = SLOW_REFRESH_S):
        self.ttl_s = ttl_s
        self._memo: dict[str, tuple[float, dict]] = {}

    def get(self, metric: str, readings: list[tuple] | None = None) -> dict:
        if not METRICS[metric].slow:
            return heatmap_values(metric, readings=readings)
        hit = self._memo.get(metric)
        if hit and time.monotonic() - hit[0] < self.ttl_s:
            return hit[1]
        value = heatmap_values(metric)
        self._memo[metric] = (time.monotonic(), value)
        return value
