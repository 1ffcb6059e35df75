"""Reads of the anomaly app: the open and recent anomaly events, current scores and risks.

Other apps read anomalies only through these functions (the fleet summary, the heatmaps, the
drill-down pages, and the alert rules of the alerts app). Every list of events comes out of
`anomaly.display.rows`, so each of them names entities, metrics and units the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import connection
from django.db.models import BooleanField, Count, ExpressionWrapper, Max, Q, QuerySet
from django.db.models.expressions import RawSQL

from anomaly.display import rows
from anomaly.models import Anomaly, AnomalyKind, EntityScore, ModelKind
from anomaly.registry import load_active
from core.time import iso_utc
from telemetry import health
from telemetry.models import Gpu, Link
from telemetry.selectors.names import gpu_names

RISK_LIST_MIN = 0.05  # GPUs below this failure risk are not listed as "at risk"


def fleet_anomalies(limit: int = 8, *, failed_gpu_ids: tuple[int, ...] = ()) -> dict:
    """For the overview: open anomalies by kind, the strongest ones, and the GPUs most at risk (those
    the health model calls failed first: their risk is not a forecast, they have failed)."""
    open_qs = Anomaly.objects.filter(ended_at=None)
    by_kind = dict(open_qs.values_list("kind").annotate(n=Count("id")).order_by())
    top = rows(open_qs.exclude(kind=AnomalyKind.FAILURE_RISK).order_by("-score", "-started_at")[:limit])
    scored = EntityScore.objects.aggregate(a=Max("anomaly_at"), r=Max("risk_at"))
    return {"open": sum(by_kind.values()), "by_kind": by_kind, "top": top,
            "at_risk": gpus_at_risk(limit, failed_gpu_ids=failed_gpu_ids),
            "scored_at": iso_utc(scored["a"]) if scored["a"] else None,
            "risk_at": iso_utc(scored["r"]) if scored["r"] else None}


def gpus_at_risk(limit: int = 8, *, failed_gpu_ids: tuple[int, ...] = ()) -> list[dict]:
    """GPUs with the highest current failure risk (at least RISK_LIST_MIN), newest scores only; failed
    GPUs first at 100 %."""
    failed = list(Gpu.objects.filter(id__in=list(failed_gpu_ids)).order_by("id")
                  .values_list("uuid", flat=True)[:limit])
    found = [(u, 1.0, "failed") for u in failed] + list(
        EntityScore.objects.filter(entity_kind="gpu", failure_risk__gte=RISK_LIST_MIN).exclude(entity_id__in=failed)
        .order_by("-failure_risk")[:limit - len(failed)].values_list("entity_id", "failure_risk", "risk_version"))
    names = gpu_names(r[0] for r in found)
    return [{"uuid": u, "name": names.get(u, {}).get("name", u), "host": names.get(u, {}).get("host", ""),
             "risk": round(p, 4), "version": v, "url": f"/gpus/{u}/"} for u, p, v in found]


def anomaly_list(*, kind: str | None = None, q: str = "", state: str = "open", since: datetime | None = None,
                 limit: int = 200) -> list[dict]:
    """Anomaly events, newest first: open ones, or all (`state="all"`), filtered by kind and text."""
    qs = Anomaly.objects.all()
    if state == "open":
        qs = qs.filter(ended_at=None)
    if kind:
        qs = qs.filter(kind=kind)
    if q:
        qs = qs.filter(Q(entity_id__icontains=q) | Q(host__icontains=q) | Q(summary__icontains=q))
    if since:
        qs = qs.filter(Q(ended_at=None) | Q(ended_at__gte=since))
    return rows(qs.order_by("-started_at")[:limit])


def gpu_scores(column: str) -> dict[int, float]:
    """{gpu id: current value} of `anomaly_score` or `failure_risk` (NULLs left out), for heatmaps."""
    if column not in ("anomaly_score", "failure_risk"):
        raise ValueError(f"unknown score column {column!r}")
    with connection.cursor() as cur:
        cur.execute(f"""SELECT g.id, s.{column} FROM {EntityScore._meta.db_table} s
                        JOIN {Gpu._meta.db_table} g ON g.uuid = s.entity_id
                        WHERE s.entity_kind = 'gpu' AND s.{column} IS NOT NULL""")
        return {gid: float(v) for gid, v in cur.fetchall()}


_NOT_YET = {"anomaly_score": "No scores yet: anomaly scoring has not run on this cluster.",
            "failure_risk": "No risk scores yet: no failure model is active (manage.py train_models)."}
_SCALE = {"anomaly_score": 1.0, "failure_risk": 100.0}  # risk is shown in percent


def score_reader(column: str) -> Callable[[datetime], tuple[dict, str | None]]:
    """The rack heatmap's reader of a score (telemetry.selectors.racks.register_gpu_metric)."""

    def read(now: datetime) -> tuple[dict, str | None]:
        if not has_scores(column):
            return {}, _NOT_YET[column]
        out = {g: round(v * _SCALE[column], 3) for g, v in gpu_scores(column).items()}
        if column == "failure_risk":
            # A failed GPU's risk is not a forecast: it has failed.
            out.update({g: 100.0 for g, _, _, state, _ in health.gpu_states(now=now) if state == "failed"})
        return out, None

    return read


