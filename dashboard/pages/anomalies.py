"""Anomalies and failure risk: the events the detectors and the failure model raised.

The Anomalies page lists them newest first, filtered by `?state=` (open now, or every event of the
last 24 h / 7 d), `?kind=` (the detector) and `?q=` (entity, host or summary text), beside a chart
of the open events per detector. `anomalies.js` keeps both live over `/ws/anomalies/`: the consumer
(`dashboard.consumers.anomalies`) builds the same payload with `page_data` and pushes it whenever it
changed. The GPU, node, port and job pages show an "Anomalies and risk" section built by the
`*_section` functions here and drawn by `templates/partials/anomalies.html`.

The words come from `anomaly.display` (entity "GPU 7 of node-0227", each contribution "memory
temperature 82.1 °C vs median of peers in node 70.3 °C (+6.2σ)"), the formatter every other view
of anomalies uses too; this module adds only the page's times and colours, once, so the
server-rendered table and the live re-render in the browser show the same thing. A chip is
coloured by |deviation| and also prints the σ, so colour is never the only cue.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from django.shortcuts import render
from django.utils import timezone

from anomaly import selectors
from anomaly.models import AnomalyKind
from dashboard.pages.formatting import when
from tenancy.access import operator_required

# ?state=: open events only, or every event open at some point in the window.
WINDOWS = {"open": None, "24h": timedelta(hours=24), "7d": timedelta(days=7)}
STATE_LABELS = {"open": "Open now", "24h": "All, last 24 h", "7d": "All, last 7 days"}
MAX_Q = 100
LIST_LIMIT = 200
# |deviation| bands of a contribution chip, Okabe-Ito colours; the chip also prints the σ.
DEVIATION_BANDS = ((6.0, "high", "#d55e00"), (3.0, "medium", "#e69f00"), (0.0, "low", "#0072b2"))


class FilterError(ValueError):
    """A filter parameter with a value the page does not know; the message names both."""

    def __init__(self, name: str, value, expected: str):
        super().__init__(f"Bad filter {name}={value!r}: expected {expected}.")


def now() -> datetime:
    """The page's clock (tests pin it)."""
    return timezone.now()


# --- Filters ---------------------------------------------------------------------------------------

def parse_filters(params: Mapping) -> dict:
    """`{"state", "kind", "q"}` from GET parameters or a subscription message; FilterError if bad."""
    state = _text(params, "state") or "open"
    if state not in WINDOWS:
        raise FilterError("state", state, f"one of {', '.join(WINDOWS)}")
    kind = _text(params, "kind")
    if kind and kind not in AnomalyKind.values:
        raise FilterError("kind", kind, f"one of {', '.join(AnomalyKind.values)}")
    q = _text(params, "q").strip()
    if len(q) > MAX_Q:
        raise FilterError("q", f"{q[:20]}…", f"at most {MAX_Q} characters")
    return {"state": state, "kind": kind, "q": q}


def _text(params: Mapping, name: str) -> str:
    value = params.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FilterError(name, value, "text")
    return value


# --- Display shaping, shared by the page, the live push and the drill-down sections ----------------

def chip(reason: dict) -> dict:
    """One contribution's words (`anomaly.display.reason`) with its |deviation| band's colour; a
    non-finite deviation (loss = NaN) is as bad as it gets."""
    dev = reason.get("deviation")
    if dev is None:
        return {"text": reason["text"], "level": "high", "colour": DEVIATION_BANDS[0][2]}
    level, colour = next((name, col) for floor, name, col in DEVIATION_BANDS if abs(dev) >= floor)
    return {"text": reason["text"], "level": level, "colour": colour}


def short_time(iso: str) -> str:
    """"11-30 12:04" for a column headed "(UTC)"; the cell's title carries the full time."""
    return f"{iso[5:10]} {iso[11:16]}"


def display_row(row: dict) -> dict:
    """A selector row with its display texts and explanation chips."""
    score = f"{100 * row['score']:.1f}%" if row["kind"] == AnomalyKind.FAILURE_RISK else f"{row['score']:.2f}"
    ended = row["ended_at"]
    until_title = when(ended) if ended else f"open, last seen {when(row['last_seen'])}"
    return {**row, "score_text": score,
            "since_text": short_time(row["started_at"]), "since_title": when(row["started_at"]),
            "until_text": short_time(ended) if ended else None, "until_title": until_title,
            "last_seen_text": short_time(row["last_seen"]),
            "host_url": f"/nodes/{row['host']}/" if row["host"] and row["entity_kind"] != "rack" else None,
            "chips": [chip(r) for r in row["reasons"]]}


def counts_figure(counts: dict[str, int]) -> dict:
    """Open events per detector as a horizontal bar chart (a plain Plotly spec)."""
    kinds = list(counts)[::-1]  # Plotly draws the first category at the bottom
    trace = {"type": "bar", "orientation": "h", "x": [counts[k] for k in kinds],
             "y": [AnomalyKind(k).label for k in kinds], "marker": {"color": [AnomalyKind.colour(k) for k in kinds]},
             "text": [str(counts[k]) for k in kinds], "textposition": "outside", "cliponaxis": False,
             "hovertemplate": "%{y}: %{x} open<extra></extra>"}
    layout = {"height": 260, "margin": {"l": 10, "r": 30, "t": 10, "b": 30}, "bargap": 0.25,
              "xaxis": {"rangemode": "tozero", "dtick": 1 if max(counts.values(), default=0) < 6 else None,
                        "title": {"text": "open events"}},
              "yaxis": {"automargin": True}, "plot_bgcolor": "#ffffff", "paper_bgcolor": "#ffffff"}
    return {"data": [trace], "layout": layout}


