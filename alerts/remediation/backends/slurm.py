"""Slurm: `scontrol` through `telemetry.slurm.poll.cli_runner(settings.SLURM_COMMAND_PREFIX)`.

- drain: `scontrol update NodeName=X State=DRAIN Reason="breakwater: <reason>"`; a node already draining is
  success without a second update (so a retried action never rewrites the reason an operator may have edited);
- resume: `scontrol update NodeName=X State=RESUME`; a node neither drained nor down is success as it is;
- requeue: `scontrol requeue <jobid>` (the target is a job key `slurm:<jobid>` or a bare id).

Verification reads the state back with `scontrol -o show node|job`, polling for a few seconds because slurmctld
applies a requeue asynchronously.
"""

from __future__ import annotations

import re
import shlex
import time

from django.conf import settings

from alerts.models import ActionKind, RemediationAction
from alerts.remediation.backends.base import BackendError, Outcome, command, job_id
from telemetry.slurm.poll import Runner, SlurmCommandError, cli_runner

VERIFY_TIMEOUT_S = 10.0
REQUEUED_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
_STATE = re.compile(r"\b(?:State|JobState)=(\S+)")


def _reason(action: RemediationAction) -> str:
    # One line, no quotes: the reason is shown by sinfo -R and must survive a prefix such as ssh.
    text = re.sub(r"[\r\n\"'`]+", " ", action.reason).strip()
    return f"breakwater: {text}"[:200]


def needs_resume(state: str) -> bool:
    """Whether a node in Slurm state `state` (e.g. IDLE+DRAIN, DOWN*) is out of service."""
    return "DRAIN" in state or state.startswith("DOWN")


class SlurmBackend:
    """Drain, resume and requeue through the Slurm CLI."""

    name = "slurm"
    asynchronous = False

    def __init__(self, runner: Runner | None = None, *, verify_timeout: float = VERIFY_TIMEOUT_S) -> None:
        self.cli = runner or cli_runner(settings.SLURM_COMMAND_PREFIX)
        self.verify_timeout = verify_timeout

    def _argv(self, action: RemediationAction) -> list[str]:
        node = f"NodeName={action.target_key}"
        if action.kind == ActionKind.DRAIN:
            return ["scontrol", "update", node, "State=DRAIN", f"Reason={_reason(action)}"]
        if action.kind == ActionKind.RESUME:
            return ["scontrol", "update", node, "State=RESUME"]
        if action.kind == ActionKind.REQUEUE:
            return ["scontrol", "requeue", job_id(action.target_key)]
        raise BackendError(f"the Slurm backend cannot {action.kind}")

    def plan(self, action: RemediationAction) -> list[str]:
        return [shlex.join(self._argv(action))]

    def run(self, action: RemediationAction) -> Outcome:
        argv, done = self._argv(action), []
        if action.kind in (ActionKind.DRAIN, ActionKind.RESUME):
            state = self._show("node", action.target_key, done)
            if (action.kind == ActionKind.DRAIN) == needs_resume(state):
                done.append(command(shlex.join(argv), rc=None, skipped=f"node already {state}"))
                return Outcome(done)
        done.append(command(shlex.join(argv), output=self._call(argv, done)))
        return Outcome(done)

    def verify(self, action: RemediationAction) -> tuple[bool | None, dict]:
        what, key = ("job", job_id(action.target_key)) if action.kind == ActionKind.REQUEUE else ("node",
                                                                                                   action.target_key)
        deadline = time.monotonic() + self.verify_timeout
        while True:
            try:
                state = self._show(what, key, [])
            except BackendError as exc:
                return False, {"check": f"scontrol -o show {what} {key}", "error": str(exc)}
            ok = {ActionKind.DRAIN: "DRAIN" in state, ActionKind.RESUME: not needs_resume(state),
                  ActionKind.REQUEUE: state in REQUEUED_STATES}[action.kind]
            if ok or time.monotonic() >= deadline:
                return ok, {"check": f"scontrol -o show {what} {key}", "state": state}
            time.sleep(0.5)

    def _show(self, what: str, key: str, done: list[dict]) -> str:
        out = self._call(["scontrol", "-o", "show", what, key], done)
        found = _STATE.search(out)
        if not found:
            raise BackendError(f"scontrol show {what} {key}: no state in its output", done)
        return found.group(1).upper()

    def _call(self, argv: list[str], done: list[dict]) -> str:
        try:
            return self.cli(argv)
        except SlurmCommandError as exc:
            raise BackendError(str(exc), [*done, command(shlex.join(argv), rc=None, output=str(exc))]) from exc
