"""The playbooks and guard rails a new site starts from. Idempotent: found by name (playbooks) or by action and
scope (rails), and an operator's later edits are never overwritten.

Nothing destructive runs on its own: drains and resets wait for approval (with a shadow of automatic draining
beside them), tickets and requeues are suggestions.
"""

from __future__ import annotations

from django.db import transaction

from alerts.models import ActionKind, ActionMode, GuardRail, GuardScope, Playbook

DEFAULT_PLAYBOOKS: list[dict] = [
    {"name": "xid-drain-node", "xid_actions": ["drain_node", "reboot_node"], "action": ActionKind.DRAIN,
     "mode": ActionMode.APPROVAL,
     "description": "XIDs whose catalogue remedy is a node drain or reboot (e.g. 79, fallen off the bus): drain the "
                    "node so the scheduler stops placing work on it."},
    # Beside the approval above, what automatic draining WOULD have done (guard rails included), so a site
    # can watch the automation before trusting it: switch this one to auto and the approval one off.
    {"name": "xid-drain-node-shadow", "xid_actions": ["drain_node", "reboot_node"], "action": ActionKind.DRAIN,
     "mode": ActionMode.SHADOW,
     "description": "Shadow of automatic draining for the same XIDs: records the commands it would have run."},
    {"name": "xid-reset-gpu", "xid_actions": ["reset_gpu"], "action": ActionKind.GPU_RESET,
     "mode": ActionMode.APPROVAL,
     "description": "XIDs whose catalogue remedy is a GPU reset (e.g. 48 double-bit ECC, 95 uncontained ECC, "
                    "119/120 GSP errors): reset the GPU through the node agent."},
    {"name": "xid-rma", "xid_actions": ["rma"], "action": ActionKind.TICKET, "mode": ActionMode.SUGGEST,
     "params": {"channel": "rma-tickets"},
     "description": "XIDs the catalogue sends to support (e.g. 64, a failed row remap or page retirement): "
                    "open an RMA ticket on the 'rma-tickets' channel."},
    {"name": "straggler-requeue", "alert_names": ["JobStraggler"], "action": ActionKind.REQUEUE,
     "mode": ActionMode.SUGGEST,
     "description": "A job with a straggling rank: requeue it so it restarts on other nodes."},
]

# action, scope, max_count, max_fraction, window_s
DEFAULT_RAILS: list[tuple[str, str, int | None, float | None, int]] = [
    (ActionKind.DRAIN, GuardScope.CLUSTER, 4, 0.05, 3600),
    (ActionKind.DRAIN, GuardScope.NVLINK_DOMAIN, None, 0.25, 3600),
    (ActionKind.DRAIN, GuardScope.LEAF, None, 0.25, 3600),
    (ActionKind.DRAIN, GuardScope.TARGET, None, None, 3600),
    (ActionKind.REQUEUE, GuardScope.TARGET, None, None, 900),
]


@transaction.atomic
def install_default_playbooks() -> dict[str, int]:
    """Create the default playbooks and guard rails that are missing; returns how many of each were created."""
    playbooks = rails = 0
    for spec in DEFAULT_PLAYBOOKS:
        spec = dict(spec)
        _, created = Playbook.objects.get_or_create(name=spec.pop("name"), defaults=spec)
        playbooks += created
    for action, scope, max_count, max_fraction, window_s in DEFAULT_RAILS:
        _, created = GuardRail.objects.get_or_create(
            action=action, scope=scope,
            defaults={"max_count": max_count, "max_fraction": max_fraction, "window_s": window_s})
        rails += created
    return {"playbooks": playbooks, "guard_rails": rails}
