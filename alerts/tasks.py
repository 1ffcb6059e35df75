"""Celery tasks of the alerts app. Each takes ids, is safe to run twice and delegates to one module function."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from alerts.delivery import deliver_notification
from alerts.delivery import sweep_outbox as sweep
from alerts.evaluation import EvaluationBusy, run_evaluation
from alerts.remediation.executor import execute
from alerts.remediation.playbooks import run_playbooks_for_alerts
from alerts.routing import do_flush_due_groups

BUSY_RETRY_S = 1.0  # an ingest-triggered evaluation that finds one running tries again this much later


@shared_task(name="alerts.tasks.evaluate", acks_late=True)
def evaluate(backstop: bool = False) -> dict:
    """Evaluate every enabled rule now (triggered by ingest after commit, and by beat as a backstop).

    Evaluations never wait for each other in a worker slot. When one is running, beat's backstop is
    dropped (the running pass covers it), and an ingest-triggered run is queued again for a moment
    later: the running pass may have read before the commit that queued it. The trigger flag stays
    set meanwhile, so further commits add nothing to the queue (alerts.actions.schedule_evaluation).
    """
    try:
        return run_evaluation(timezone.now(), wait=False)
    except EvaluationBusy:
        if backstop:
            return {"skipped": "an evaluation is running"}
        evaluate.apply_async(countdown=BUSY_RETRY_S)
        return {"deferred_s": BUSY_RETRY_S}


@shared_task(name="alerts.tasks.flush_groups", acks_late=True)
def flush_groups() -> int:
    """Send what alert groups have due (group_wait, group_interval, repeat_interval, escalation)."""
    return do_flush_due_groups(timezone.now())


@shared_task(name="alerts.tasks.deliver", acks_late=True)
def deliver(notification_id: int) -> str:
    """Deliver one outbox row; retries are scheduled by the delivery module itself (bounded, with backoff)."""
    return deliver_notification(notification_id)


@shared_task(name="alerts.tasks.sweep_outbox", acks_late=True)
def sweep_outbox() -> int:
    """Re-enqueue outbox rows whose retry is due or whose worker died mid-delivery."""
    return sweep(timezone.now())


@shared_task(name="alerts.tasks.run_playbooks", acks_late=True)
def run_playbooks(alert_ids: list[int]) -> int:
    """Propose (or run, per mode) the playbook actions for alerts that just fired."""
    return run_playbooks_for_alerts(alert_ids)


@shared_task(name="alerts.tasks.execute_action", acks_late=True)
def execute_action(action_id: int) -> str:
    """Run one approved or automatic remediation action, then verify it."""
    return execute(action_id)
