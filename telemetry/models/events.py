"""GPU fault events: XID, DBE, row-remap failure, NVLink errors, fallen off the bus.

One row per open fault per GPU and kind (and XID code): repeats raise its count and last_seen
instead of adding rows, which is what dcgm-exporter's last-value XID gauge cannot show. A GPU
reset (volatile ECC counters or the energy counter starting again, or an operator's clear)
closes every open event of that GPU; the row stays as history.
"""

from __future__ import annotations

import uuid

from django.db import models


class GpuEventKind(models.TextChoices):
    """What kind of fault an event is."""

    XID = "xid", "XID error"
    ECC_DBE = "ecc_dbe", "ECC double-bit error"
    ROW_REMAP_FAILURE = "row_remap_failure", "Row remapping failure"
    NVLINK = "nvlink_errors", "NVLink errors"
    FALLEN_OFF_BUS = "fallen_off_bus", "Fallen off the bus"

    @classmethod
    def colour(cls, value: str) -> str:
        return {"xid": "#e0a100", "ecc_dbe": "#d64545", "row_remap_failure": "#d64545",
                "nvlink_errors": "#e07b00", "fallen_off_bus": "#8b0000"}[value]


class GpuEvent(models.Model):
    """A deduplicated GPU fault with its count and first/last sighting (hypertable on first_seen)."""

    event_id = models.UUIDField(default=uuid.uuid4, editable=False)
    first_seen = models.DateTimeField()
    pk = models.CompositePrimaryKey("event_id", "first_seen")
    gpu = models.ForeignKey("telemetry.Gpu", on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=24, choices=GpuEventKind.choices)
    code = models.IntegerField(default=0, help_text="XID code; 0 for other kinds")
    message = models.TextField(blank=True)
    last_seen = models.DateTimeField()
    count = models.IntegerField(default=1)
    source = models.CharField(max_length=32, help_text="kmsg, nvml, dcgm, counters, api")
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_reason = models.CharField(max_length=200, blank=True)

    class Meta:
        db_table = "telemetry_gpu_event"
        indexes = [
            # Dedup lookup and "open faults of this GPU": WHERE gpu_id = %s AND cleared_at IS NULL.
            models.Index(fields=["gpu", "kind", "code"], name="gpu_event_open_idx",
                         condition=models.Q(cleared_at__isnull=True)),
            # The fleet's newest faults: ORDER BY last_seen DESC LIMIT n.
            models.Index(fields=["-last_seen"], name="gpu_event_last_seen_idx"),
            # A GPU page's fault timeline, cleared events included, refreshed on every live tick:
            # WHERE gpu_id = %s ORDER BY last_seen DESC LIMIT n.
            models.Index(fields=["gpu", "-last_seen"], name="gpu_event_gpu_last_seen_idx"),
        ]

    @property
    def is_open(self) -> bool:
        return self.cleared_at is None

    def __str__(self) -> str:
        label = f"XID {self.code}" if self.kind == GpuEventKind.XID else self.get_kind_display()
        return f"{label} on GPU {self.gpu_id} ×{self.count}"
