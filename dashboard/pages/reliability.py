"""Reliability: this fleet's own failure history beside the Titan reference records.

Two sources, kept apart on the page and in its labels:

- "This fleet": failures from the fleet's own GPU fault events (`telemetry.selectors.reliability`):
  totals, failures per 1,000 GPU-days and MTBF over the GPU-days it has observed, per week and per
  month, by cause (XIDs by code with their meaning), by node and rack, and the newest failures
  linking to their GPU pages.
- "Titan reference (OLCF, years)": survival analysis of GPU lifetimes by location and age, fitted
  on the ORNL Titan records. `reliability_context` loads the active survival version from the
  model registry (written by `manage.py fit_survival`) and shapes its report: Kaplan-Meier figures
  as plain Plotly specs, the hazard table with formatted numbers, and the cage effect in words.

Every figure is a plain Plotly spec in one JSON block, drawn by reliability.js with the locally
served plotly.js.
"""

from __future__ import annotations

from datetime import datetime

from django.shortcuts import render
from django.utils import timezone

from anomaly.selectors import fleet_survival
from telemetry.selectors.reliability import fleet_reliability
from tenancy.access import operator_required

SCOPES = {"old": "Old batch (installed 2013-15)", "new": "New batch (installed 2016-19)", "all": "All GPUs"}
DEFAULT_SCOPE = "old"
# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#E69F00", "#D55E00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
FIELD_LABELS = {"cage": "Cage", "slot": "Slot", "node": "Node", "row": "Cabinet row", "col": "Cabinet column",
                "batch": "Batch"}
FOREST_FIELDS = ("cage", "slot", "node", "row", "batch")  # columns (24 levels) stay in the table only
FOREST_TICKS = [0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50]


def format_p(p: float) -> str:
    if p <= 0:
        return "< 1e-300"  # below double precision
    return f"{p:.1e}" if p < 1e-3 else f"{p:.3f}"


def _band_and_line(curve: dict, name: str, colour: str) -> list[dict]:
    band = {"type": "scatter", "x": curve["t"] + curve["t"][::-1], "y": curve["upper"] + curve["lower"][::-1],
            "fill": "toself", "fillcolor": colour, "opacity": 0.18, "line": {"width": 0, "shape": "hv"},
            "hoverinfo": "skip", "showlegend": False, "legendgroup": name}
    line = {"type": "scatter", "mode": "lines", "x": curve["t"], "y": curve["s"], "name": name,
            "legendgroup": name, "line": {"color": colour, "width": 2, "shape": "hv"},
            "hovertemplate": f"{name}<br>day %{{x:.0f}}: %{{y:.3f}} still running<extra></extra>"}
    return [band, line]


def km_figure(groups: dict, field: str, title: str) -> dict:
    """Kaplan-Meier curves with their 95% bands, one per level of `field`."""
    data = []
    for k, (level, curve) in enumerate(sorted(groups.items(), key=lambda kv: int(kv[0]))):
        name = f"{field} {level} ({curve['failures']:,}/{curve['n']:,} failed)"
        data += _band_and_line(curve, name, PALETTE[k % len(PALETTE)])
    layout = {"title": {"text": title, "font": {"size": 14}}, "height": 380,
              "margin": {"l": 60, "r": 20, "t": 40, "b": 45},
              "xaxis": {"title": {"text": "days since installed"}, "rangemode": "tozero"},
              "yaxis": {"title": {"text": "share still running"}, "range": [0, 1.02], "tickformat": ".0%"},
              # Bottom left stays empty: every curve starts at 1 and falls to the right.
              "legend": {"x": 0.01, "y": 0.02, "xanchor": "left", "yanchor": "bottom", "font": {"size": 11},
                         "bgcolor": "rgba(255,255,255,0.85)"},
              "hovermode": "closest"}
    return {"data": data, "layout": layout}


