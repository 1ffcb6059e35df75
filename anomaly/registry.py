"""The model registry's writes and reads: register, promote if no worse, roll back, load.

A version is stored with its estimator as a joblib artefact (and the artefact's SHA-256, checked
on load, so a corrupted row is refused rather than scored with). Promotion compares the
candidate's primary holdout metric with the active version's: a candidate that is worse is
rejected and the active one stays; `force` overrides that for an operator who knows better.
Rollback makes the newest retired version active again and retires the current one.
"""

from __future__ import annotations

import hashlib
import io
import logging
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

import joblib
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from anomaly.models import ModelKind, ModelStatus, ModelVersion

logger = logging.getLogger(__name__)


class RegistryError(Exception):
    """A registry operation that cannot be done (nothing to roll back to, a corrupted artefact)."""


@dataclass(frozen=True)
class Promotion:
    """The outcome of `do_promote_version`."""

    version: ModelVersion
    promoted: bool
    reason: str


def dumps(estimator) -> bytes:
    buf = io.BytesIO()
    joblib.dump(estimator, buf, compress=3)
    return buf.getvalue()


def do_register_version(kind: str, estimator, *, params: dict, features: list[str], metrics: dict,
                        train_start: datetime | None = None, train_end: datetime | None = None,
                        now: datetime | None = None) -> ModelVersion:
    """Store a trained estimator as the next candidate version of `kind`."""
    if kind not in ModelKind.values:
        raise RegistryError(f"unknown model kind {kind!r}: expected one of {', '.join(ModelKind.values)}")
    if metrics.get("primary") and metrics["primary"] not in metrics:
        raise RegistryError(f"metrics name {metrics['primary']!r} as primary but do not hold it")
    blob = dumps(estimator)
    with transaction.atomic():
        # Lock the kind's rows so two trainers never take the same version number.
        list(ModelVersion.objects.select_for_update().filter(kind=kind).values_list("pk", flat=True))
        last = ModelVersion.objects.filter(kind=kind).aggregate(v=Max("version"))["v"] or 0
        return ModelVersion.objects.create(
            kind=kind, version=last + 1, created_at=now or timezone.now(), params=params, features=list(features),
            metrics=metrics, train_start=train_start, train_end=train_end, artefact=blob,
            artefact_sha256=hashlib.sha256(blob).hexdigest())


def do_record_holdout(version: ModelVersion, figures: dict | None, *, why: str = "") -> None:
    """Replace `version`'s holdout figures with ones measured on a newer holdout (the one a
    candidate is judged on), keeping the old ones under "previous", so promotion compares both
    versions on the same rows. `figures=None` means the version cannot be scored there (an
    artefact from older code): its primary metric becomes unknown, and any candidate may replace it."""
    old = {k: v for k, v in version.metrics.items() if k != "previous"}
    if figures is None:
        primary = version.metrics.get("primary")
        figures = {primary: None, "not_comparable": why} if primary else {"not_comparable": why}
    version.metrics = {**version.metrics, **figures, "previous": old}
    ModelVersion.objects.filter(pk=version.pk).update(metrics=version.metrics)


def _higher_is_better(metrics: dict) -> bool:
    return metrics.get("higher_is_better", True)


def do_promote_version(version: ModelVersion, *, force: bool = False, now: datetime | None = None) -> Promotion:
    """Make `version` active if its primary holdout metric is no worse than the active one's."""
    now = now or timezone.now()
    with transaction.atomic():
        active = ModelVersion.objects.select_for_update().filter(kind=version.kind, status=ModelStatus.ACTIVE).first()
        if active and active.pk == version.pk:
            return Promotion(version, False, f"v{version.version} is already active")
        reason = _compare(version, active)
        if reason and not force:
            ModelVersion.objects.filter(pk=version.pk).update(status=ModelStatus.REJECTED, note=reason)
            version.refresh_from_db()
            logger.info("model %s v%s rejected: %s", version.kind, version.version, reason)
            return Promotion(version, False, reason)
        if active:
            ModelVersion.objects.filter(pk=active.pk).update(status=ModelStatus.RETIRED)
        note = f"forced over: {reason}" if reason else (
            f"no worse than v{active.version}" if active else "first version of its kind")
        ModelVersion.objects.filter(pk=version.pk).update(status=ModelStatus.ACTIVE, promoted_at=now, note=note)
    version.refresh_from_db()
    load_active.cache_clear()
    logger.info("model %s v%s promoted: %s", version.kind, version.version, note)
    return Promotion(version, True, note)


def _compare(candidate: ModelVersion, active: ModelVersion | None) -> str:
    """Why `candidate` may not replace `active` ('' when it may)."""
    if active is None:
        return ""
    new, old = candidate.primary_metric, active.primary_metric
    name = candidate.metrics.get("primary", "?")
    if new is None:
        return f"v{candidate.version} has no holdout {name}"
    if old is None:
        return ""
    worse = new < old if _higher_is_better(candidate.metrics) else new > old
    if worse:
        return f"holdout {name} {new:.4f} is worse than active v{active.version}'s {old:.4f}"
    return ""


def do_rollback(kind: str, *, now: datetime | None = None) -> ModelVersion:
    """Retire the active version of `kind` and reactivate the newest retired one before it."""
    with transaction.atomic():
        active = ModelVersion.objects.select_for_update().filter(kind=kind, status=ModelStatus.ACTIVE).first()
        if active is None:
            raise RegistryError(f"no active {kind} model to roll back")
        previous = (ModelVersion.objects.filter(kind=kind, status=ModelStatus.RETIRED, version__lt=active.version)
                    .order_by("-version").first())
        if previous is None:
            raise RegistryError(f"{kind} v{active.version} is the first version ever promoted: nothing to roll back to")
        ModelVersion.objects.filter(pk=active.pk).update(
            status=ModelStatus.RETIRED, note=f"rolled back to v{previous.version}")
        ModelVersion.objects.filter(pk=previous.pk).update(
            status=ModelStatus.ACTIVE, promoted_at=now or timezone.now(),
            note=f"restored by rollback of v{active.version}")
    previous.refresh_from_db()
    load_active.cache_clear()
    return previous


def load_estimator(version: ModelVersion):
    blob = bytes(version.artefact)
    if hashlib.sha256(blob).hexdigest() != version.artefact_sha256:
        raise RegistryError(f"{version}: the stored artefact does not match its SHA-256; retrain or roll back")
    return joblib.load(io.BytesIO(blob))


@lru_cache(maxsize=8)
def _load(pk: int, sha: str):
    return load_estimator(ModelVersion.objects.get(pk=pk))


def load_active(kind: str) -> tuple[ModelVersion, object] | None:
    """The active version of `kind` and its estimator (memoised per process by artefact hash)."""
    v = ModelVersion.objects.filter(kind=kind, status=ModelStatus.ACTIVE).defer("artefact").first()
    if v is None:
        return None
    return v, _load(v.pk, v.artefact_sha256)


load_active.cache_clear = _load.cache_clear  # promotion and rollback drop the memo in this process
