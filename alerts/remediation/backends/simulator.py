"""The simulated cluster of `./dev up`: the inventory is the scheduler. A drain sets telemetry Node.state to
drained, a resume to active, a requeue puts the job row back to pending; verification reads them back."""

from __future__ import annotations

from django.utils import timezone

from alerts.models import ActionKind, RemediationAction
from alerts.remediation.backends.base import BackendError, Outcome, command, job_id
from telemetry.actions import do_mark_job_requeued, do_set_node_state
from telemetry.models import Job, JobState, Node, NodeState

NODE_STATE = {ActionKind.DRAIN: NodeState.DRAINED, ActionKind.RESUME: NodeState.ACTIVE}


def _job(target_key: str) -> tuple[str, str]:
    source = target_key.split(":", 1)[0] if ":" in target_key else Job.Source.SLURM
    return source, job_id(target_key)


class SimulatorBackend:
    """Drain, resume and requeue by writing the inventory and job rows the simulator reads."""

    name = "simulator"
    asynchronous = False

    def plan(self, action: RemediationAction) -> list[str]:
        if action.kind in NODE_STATE:
            return [f"set node {action.target_key} state {NODE_STATE[action.kind]}"]
        if action.kind == ActionKind.REQUEUE:
            return [f"requeue job {action.target_key}"]
        raise BackendError(f"the simulator backend cannot {action.kind}")

    def run(self, action: RemediationAction) -> Outcome:
        cmd = self.plan(action)[0]
        if action.kind in NODE_STATE:
            if not do_set_node_state(action.target_key, NODE_STATE[action.kind]):
                raise BackendError(f"node {action.target_key} is not in the inventory", [command(cmd, rc=1)])
        else:
            source, external = _job(action.target_key)
            if not do_mark_job_requeued(source, external, at=timezone.now(), reason="requeued by breakwater"):
                raise BackendError(f"job {action.target_key} is not known", [command(cmd, rc=1)])
        return Outcome([command(cmd)])

    def verify(self, action: RemediationAction) -> tuple[bool | None, dict]:
        if action.kind in NODE_STATE:
            state = Node.objects.filter(hostname=action.target_key).values_list("state", flat=True).first()
            return state == NODE_STATE[action.kind], {"check": "inventory node state", "state": state}
        source, external = _job(action.target_key)
        state = Job.objects.filter(source=source, external_id=external).values_list("state", flat=True).first()
        return state == JobState.PENDING, {"check": "job state", "state": state}
