"""Fleet reliability: survival analysis of GPU lifetimes by location and age.

The view parses `?batch=` and calls `reliability_context`, which loads the active survival version
from the model registry (written by `manage.py fit_survival`) and shapes its report for the
template: Kaplan-Meier figures as plain Plotly specs (drawn by reliability.js with the locally
served plotly.js), the hazard table with formatted numbers, and the cage effect in words.
"""

from __future__ import annotations

from django.shortcuts import render

from anomaly.selectors import fleet_survival
from dashboard.staticfiles import DASH_ASSET_VERSION
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


def reliability_context(scope: str) -> dict:
    """The active survival version shaped for the page; `report` is None when nothing is fitted."""
    base = {"scope": scope, "scopes": SCOPES, "plotly_version": DASH_ASSET_VERSION}
    loaded = fleet_survival()
    if loaded is None:
        return {**base, "report": None}
    version, report = loaded
    curves = report["curves"].get(scope)
    sections = km_sections(curves, report["logrank"].get(scope, {}), SCOPES[scope].lower()) if curves else []
    figures = {s["figure_id"]: s.pop("figure") for s in sections}
    figures["bw-forest"] = forest_figure(report["hazards"])
    return {**base, "version": version, "report": report, "cox": report["cox"], "figures": figures,
            "sections": sections, "hazards": hazard_rows(report["hazards"]), "cage_sentence": cage_effect(report),
            "scope_n": report.get(f"n_{scope}", 0), "scope_failures": report.get(f"failures_{scope}", 0)}


@operator_required
def reliability(request):
    """Kaplan-Meier curves and the hazard model of GPU lifetimes by location and age."""
    scope = request.GET.get("batch", DEFAULT_SCOPE)
    if scope not in SCOPES:
        scope = DEFAULT_SCOPE
    return render(request, "reliability.html", reliability_context(scope))