def open_anomaly_count(entity_kind: str) -> int:
    """Open anomaly events on entities of one kind (gpu, port, rack, job)."""
    return Anomaly.objects.filter(ended_at=None, entity_kind=entity_kind).count()


def has_scores(column: str = "anomaly_score") -> bool:
    """Whether the detectors (or, for failure_risk, the failure model) have run at all, so a
    heatmap can tell "all healthy" from "never scored"."""
    at = {"anomaly_score": "anomaly_at", "failure_risk": "risk_at"}[column]
    return EntityScore.objects.filter(**{f"{at}__isnull": False}).exists()


# --- The Anomalies page and the drill-down pages' "Anomalies and risk" section -------------------

def open_anomaly_counts() -> dict[str, int]:
    """{kind: open events} for every detector kind, zeros included (the Anomalies page's chart)."""
    counts = dict(Anomaly.objects.filter(ended_at=None).values_list("kind").annotate(n=Count("id")).order_by())
    return {kind: counts.get(kind, 0) for kind in AnomalyKind.values}


def scoring_times() -> dict:
    """When the detectors and the failure model last scored (ISO UTC, None if never), so an empty
    list reads as "healthy", not "never looked"."""
    times = EntityScore.objects.aggregate(anomaly=Max("anomaly_at"), risk=Max("risk_at"))
    return {name: iso_utc(at) if at else None for name, at in times.items()}


def current_members(kind: str) -> list[dict]:
    """The members of open events that the detectors' latest pass found, of detector `kind`, highest
    last score first.

    An event stays open for its cause's hold after a member recovers (`anomaly.grouping.HOLD`), and a
    finding can be a member of an event another detector is the face of (a straggling rank in its host's
    event), so "flagged now" is read from the members, not from the event's kind or its being open.
    An event written without members (before grouping) is its own one member; with no pass recorded
    (events written by other means), every open one counts."""
    latest = EntityScore.objects.filter(entity_kind="fleet", entity_id="*").values_list("anomaly_at", flat=True).first()
    events = Anomaly.objects.filter(Q(kind=kind) | Q(members__contains=[{"kind": kind}]), ended_at=None)
    found = [m for a in events for m in a.members or [_as_member(a)] if m["kind"] == kind
             and (latest is None or _when(m["last_seen"]) >= latest)]
    return sorted(found, key=lambda m: -m["last_score"])


def members_between(kind: str, start: datetime, end: datetime) -> list[dict]:
    """The members of detector `kind` that were flagged at some time in [start, end), from any event."""
    events = (Anomaly.objects.filter(Q(kind=kind) | Q(members__contains=[{"kind": kind}]), started_at__lt=end)
              .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=start)))
    return [m for a in events for m in a.members or [_as_member(a)] if m["kind"] == kind
            and _when(m["first_seen"]) < end and _when(m["last_seen"]) >= start]


def straggling_ranks(members: list[dict]) -> dict[str, list[str]]:
    """Job key -> its ranks among straggler members (entity "<job key>#<rank>"), in rank order."""
    out: dict[str, set[str]] = {}
    for m in members:
        key, _, rank = m["entity_id"].partition("#")
        if rank:
            out.setdefault(key, set()).add(rank)
    return {k: sorted(v, key=lambda r: (len(r), r)) for k, v in out.items()}


def _as_member(a: Anomaly) -> dict:
    """An event recorded without members (before grouping) as its one member."""
    return {"kind": a.kind, "entity_kind": a.entity_kind, "entity_id": a.entity_id, "host": a.host,
            "first_seen": a.started_at, "last_seen": a.last_seen, "last_score": a.last_score, "summary": a.summary}


