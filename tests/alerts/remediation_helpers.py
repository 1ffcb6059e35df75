"""Builders and fixtures shared by the remediation tests: a small fleet with racks, NVLink domains and leaf
switches; alerts; Celery in eager mode; fake CLIs (scontrol, nvidia-smi) for the outbound edge."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from alerts.matching import fingerprint
from alerts.models import Alert, GuardRail
from telemetry.models import Gpu, Hall, Link, Node, NvlinkDomain, Port, Rack, Row, Site, Switch
from tests.conftest import FIXED_NOW


def build_fleet(count: int, *, prefix: str = "gpu-node", per_rack: int | None = None,
                per_domain: int | None = None, per_leaf: int | None = None, gpus: int = 2) -> list[Node]:
    """`count` placed nodes with `gpus` GPUs each; groups of `per_rack` share a rack, of `per_domain` a rack-scale
    NVLink domain, and of `per_leaf` a leaf switch (one HCA port each, cabled to it)."""
    site = Site.objects.create(name=f"site-{prefix}")
    row = Row.objects.create(hall=Hall.objects.create(site=site, name="h1"), name="r1")
    nodes = []
    for i in range(count):
        rack, _ = Rack.objects.get_or_create(row=row, name=f"{prefix}-rack-{i // (per_rack or count)}")
        domain = None
        if per_domain:
            domain, _ = NvlinkDomain.objects.get_or_create(name=f"{prefix}-nvl-{i // per_domain}",
                                                           defaults={"kind": "rack", "rack": rack})
        node = Node.objects.create(hostname=f"{prefix}-{i:02d}", rack=rack, nvlink_domain=domain)
        for g in range(gpus):
            Gpu.objects.create(uuid=f"GPU-{node.hostname}-{g}", node=node, index=g, serial=f"SN{i:02d}{g}")
        if per_leaf:
            leaf, _ = Switch.objects.get_or_create(name=f"{prefix}-leaf-{i // per_leaf}", defaults={"role": "leaf"})
            hca = Port.objects.create(node=node, name="mlx5_0/1", rail=0)
            Link.objects.create(a=hca, b=Port.objects.create(switch=leaf, name=f"p{i}"))
        nodes.append(node)
    return nodes


def make_alert(name: str, labels: dict, *, value: float | None = None, entity_kind: str = "gpu",
               entity_key: str = "", rule=None) -> Alert:
    """A firing alert with `alertname` and `severity` among its labels."""
    labels = {"alertname": name, "severity": "critical", **labels}
    return Alert.objects.create(fingerprint=fingerprint(labels), rule=rule, name=name, labels=labels, value=value,
                                severity=labels["severity"], entity_kind=entity_kind,
                                entity_key=entity_key or labels.get(entity_kind, ""), starts_at=FIXED_NOW,
                                last_seen=FIXED_NOW)


def rail(action: str, scope: str, *, max_count: int | None = None, max_fraction: float | None = None,
         window_s: int = 3600) -> GuardRail:
    return GuardRail.objects.create(action=action, scope=scope, max_count=max_count, max_fraction=max_fraction,
                                    window_s=window_s)


def write_script(path: Path, text: str) -> Path:
    """An executable script (a fake CLI on the outbound edge)."""
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


FAKE_SCONTROL = """#!/bin/sh
# A stand-in for `scontrol` behind SLURM_COMMAND_PREFIX: logs every call, keeps drained nodes as files.
dir="$(dirname "$0")"
echo "$*" >> "$dir/calls.log"
shift  # the command name, "scontrol"
if [ "$1" = "-o" ] && [ "$2" = "show" ] && [ "$3" = "node" ]; then
  if [ -f "$dir/drained-$4" ]; then echo "NodeName=$4 Arch=x86_64 State=IDLE+DRAIN Reason=x"; else
    echo "NodeName=$4 Arch=x86_64 State=IDLE"; fi
  exit 0
fi
if [ "$1" = "update" ]; then
  node="${2#NodeName=}"
  case "$3" in State=DRAIN) touch "$dir/drained-$node" ;; State=RESUME) rm -f "$dir/drained-$node" ;; esac
  exit 0
fi
echo "unsupported: $*" >&2
exit 1
"""


@pytest.fixture
def fake_scontrol(tmp_path, settings):
    """REMEDIATION_BACKEND=slurm through a fake scontrol; returns a function listing its calls."""
    script = write_script(tmp_path / "fake-slurm", FAKE_SCONTROL)
    settings.REMEDIATION_BACKEND, settings.SLURM_COMMAND_PREFIX = "slurm", str(script)

    def calls() -> list[str]:
        log = tmp_path / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    return calls


@pytest.fixture
def eager_celery():
    """Tasks sent on commit run at once in the sending thread (no broker, no leftover messages)."""
    from dashboard.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


def netns_prefix(cluster) -> str:
    """SLURM_COMMAND_PREFIX that reaches the test harness's Slurm inside its network namespace."""
    return f"env SLURM_CONF={cluster.slurm_conf} nsenter --net=/run/netns/{cluster.netns}"


__all__ = ["FIXED_NOW", "build_fleet", "eager_celery", "fake_scontrol", "make_alert", "netns_prefix", "rail",
           "write_script"]