def page_data(filters: dict) -> dict:
    """What the page shows for `filters`: its rows, whether the list was cut, and the chart."""
    window = WINDOWS[filters["state"]]
    rows = selectors.anomaly_list(kind=filters["kind"] or None, q=filters["q"],
                                  state="open" if window is None else "all",
                                  since=None if window is None else now() - window, limit=LIST_LIMIT)
    counts = selectors.open_anomaly_counts()
    return {"rows": [display_row(r) for r in rows], "limited": len(rows) >= LIST_LIMIT,
            "open_total": sum(counts.values()), "figure": counts_figure(counts),
            "scored_text": scored_text(selectors.scoring_times())}


def scored_text(times: dict) -> str:
    """When the detectors and the failure model last ran, in words."""
    if not times["anomaly"] and not times["risk"]:
        return "Anomaly scoring has not run yet."
    detectors = f"Detectors last ran {when(times['anomaly'])}" if times["anomaly"] else \
        "The detectors have not run yet"
    risk = f"failure risk last scored {when(times['risk'])}" if times["risk"] else \
        "no failure model has scored yet"
    return f"{detectors}; {risk}."


# --- The drill-down pages' "Anomalies and risk" section --------------------------------------------

def _risk_text(risk: float, version: int | None, at: str | None) -> str:
    model = f"failure model v{version}" if version is not None else "failure model"
    return f"{100 * risk:.1f}% ({model}, scored {when(at)})"


def _anomaly_score_line(score: dict | None) -> dict:
    if score is None or score["anomaly_score"] is None:
        return {"label": "Anomaly score", "text": "none now"}
    scored = when(score["anomaly_at"])
    return {"label": "Anomaly score", "text": f"{score['anomaly_score']:.2f} (scored {scored})"}


def gpu_section(uuid: str) -> dict:
    """A GPU's failure risk, anomaly score and events."""
    score = selectors.entity_risk("gpu", uuid)
    risk = (_risk_text(score["failure_risk"], score["risk_version"], score["risk_at"])
            if score and score["failure_risk"] is not None else "not scored")
    return {"risk": [{"label": "Failure risk", "text": risk}, _anomaly_score_line(score)],
            "rows": [display_row(r) for r in selectors.entity_events("gpu", uuid)],
            "empty": "No anomaly recorded for this GPU.", "show_entity": False}


def node_section(hostname: str) -> dict:
    """The failure risk of a node's GPUs, and the events of the node and its GPUs."""
    risks = [{"label": f"GPU {r['index'] if r['index'] is not None else '?'}", "url": r["url"],
              "text": _risk_text(r["risk"], r["version"], r["risk_at"])} for r in selectors.host_gpu_risks(hostname)]
    return {"risk": risks or [{"label": "Failure risk", "text": "not scored"}],
            "risk_title": "Failure risk of its GPUs" if risks else "",
            "rows": [display_row(r) for r in selectors.host_anomalies(hostname)],
            "empty": "No anomaly recorded for this node or its GPUs.", "show_entity": True}


def port_section(port_id: int) -> dict:
    """A fabric port's anomaly score and events (the failure model scores GPUs only)."""
    return {"risk": [_anomaly_score_line(selectors.entity_risk("port", str(port_id)))],
            "rows": [display_row(r) for r in selectors.entity_events("port", str(port_id))],
            "empty": "No anomaly recorded for this port.", "show_entity": False}


def job_section(key: str) -> dict:
    """A job's divergence events and its ranks' straggler events, and which ranks straggle now."""
    rows = [display_row(r) for r in selectors.job_anomalies(key)]
    # What the latest pass flagged, also where a rank is a member of its host's event.
    ranks = selectors.straggling_ranks(selectors.current_members(AnomalyKind.STRAGGLER)).get(key, [])
    return {"risk": [_anomaly_score_line(selectors.entity_risk("job", key)),
                     {"label": "Straggling now",
                      "text": f"rank{'s' * (len(ranks) > 1)} {', '.join(ranks)}" if ranks else "no rank"}],
            "rows": rows, "empty": "No anomaly recorded for this job or its ranks.", "show_entity": True}


# --- The page --------------------------------------------------------------------------------------

@operator_required
def anomaly_list(request):
    """Open and recent anomaly and risk events, filterable by state, detector and text."""
    base = {"states": STATE_LABELS, "kinds": AnomalyKind.choices, "limit": LIST_LIMIT}
    try:
        filters = parse_filters(request.GET)
    except FilterError as exc:
        filters = {"state": "open", "kind": "", "q": ""}
        return render(request, "anomalies.html", {**base, "filters": filters, "error": str(exc)}, status=400)
    data = page_data(filters)
    empty = "No anomaly is open now." if filters == {"state": "open", "kind": "", "q": ""} else \
        "No anomaly matches these filters."
    table = {"rows": data["rows"], "empty": empty, "show_entity": True, "show_host": True}
    return render(request, "anomalies.html", {**base, "filters": filters, **data, "section": table})