def forest_figure(hazards: list[dict]) -> dict:
    """Hazard ratios with 95% CIs on a log axis; 1 (the reference's hazard) dashed."""
    rows = [h for h in hazards if h["covariate"] in FOREST_FIELDS][::-1]
    labels = [f"{FIELD_LABELS[h['covariate']].lower()} {h['level']} vs {h['reference']}" for h in rows]
    trace = {"type": "scatter", "mode": "markers", "x": [h["hr"] for h in rows], "y": labels,
             "marker": {"color": PALETTE[0], "size": 8},
             "error_x": {"type": "data", "symmetric": False, "array": [h["upper"] - h["hr"] for h in rows],
                         "arrayminus": [h["hr"] - h["lower"] for h in rows], "color": PALETTE[0]},
             "hovertemplate": "%{y}: HR %{x:.2f}<extra></extra>"}
    layout = {"height": 120 + 22 * len(rows), "margin": {"l": 150, "r": 20, "t": 20, "b": 50},
              "xaxis": {"type": "log", "title": {"text": "hazard ratio (log scale)"},
                        "tickvals": FOREST_TICKS, "ticktext": [f"{v:g}" for v in FOREST_TICKS]},
              "yaxis": {"automargin": True},
              "shapes": [{"type": "line", "x0": 1, "x1": 1, "yref": "paper", "y0": 0, "y1": 1,
                          "line": {"dash": "dash", "color": "#5f6b78"}}]}
    return {"data": [trace], "layout": layout}


def hazard_rows(hazards: list[dict]) -> list[dict]:
    return [{**h, "label": FIELD_LABELS[h["covariate"]], "hr_text": f"{h['hr']:.2f}",
             "ci_text": f"{h['lower']:.2f}–{h['upper']:.2f}", "p_text": format_p(h["p"]),
             "in_forest": h["covariate"] in FOREST_FIELDS} for h in hazards]


def cage_effect(report: dict) -> str:
    """The cage effect in one sentence, from the Cox model on all GPUs."""
    cages = [h for h in report["hazards"] if h["covariate"] == "cage"]
    if not cages:
        return ""
    top = max(cages, key=lambda h: h["hr"])
    others = "; ".join(f"cage {h['level']}: {h['hr']:.1f}×, {h['lower']:.1f}–{h['upper']:.1f}"
                       for h in cages if h is not top)
    return (f"GPUs in cage {top['level']} fail {top['hr']:.1f}× as fast as those in cage {top['reference']} "
            f"(hazard ratio, 95% CI {top['lower']:.1f}–{top['upper']:.1f}, p {format_p(top['p'])}"
            f"{'; ' + others if others else ''}), with slot, node, cabinet row and column and batch held fixed.")


def group_rows(curves: dict, field: str) -> list[dict]:
    rows = []
    for level, c in sorted(curves[field].items(), key=lambda kv: int(kv[0])):
        median = f"{c['median_days']:,.0f} days" if c["median_days"] is not None else "not reached"
        rows.append({"group": f"{field} {level}", "n": c["n"], "failures": c["failures"], "median": median,
                     "survival_3y": f"{100 * c['survival_3y']:.1f}%"})
    return rows


def km_sections(curves: dict, tests: dict, label: str) -> list[dict]:
    """One section per grouping: its figure's element id, log-rank test and per-group table."""
    sections = []
    for field in ("cage", "node", "slot"):
        test = tests.get(field)
        sections.append({
            "field": field, "figure_id": f"bw-km-{field}", "rows": group_rows(curves, field),
            "figure": km_figure(curves[field], field, f"By {field}, {label}"),
            "logrank": {**test, "p_text": format_p(test["p_value"])} if test else None})
    return sections


def now() -> datetime:
    """The page's clock (tests pin it)."""
    return timezone.now()


def rate_text(rate: float | None) -> str:
    return "—" if rate is None else f"{rate:,.2f}"


