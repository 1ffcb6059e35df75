"""Remediation backends by name: the configured scheduler backend, the node agent and the ticket webhook.

What a backend is (`Backend`, `Outcome`, `BackendError`) is in `base`; each backend is a module beside it.
"""

from __future__ import annotations

from alerts.remediation.backends.agent import AgentBackend
from alerts.remediation.backends.base import Backend, backend_name
from alerts.remediation.backends.kubernetes import KubernetesBackend
from alerts.remediation.backends.simulator import SimulatorBackend
from alerts.remediation.backends.slurm import SlurmBackend
from alerts.remediation.backends.ticket import TicketBackend

BACKENDS: dict[str, type] = {"slurm": SlurmBackend, "kubernetes": KubernetesBackend, "simulator": SimulatorBackend,
                             "agent": AgentBackend, "webhook": TicketBackend}


def get_backend(kind: str, name: str | None = None) -> Backend:
    """A backend instance for action `kind` (or the one called `name`, for an action already started)."""
    name = name or backend_name(kind)
    if name not in BACKENDS:
        raise ValueError(f"no remediation backend named {name!r}")
    return BACKENDS[name]()
