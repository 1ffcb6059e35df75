"""The alerting set-up a new site starts from: rules, the inhibition of a down node's devices, a routing tree
and (for `./dev up`) webhook channels to the local receiver. Idempotent: objects are found by name and an
operator's later edits are never overwritten."""

from __future__ import annotations

import logging

from django.db import transaction

from alerts.models import Channel, ChannelKind, InhibitRule, Route, Rule, RuleKind
from alerts.remediation.defaults import install_default_playbooks

logger = logging.getLogger(__name__)

# name, kind, entity, metric, op, threshold, for_seconds, window_seconds, severity, extra
DEFAULT_RULES: list[dict] = [
    {"name": "XidNodeFault", "kind": RuleKind.XID, "severity": "critical",
     "xid_actions": ["drain_node", "reboot_node", "rma"],
     "summary": "XID {value:.0f} on {entity}: the node needs draining"},
    {"name": "XidGpuReset", "kind": RuleKind.XID, "severity": "warning", "xid_actions": ["reset_gpu"],
     "summary": "XID {value:.0f} on {entity}: the GPU needs a reset"},
    {"name": "GpuOverheating", "kind": RuleKind.THRESHOLD, "metric": "gpu_temp", "op": ">", "threshold": 87,
     "for_seconds": 60, "severity": "warning", "summary": "GPU at {value:.0f} °C (> {threshold:.0f} °C) on {entity}"},
    {"name": "HbmOverheating", "kind": RuleKind.THRESHOLD, "metric": "memory_temp", "op": ">", "threshold": 95,
     "for_seconds": 60, "severity": "warning", "summary": "HBM at {value:.0f} °C (> {threshold:.0f} °C) on {entity}"},
    {"name": "EccDoubleBit", "kind": RuleKind.RATE, "metric": "ecc_dbe_vol", "op": ">", "threshold": 0,
     "window_seconds": 600, "severity": "critical", "summary": "Double-bit ECC errors on {entity}"},
    {"name": "NvlinkCrcErrors", "kind": RuleKind.RATE, "metric": "nvlink_crc_flit_errors", "op": ">",
     "threshold": 100, "window_seconds": 300, "severity": "warning",
     "summary": "NVLink CRC errors at {value:.0f}/min on {entity}"},
    {"name": "PcieReplays", "kind": RuleKind.RATE, "metric": "pcie_replay", "op": ">", "threshold": 50,
     "window_seconds": 300, "severity": "warning", "summary": "PCIe replays at {value:.0f}/min on {entity}"},
    {"name": "IbSymbolErrors", "kind": RuleKind.RATE, "entity": "port", "metric": "symbol_errors", "op": ">",
     "threshold": 10, "window_seconds": 300, "severity": "warning",
     "summary": "Symbol errors at {value:.0f}/min on port {entity}"},
    {"name": "GpuAnomalous", "kind": RuleKind.ANOMALY, "op": ">=", "threshold": 0.9, "for_seconds": 120,
     "severity": "info", "summary": "{entity} behaves unlike its peers (score {value:.2f})"},
    {"name": "GpuFailureRisk", "kind": RuleKind.RISK, "op": ">=", "threshold": 0.5, "severity": "warning",
     "summary": "{entity} likely to fail within 24 h (risk {value:.0%})"},
    {"name": "JobStraggler", "kind": RuleKind.JOB, "entity": "job", "metric": "straggler", "severity": "warning",
     "summary": "A rank of job {entity} is straggling"},
    {"name": "JobDivergence", "kind": RuleKind.JOB, "entity": "job", "metric": "divergence", "severity": "critical",
     "summary": "Job {entity} is diverging (loss spike or NaN)"},
    # No threshold: the health model's rule decides (two of the source's intervals plus the push delay).
    {"name": "NodeDown", "kind": RuleKind.NODE_DOWN, "entity": "node", "severity": "critical",
     "summary": "Node {entity}: {detail}"},
    {"name": "GpuNoData", "kind": RuleKind.NODE_DOWN, "entity": "gpu", "severity": "warning",
     "summary": "{entity}: {detail}"},
]


def _rules() -> int:
    made = 0
    for spec in DEFAULT_RULES:
        spec = dict(spec)
        _, created = Rule.objects.get_or_create(name=spec.pop("name"), defaults=spec)
        made += created
    return made


def _inhibition() -> None:
    InhibitRule.objects.get_or_create(
        name="node-down-mutes-its-devices",
        defaults={"source_matchers": [{"name": "alertname", "op": "=", "value": "NodeDown"}],
                  "target_matchers": [{"name": "entity", "op": "=~", "value": "gpu|port"}],
                  "equal": ["node"]},
    )


def _channels(receiver_url: str, secret: str) -> tuple[Channel, Channel]:
    base = receiver_url.rstrip("/")
    page, _ = Channel.objects.get_or_create(
        name="local-receiver", defaults={"kind": ChannelKind.WEBHOOK, "config": {"url": f"{base}/webhook"},
                                         "secret": secret})
    escalation, _ = Channel.objects.get_or_create(
        name="local-escalation", defaults={"kind": ChannelKind.WEBHOOK, "config": {"url": f"{base}/escalation"},
                                           "secret": secret})
    # The RMA playbook opens its tickets on this channel (a ticket system's webhook in production).
    Channel.objects.get_or_create(
        name="rma-tickets", defaults={"kind": ChannelKind.WEBHOOK, "config": {"url": f"{base}/tickets"},
                                      "secret": secret})
    return page, escalation


# Critical faults page at once: a GPU that fell off the bus stalls a whole gang job every second.
CRITICAL_GROUP_WAIT_S = 0


def _routes(page: Channel | None, escalation: Channel | None) -> None:
    root, created = Route.objects.get_or_create(
        name="default", parent=None,
        defaults={"group_by": ["alertname", "node"], "group_wait_s": 30, "group_interval_s": 300,
                  "repeat_interval_s": 4 * 3600})
    critical, c_created = Route.objects.get_or_create(
        name="critical-page", parent=root,
        defaults={"position": 0, "matchers": [{"name": "severity", "op": "=", "value": "critical"}],
                  "group_by": ["alertname", "node"], "group_wait_s": CRITICAL_GROUP_WAIT_S, "group_interval_s": 60,
                  "repeat_interval_s": 3600, "escalate_after_s": 900})
    if page and created:
        root.channels.add(page)
    if page and c_created:
        critical.channels.add(page)
        if escalation:
            critical.escalation_channels.add(escalation)


@transaction.atomic
def install_defaults(receiver_url: str | None = None, secret: str = "") -> dict:
    """Create what is missing; with `receiver_url`, webhook channels to it are wired into the tree."""
    made = _rules()
    _inhibition()
    page, escalation = _channels(receiver_url, secret) if receiver_url else (None, None)
    _routes(page, escalation)
    install_default_playbooks()
    logger.info("alerting defaults: %d rule(s) created", made)
    return {"rules_created": made}
