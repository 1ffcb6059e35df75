"""What every remediation backend shares: the backend protocol, its outcome and error, and the command record.

Remediation backends: each turns one action into commands on the outside world and verifies the result.

A backend has `name`, `plan(action) -> list[str]` (the commands it would run: shadow mode records these),
`run(action) -> Outcome` (does it; every command with its output) and `verify(action) -> (bool | None, dict)`
(reads the world back: True verified, False not, None not knowable yet). An asynchronous backend (the node
agent) only queues its work in `run`; the action finishes when the agent reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from django.conf import settings

from alerts.models import ActionKind, RemediationAction

SCHEDULER_KINDS = {ActionKind.DRAIN, ActionKind.RESUME, ActionKind.REQUEUE}
AGENT_KINDS = {ActionKind.POWER_CAP, ActionKind.POWER_UNCAP, ActionKind.GPU_RESET}


@dataclass
class Outcome:
    """What `run` did: every command with its exit status and output; `pending` while an agent still works."""

    commands: list[dict] = field(default_factory=list)
    pending: bool = False
    detail: dict = field(default_factory=dict)


class BackendError(Exception):
    """The backend could not do the action; `commands` holds what ran before it failed, with outputs."""

    def __init__(self, message: str, commands: list[dict] | None = None):
        super().__init__(message)
        self.commands = commands or []


class Backend(Protocol):
    """What the executor needs of a backend (see the module docstring)."""

    name: str
    asynchronous: bool

    def plan(self, action: RemediationAction) -> list[str]: ...

    def run(self, action: RemediationAction) -> Outcome: ...

    def verify(self, action: RemediationAction) -> tuple[bool | None, dict]: ...


def backend_name(kind: str) -> str:
    """Which backend runs `kind`: the configured scheduler backend, the node agent, or the ticket webhook."""
    if kind in SCHEDULER_KINDS:
        return settings.REMEDIATION_BACKEND
    if kind in AGENT_KINDS:
        return "agent"
    return "webhook"


def job_id(target_key: str) -> str:
    """A job key `source:external_id` (or a bare scheduler id) to the scheduler's own id."""
    return target_key.split(":", 1)[1] if ":" in target_key else target_key


def command(cmd: str, *, rc: int | None = 0, output: str = "", **extra) -> dict:
    """One command as recorded in an action's result."""
    return {"cmd": cmd, "rc": rc, "output": output[-2000:], **extra}