def _when(t) -> datetime:
    return t if isinstance(t, datetime) else datetime.fromisoformat(t)


def _open_first(qs: QuerySet, limit: int) -> list[dict]:
    """Open events first (what needs a look now), then the closed ones, each newest first."""
    is_open = ExpressionWrapper(Q(ended_at=None), output_field=BooleanField())
    return rows(qs.annotate(open_now=is_open).order_by("-open_now", "-started_at")[:limit])


def entity_events(entity_kind: str, entity_id: str, limit: int = 20) -> list[dict]:
    """One entity's anomaly events, open ones first (a GPU's or a port's page): those it is the face of,
    and those of its cause it is a member of (a port of a congested leaf, a GPU of a host's event)."""
    return _open_first(Anomaly.objects.filter(Q(entity_kind=entity_kind, entity_id=entity_id)
                                              | _member_of(entity_kind, entity_id)), limit)


def _member_of(entity_kind: str, entity_id: str) -> Q:
    """Events with this entity among their members (`anomaly.grouping`; the members index serves it)."""
    return Q(members__contains=[{"entity_kind": entity_kind, "entity_id": entity_id}])


def host_anomalies(host: str, limit: int = 30) -> list[dict]:
    """A node's events, open first: those raised on the host, those of the GPUs in it now (a GPU's
    event carries the host it was in when raised, so both halves are asked for), and those of the
    switch ports its cables end on (a port's event carries the switch's name, not the node's)."""
    uuids = Gpu.objects.filter(node__hostname=host).values("uuid")
    ports = [str(p) for p in _cabled_switch_ports(host)]
    return _open_first(Anomaly.objects.filter(Q(host=host) | Q(entity_kind="gpu", entity_id__in=uuids)
                                              | Q(entity_kind="port", entity_id__in=ports)), limit)


def _cabled_switch_ports(host: str) -> list[int]:
    links = Link.objects.filter(Q(a__node__hostname=host) | Q(b__node__hostname=host))
    return [b if a_host == host else a for a, b, a_host in links.values_list("a_id", "b_id", "a__node__hostname")]


def job_anomalies(job_key: str, limit: int = 30) -> list[dict]:
    """A job's divergence events and its ranks' straggler events (entity "<job key>#<rank>"), open first,
    whether they are the face of an event or members of one (a rank in its host's event)."""
    ranks = RawSQL("SELECT id FROM anomaly_anomaly WHERE jsonb_path_exists(members, "
                   "'$[*] ? (@.entity_kind == \"rank\" && @.entity_id starts with $k)', jsonb_build_object('k', %s))",
                   [f"{job_key}#"])
    qs = Anomaly.objects.filter(Q(entity_kind="job", entity_id=job_key) | _member_of("job", job_key)
                                | Q(entity_kind="rank", entity_id__startswith=f"{job_key}#") | Q(pk__in=ranks))
    return _open_first(qs, limit)


def entity_risk(entity_kind: str, entity_id: str) -> dict | None:
    """An entity's current anomaly score and (GPUs only) failure risk with the model version that
    scored it; None when no pass has scored it."""
    s = EntityScore.objects.filter(entity_kind=entity_kind, entity_id=entity_id).first()
    if s is None:
        return None
    return {"anomaly_score": s.anomaly_score, "anomaly_at": iso_utc(s.anomaly_at) if s.anomaly_at else None,
            "failure_risk": s.failure_risk, "risk_at": iso_utc(s.risk_at) if s.risk_at else None,
            "risk_version": s.risk_version}


def host_gpu_risks(host: str) -> list[dict]:
    """Failure risk of each GPU in a node that the failure model scored, highest first."""
    gpus = dict(Gpu.objects.filter(node__hostname=host).values_list("uuid", "index"))
    scored = (EntityScore.objects.filter(entity_kind="gpu", entity_id__in=list(gpus), failure_risk__isnull=False)
              .order_by("-failure_risk").values_list("entity_id", "failure_risk", "risk_version", "risk_at"))
    return [{"uuid": u, "index": gpus[u], "risk": p, "version": v, "risk_at": iso_utc(at) if at else None,
             "url": f"/gpus/{u}/"} for u, p, v, at in scored]


def fleet_survival():
    """(version, report) of the active survival model (`manage.py fit_survival`), or None."""

    return load_active(ModelKind.SURVIVAL)
