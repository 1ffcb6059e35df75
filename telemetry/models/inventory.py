"""Inventory and topology: site → hall → row → rack → node → GPU → MIG instance, NVLink
domains, the fabric (switches, ports, links) and power devices."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from core.scoping import ScopedQuerySet


class HealthState(models.TextChoices):
    """The derived health of a GPU, port, node or rack (rules: `telemetry.health`); colours are the UI's."""

    OK = "ok", "OK"
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"
    STALE = "stale", "No data"
    DRAINING = "draining", "Draining"
    DRAINED = "drained", "Drained"

    @classmethod
    def colour(cls, value: str) -> str:
        return {
            "ok": "#2e9d5b", "degraded": "#e0a100", "failed": "#d64545",
            "draining": "#4f6d8f", "drained": "#6c7a89", "stale": "#8a939c",
        }[value]


class NodeState(models.TextChoices):
    """Scheduler-facing state an operator sets (drain) or the scheduler reports."""

    ACTIVE = "active", "Active"
    DRAINED = "drained", "Drained"
    DOWN = "down", "Down"


class Site(models.Model):
    """A data-centre site."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)

    def __str__(self) -> str:
        return self.name


class Hall(models.Model):
    """A data hall in a site."""

    site = models.ForeignKey(Site, on_delete=models.PROTECT, related_name="halls")
    name = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["site", "name"], name="hall_unique_in_site",
                violation_error_message="A hall with this name already exists in the site.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.site}/{self.name}"


class Row(models.Model):
    """A row of racks in a hall."""

    hall = models.ForeignKey(Hall, on_delete=models.PROTECT, related_name="rows")
    name = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["hall", "name"], name="row_unique_in_hall",
                violation_error_message="A row with this name already exists in the hall.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.hall}/{self.name}"


class Rack(models.Model):
    """A rack, with its position in the row and its power cap."""

    row = models.ForeignKey(Row, on_delete=models.PROTECT, related_name="racks")
    name = models.CharField(max_length=64, unique=True)
    position = models.PositiveSmallIntegerField(default=0, help_text="Order within the row")
    u_height = models.PositiveSmallIntegerField(default=48)
    power_cap_w = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["row_id", "position", "name"]

    def __str__(self) -> str:
        return self.name


class NvlinkDomain(models.Model):
    """GPUs that share an NVLink fabric: one node's NVSwitch set, or a whole NVL72 rack."""

    class Kind(models.TextChoices):
        NODE = "node", "NVSwitch tray (one node)"
        RACK = "rack", "Rack-scale (NVL72)"

    name = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.NODE)
    rack = models.ForeignKey(
        Rack, on_delete=models.PROTECT, null=True, blank=True, related_name="nvlink_domains"
    )

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    """A GPU server. A node seen in telemetry before it is placed has no rack (unplaced)."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    hostname = models.CharField(max_length=253, unique=True)
    rack = models.ForeignKey(
        Rack, on_delete=models.PROTECT, null=True, blank=True, related_name="nodes"
    )
    u_position = models.PositiveSmallIntegerField(null=True, blank=True)
    u_height = models.PositiveSmallIntegerField(default=4)
    nvlink_domain = models.ForeignKey(
        NvlinkDomain, on_delete=models.PROTECT, null=True, blank=True, related_name="nodes"
    )
    system_model = models.CharField(max_length=128, blank=True)
    state = models.CharField(max_length=8, choices=NodeState.choices, default=NodeState.ACTIVE)
    first_seen = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["hostname"]

    @property
    def placed(self) -> bool:
        return self.rack_id is not None

    def clean(self) -> None:
        if self.u_position is not None and self.rack_id is None:
            raise ValidationError({"u_position": "A U position needs a rack."})
        if self.rack_id and self.u_position is not None:
            top = self.u_position + self.u_height - 1
            if top > self.rack.u_height:
                raise ValidationError(
                    {"u_position": f"U{self.u_position}+{self.u_height} exceeds rack height {self.rack.u_height}."}
                )

    def __str__(self) -> str:
        return self.hostname


class Gpu(models.Model):
    """A physical GPU, identified by its UUID wherever it moves."""

    objects = ScopedQuerySet.as_manager()  # .visible_to(user): tenant scoping (core.scoping, rules in tenancy.scoping)

    uuid = models.CharField(max_length=64, unique=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpus")
    index = models.PositiveSmallIntegerField(null=True, blank=True)
    model = models.CharField(max_length=128, blank=True)
    serial = models.CharField(max_length=64, blank=True)
    pci_bus_id = models.CharField(max_length=32, blank=True)
    mig_mode = models.BooleanField(default=False)
    driver = models.CharField(max_length=32, blank=True)
    first_seen = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node_id", "index"]
        indexes = [
            # Search by serial (RMA lookups).
            models.Index(fields=["serial"], name="gpu_serial_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.node_id}:{self.index} {self.uuid}"


class MigInstance(models.Model):
    """A MIG GPU instance (and compute instance) carved out of a GPU."""

    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="mig_instances")
    gi_id = models.PositiveSmallIntegerField()
    ci_id = models.PositiveSmallIntegerField(default=0)
    profile = models.CharField(max_length=32, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "gi_id", "ci_id"], name="mig_unique_on_gpu",
                violation_error_message="This GPU already has a MIG instance with these ids.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.gpu.uuid}/gi{self.gi_id}/ci{self.ci_id} {self.profile}"


class Switch(models.Model):
    """A fabric switch: leaf, spine or core."""

    class Role(models.TextChoices):
        LEAF = "leaf", "Leaf"
        SPINE = "spine", "Spine"
        CORE = "core", "Core"

    name = models.CharField(max_length=128, unique=True)
    role = models.CharField(max_length=8, choices=Role.choices)
    rack = models.ForeignKey(
        Rack, on_delete=models.PROTECT, null=True, blank=True, related_name="switches"
    )
    u_position = models.PositiveSmallIntegerField(null=True, blank=True)
    model = models.CharField(max_length=128, blank=True)
    guid = models.CharField(max_length=32, blank=True)

    def __str__(self) -> str:
        return self.name


class Port(models.Model):
    """A fabric port: a switch port or a node's HCA port."""

    class LinkLayer(models.TextChoices):
        INFINIBAND = "infiniband", "InfiniBand"
        ETHERNET = "ethernet", "Ethernet (RoCE)"

    switch = models.ForeignKey(
        Switch, on_delete=models.PROTECT, null=True, blank=True, related_name="ports"
    )
    node = models.ForeignKey(
        Node, on_delete=models.PROTECT, null=True, blank=True, related_name="ports"
    )
    name = models.CharField(max_length=64, help_text="e.g. 'mlx5_0/1' or 'p12'")
    guid = models.CharField(max_length=32, blank=True)
    lid = models.PositiveIntegerField(null=True, blank=True)
    link_layer = models.CharField(
        max_length=10, choices=LinkLayer.choices, default=LinkLayer.INFINIBAND
    )
    speed_gbps = models.FloatField(null=True, blank=True)
    rail = models.PositiveSmallIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(switch__isnull=False) & Q(node__isnull=True))
                | (Q(switch__isnull=True) & Q(node__isnull=False)),
                name="port_on_switch_xor_node",
                violation_error_message="A port belongs to exactly one switch or one node.",
            ),
            models.UniqueConstraint(
                fields=["switch", "name"], name="port_unique_on_switch",
                violation_error_message="This switch already has a port with this name.",
            ),
            models.UniqueConstraint(
                fields=["node", "name"], name="port_unique_on_node",
                violation_error_message="This node already has a port with this name.",
            ),
        ]

    @property
    def owner_name(self) -> str:
        return self.switch.name if self.switch_id else self.node.hostname

    def __str__(self) -> str:
        return f"{self.owner_name}:{self.name}"


class Link(models.Model):
    """A cable between two ports."""

    a = models.OneToOneField(Port, on_delete=models.PROTECT, related_name="link_as_a")
    b = models.OneToOneField(Port, on_delete=models.PROTECT, related_name="link_as_b")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=~Q(a=models.F("b")), name="link_not_to_itself",
                violation_error_message="A link must join two different ports.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.a} ↔ {self.b}"


class PowerDevice(models.Model):
    """A PSU, PDU, rack power shelf or cooling loop, and what it feeds or cools."""

    class Kind(models.TextChoices):
        PSU = "psu", "PSU"
        PDU = "pdu", "PDU"
        POWER_SHELF = "power_shelf", "Rack power shelf"
        COOLING_LOOP = "cooling_loop", "Cooling loop"

    name = models.CharField(max_length=128, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    capacity_w = models.FloatField(null=True, blank=True)
    upstream = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="downstream",
        help_text="The device that feeds this one (PDU for a PSU, for example)",
    )
    racks = models.ManyToManyField(Rack, blank=True, related_name="power_devices")
    nodes = models.ManyToManyField(Node, blank=True, related_name="power_devices")

    def __str__(self) -> str:
        return self.name
