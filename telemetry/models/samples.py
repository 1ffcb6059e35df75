"""Time-series tables: wide hypertables per entity kind, their last-value tables and rollups.

The columns come from `telemetry.fields`, so the registry, migrations, the writer and the
rollup SQL can never disagree. Hypertables are created by migration 0002; these models exist so
that Django owns the schema and so reads can use the ORM where convenient. Writes go through
binary COPY in `telemetry.ingest.writer`, never through the ORM.

Entity ids are plain integers, not foreign keys: a database FK check on every one of 16k rows
per interval would double the cost of COPY, and the writer only ever writes ids it resolved
from the inventory itself.
"""

from __future__ import annotations

from django.db import models

from telemetry.fields import COUNTER, GAUGE, KINDS, STATE, Field, SampleKind

RESOLUTIONS = ("1m", "1h")
LATEST_INTERVAL = "interval_s"


def _column(field: Field) -> models.Field:
    if field.sql_type == "bigint":
        return models.BigIntegerField(null=True)
    if field.sql_type == "double precision":
        return models.FloatField(null=True)
    # "real": 4 bytes is plenty for a gauge reading and halves the row width.
    return RealField(null=True)


class RealField(models.FloatField):
    """A 4-byte float column (PostgreSQL `real`)."""

    def db_type(self, connection) -> str:
        return "real"


def _rollup_columns(field: Field) -> dict[str, models.Field]:
    if field.kind == GAUGE:
        return {
            f"{field.name}_min": RealField(null=True),
            f"{field.name}_avg": models.FloatField(null=True),
            f"{field.name}_max": RealField(null=True),
            f"{field.name}_last": RealField(null=True),
        }
    if field.kind == COUNTER:
        # Delta over the bucket with resets handled, and the raw value at the bucket's end.
        return {f"{field.name}_delta": models.FloatField(null=True), f"{field.name}_last": _column(field)}
    assert field.kind == STATE
    return {
        f"{field.name}_or": models.BigIntegerField(null=True),
        f"{field.name}_last": models.BigIntegerField(null=True),
    }


def _model(name: str, table: str, attrs: dict, doc: str) -> type[models.Model]:
    attrs = dict(attrs)
    attrs["__module__"] = __name__
    attrs["__doc__"] = doc
    attrs["Meta"] = type("Meta", (), {"db_table": table, "managed": True})
    return type(name, (models.Model,), attrs)


def _sample_models(kind: SampleKind) -> dict[str, type[models.Model]]:
    title = kind.name.capitalize()
    ent = kind.entity_column
    raw = {ent: models.IntegerField(), "time": models.DateTimeField()}
    raw["pk"] = models.CompositePrimaryKey(ent, "time")
    raw.update({f.name: _column(f) for f in kind.fields})
    latest = {ent: models.IntegerField(primary_key=True), "time": models.DateTimeField()}
    latest.update({f.name: _column(f) for f in kind.fields})
    # Seconds between the entity's last two samples, kept by ingest: the source's own collection
    # interval, which `telemetry.health` turns into "no data" after two missed collections.
    latest[LATEST_INTERVAL] = RealField(null=True)
    out = {
        "raw": _model(f"{title}Sample", kind.table, raw, f"Raw {kind.name} samples (hypertable)."),
        "latest": _model(
            f"{title}Latest", kind.latest_table, latest,
            f"Newest {kind.name} sample per entity, kept current by ingest.",
        ),
    }
    for res in RESOLUTIONS:
        cols = {ent: models.IntegerField(), "bucket": models.DateTimeField(), "samples": models.IntegerField()}
        cols["pk"] = models.CompositePrimaryKey(ent, "bucket")
        for f in kind.fields:
            cols.update(_rollup_columns(f))
        out[res] = _model(
            f"{title}Sample{res}", kind.rollup_table(res), cols,
            f"{res} rollup of {kind.name} samples (hypertable).",
        )
    return out


# SAMPLE_MODELS["gpu"]["raw" | "latest" | "1m" | "1h"]
SAMPLE_MODELS: dict[str, dict[str, type[models.Model]]] = {k: _sample_models(v) for k, v in KINDS.items()}
globals().update({m.__name__: m for per_kind in SAMPLE_MODELS.values() for m in per_kind.values()})


class EntityKind(models.TextChoices):
    """Which inventory table a narrow sample's entity_id points into."""

    GPU = "gpu", "GPU"
    MIG = "mig", "MIG instance"
    NODE = "node", "Node"
    PORT = "port", "Port"
    POWER = "power", "Power device"


class NarrowSample(models.Model):
    """A sample of a field nobody has mapped to a wide column yet (hypertable)."""

    entity_kind = models.CharField(max_length=8, choices=EntityKind.choices)
    entity_id = models.IntegerField()
    field = models.CharField(max_length=128)
    time = models.DateTimeField()
    value = models.FloatField()
    pk = models.CompositePrimaryKey("entity_kind", "entity_id", "field", "time")

    class Meta:
        db_table = "telemetry_narrow_sample"


class _NarrowRollup(models.Model):
    entity_kind = models.CharField(max_length=8, choices=EntityKind.choices)
    entity_id = models.IntegerField()
    field = models.CharField(max_length=128)
    bucket = models.DateTimeField()
    samples = models.IntegerField()
    value_min = models.FloatField(null=True)
    value_avg = models.FloatField(null=True)
    value_max = models.FloatField(null=True)
    value_last = models.FloatField(null=True)
    pk = models.CompositePrimaryKey("entity_kind", "entity_id", "field", "bucket")

    class Meta:
        abstract = True


class NarrowSample1m(_NarrowRollup):
    """1-minute rollup of narrow samples (hypertable)."""

    class Meta:
        db_table = "telemetry_narrow_sample_1m"


class NarrowSample1h(_NarrowRollup):
    """1-hour rollup of narrow samples (hypertable)."""

    class Meta:
        db_table = "telemetry_narrow_sample_1h"