def fleet_figure(weeks: list[dict]) -> dict:
    """Failures per week (bars) and the week's rate per 1,000 GPU-days (line, right axis)."""
    x = [w["start"][:10] for w in weeks]
    bars = {"type": "bar", "x": x, "y": [w["failures"] for w in weeks], "name": "failures",
            "marker": {"color": PALETTE[2]}, "hovertemplate": "week of %{x}: %{y} failures<extra></extra>"}
    line = {"type": "scatter", "mode": "lines+markers", "x": x, "yaxis": "y2", "name": "per 1,000 GPU-days",
            "y": [w["per_1000_gpu_days"] for w in weeks], "line": {"color": PALETTE[0], "width": 2},
            "hovertemplate": "week of %{x}: %{y:.2f} per 1,000 GPU-days<extra></extra>"}
    layout = {"height": 300, "margin": {"l": 50, "r": 60, "t": 20, "b": 45}, "bargap": 0.3,
              "xaxis": {"title": {"text": "week (UTC, from Monday)"}, "type": "category"},
              "yaxis": {"title": {"text": "failures"}, "rangemode": "tozero"},
              "yaxis2": {"title": {"text": "per 1,000 GPU-days"}, "overlaying": "y", "side": "right",
                         "rangemode": "tozero", "showgrid": False},
              "legend": {"orientation": "h", "y": 1.12}}
    return {"data": [bars, line], "layout": layout}


def fleet_context(at: datetime) -> dict:
    """This fleet's failure history shaped for the page, and its weekly figure."""
    fleet = fleet_reliability(at)
    shaped = {**fleet, "rate_text": rate_text(fleet["per_1000_gpu_days"]),
              "mtbf_text": f"{fleet['mtbf_gpu_days']:,.1f} GPU-days" if fleet["mtbf_gpu_days"] else "no failure yet",
              "gpu_days_text": f"{fleet['gpu_days']:,.1f}",
              "months": [{**m, "label": m["start"][:7], "rate_text": rate_text(m["per_1000_gpu_days"])}
                         for m in fleet["by_month"][::-1]],
              "nodes": [{**p, "rate_text": rate_text(p["per_1000_gpu_days"])} for p in fleet["nodes"]],
              "racks": [{**p, "rate_text": rate_text(p["per_1000_gpu_days"])} for p in fleet["racks"]],
              "recent": [{**r, "at_text": f"{r['at'][:10]} {r['at'][11:16]}"} for r in fleet["recent"]]}
    return {"fleet": shaped, "fleet_figure": fleet_figure(fleet["by_week"]) if fleet["failures"] else None}


def titan_label(version) -> str:
    """ "Titan reference (OLCF, 2014–2019)": the years the fitted records span."""
    years = ""
    if version is not None and version.train_start and version.train_end:
        years = f", {version.train_start.year}–{version.train_end.year}"
    return f"Titan reference (OLCF{years})"


def reliability_context(scope: str, at: datetime | None = None) -> dict:
    """This fleet's failures, and the active survival version of the Titan reference shaped for the
    page (`report` is None when nothing is fitted)."""
    fleet = fleet_context(at or now())
    figures = {"bw-fleet-weekly": fleet["fleet_figure"]} if fleet["fleet_figure"] else {}
    base = {"scope": scope, "scopes": SCOPES, "fleet": fleet["fleet"],
            "figures": figures, "titan_label": titan_label(None)}
    loaded = fleet_survival()
    if loaded is None:
        return {**base, "report": None}
    version, report = loaded
    curves = report["curves"].get(scope)
    sections = km_sections(curves, report["logrank"].get(scope, {}), SCOPES[scope].lower()) if curves else []
    figures.update({s["figure_id"]: s.pop("figure") for s in sections})
    figures["bw-forest"] = forest_figure(report["hazards"])
    return {**base, "version": version, "report": report, "cox": report["cox"], "titan_label": titan_label(version),
            "sections": sections, "hazards": hazard_rows(report["hazards"]), "cage_sentence": cage_effect(report),
            "scope_n": report.get(f"n_{scope}", 0), "scope_failures": report.get(f"failures_{scope}", 0)}


@operator_required
def reliability(request):
    """This fleet's failure history, and Kaplan-Meier curves and the hazard model of the Titan reference."""
    scope = request.GET.get("batch", DEFAULT_SCOPE)
    if scope not in SCOPES:
        scope = DEFAULT_SCOPE
    return render(request, "reliability.html", reliability_context(scope))
