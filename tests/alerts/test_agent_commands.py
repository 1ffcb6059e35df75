"""Agent commands end to end: the executor queues them, the node agent fetches them over the API with its
collector token, runs a fake `nvidia-smi` (no GPU here), and its read-back verifies the action."""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.models import AgentCommand, RemediationAction
from alerts.remediation.actions import do_approve_action, do_request_action
from alerts.remediation.executor import execute
from core.models import AuditEntry
from telemetry.actions import do_create_collector_token
from telemetry.agent.commands import CommandChannel
from telemetry.agent.pusher import Pusher
from telemetry.agent.runner import Sources, run
from telemetry.models import Node
from tests.alerts import remediation_helpers as helpers
from tests.alerts.remediation_helpers import build_fleet, write_script

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager_celery")]
eager_celery = helpers.eager_celery  # fixture

HOST = "gpu-node-00"

# nvidia-smi as far as the agent uses it: -pl within the board's range, -r, and the two queries; the limits it
# set persist in state.json next to it, every call is logged. Messages are the real tool's.
FAKE_NVIDIA_SMI = f"""#!{sys.executable}
import json, pathlib, sys
here = pathlib.Path(__file__).parent
state_file = here / "state.json"
state = json.loads(state_file.read_text()) if state_file.exists() else {{}}
args = sys.argv[1:]
with open(here / "calls.log", "a") as log:
    log.write(" ".join(args) + "\\n")
index = args[args.index("-i") + 1] if "-i" in args else "0"
limit = state.get(index, 700.0)
if "-pl" in args:
    watts = float(args[args.index("-pl") + 1])
    if not 200 <= watts <= 700:
        print(f"Provided power limit {{watts:.2f}} W is not a valid power limit which should be between 200.00 W "
              "and 700.00 W for GPU 00000000:1B:00.0")
        sys.exit(2)
    state[index] = watts
    state_file.write_text(json.dumps(state))
    print(f"Power limit for GPU 00000000:1B:00.0 was set to {{watts:.2f}} W from {{limit:.2f}} W.\\nAll done.")
elif "-r" in args:
    print("GPU 00000000:1B:00.0 was successfully reset.\\nAll done.")
elif "--query-gpu=power.limit" in args:
    print(f"{{limit:.2f}}")
elif "--query-gpu=power.default_limit" in args:
    print("700.00")
else:
    sys.exit(1)
"""


@pytest.fixture
def token() -> str:
    return do_create_collector_token("agent-fleet")


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """A fake nvidia-smi first on PATH; returns a function listing its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_script(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    def calls() -> list[str]:
        log = bin_dir / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    return calls


def _queue(kind: str = "power_cap", params: dict | None = None, gpu_index: int = 1) -> RemediationAction:
    """An approved agent action, executed: its command is queued for the node's agent."""
    if not Node.objects.filter(hostname=HOST).exists():
        build_fleet(1)
    action = do_request_action(kind, f"GPU-{HOST}-{gpu_index}", mode="approval", reason="GPU at 91 C",
                               evidence={}, requested_by="olivia", params=params or {})
    do_approve_action(action.pk, None)  # the execution task runs eagerly on commit
    action.refresh_from_db()
    return action


def _auth(token: str) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def _post_result(client, token, command_id, body) -> object:
    return client.post(f"/api/v1/agent/commands/{command_id}/result", data=json.dumps(body),
                       content_type="application/json", **_auth(token))


# --- The API ----------------------------------------------------------------------------------------------

def test_poll_needs_a_collector_token(client, token):
    assert client.get("/api/v1/agent/commands", {"host": HOST}).status_code == 401
    resp = client.get("/api/v1/agent/commands", {"host": HOST}, HTTP_AUTHORIZATION="Bearer bwc_wrong")
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "bad_token"
    resp = client.get("/api/v1/agent/commands", **_auth(token))
    assert resp.status_code == 400 and resp.json()["error"]["where"] == "host"


def test_poll_hands_out_the_hosts_commands_once(client, token):
    action = _queue(params={"watts": 500})
    assert action.state == "running" and action.backend == "agent"
    assert action.result["commands"][0]["cmd"] == f"{HOST}: nvidia-smi -i 1 -pl 500"
    assert client.get("/api/v1/agent/commands", {"host": "gpu-node-09"}, **_auth(token)).json() == {"commands": []}
    first = client.get("/api/v1/agent/commands", {"host": HOST}, **_auth(token)).json()["commands"]
    assert [(c["command"], c["params"]) for c in first] == [
        ("power_cap", {"index": 1, "uuid": f"GPU-{HOST}-1", "watts": 500})]
    assert client.get("/api/v1/agent/commands", {"host": HOST}, **_auth(token)).json() == {"commands": []}
    cmd = AgentCommand.objects.get()
    assert cmd.state == "sent" and cmd.sent_at is not None and cmd.action_id == action.pk


def test_result_with_the_right_readback_verifies_the_action(client, token):
    action = _queue(params={"watts": 500})
    cmd = AgentCommand.objects.get()
    report = {"ok": True, "rc": 0, "output": "Power limit ... set to 500.00 W", "readback": {"power_limit_w": 500.0}}
    resp = _post_result(client, token, cmd.pk, report)
    assert resp.status_code == 200 and resp.json() == {"id": cmd.pk, "state": "done"}
    action.refresh_from_db()
    assert action.state == "succeeded" and action.verified is True
    assert action.result["commands"][0]["readback"] == {"power_limit_w": 500.0}
    assert _post_result(client, token, cmd.pk, report).json()["state"] == "done"  # a retried post changes nothing
    assert AuditEntry.objects.filter(verb="action.verify", outcome="verified").count() == 1


def test_result_with_another_limit_fails_verification(client, token):
    action = _queue(params={"watts": 500})
    cmd = AgentCommand.objects.get()
    _post_result(client, token, cmd.pk, {"ok": True, "rc": 0, "readback": {"power_limit_w": 700.0}})
    action.refresh_from_db()
    assert action.state == "failed" and action.verified is False
    assert action.result["verification"]["commands"][0]["expected_w"] == 500


@pytest.mark.parametrize(("body", "where"), [
    ({"ok": "yes"}, "$.ok"), ({"ok": True, "rc": "0"}, "$.rc"), ({"ok": True, "readback": {"w": "500"}}, "$.readback"),
    ([], "$"),
])
def test_malformed_result_is_400_naming_the_field(client, token, body, where):
    _queue(params={"watts": 500})
    resp = _post_result(client, token, AgentCommand.objects.get().pk, body)
    assert resp.status_code == 400 and resp.json()["error"]["where"] == where
    assert AgentCommand.objects.get().state == "queued"


def test_unfetched_command_expires_and_its_action_fails(client, token):
    action = _queue(params={"watts": 500})
    AgentCommand.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert client.get("/api/v1/agent/commands", {"host": HOST}, **_auth(token)).json() == {"commands": []}
    cmd = AgentCommand.objects.get()
    assert cmd.state == "expired"
    action.refresh_from_db()
    assert action.state == "failed" and action.verified is False
    assert action.result["error"] == f"#{cmd.pk} expired: expired: never fetched by the agent on {HOST}"
    resp = _post_result(client, token, cmd.pk, {"ok": True, "readback": {"power_limit_w": 500.0}})
    assert resp.status_code == 410 and resp.json()["error"]["code"] == "expired"


def test_follow_up_check_expires_an_unanswered_command():
    action = _queue(params={"watts": 500})
    AgentCommand.objects.update(state="sent", sent_at=timezone.now() - timedelta(hours=1))
    assert execute(action.pk) == f"failed: #{AgentCommand.objects.get().pk} expired: expired: fetched but never " \
        f"answered by the agent on {HOST}"


# --- The agent, end to end --------------------------------------------------------------------------------

def test_agent_caps_lifts_and_resets_through_the_real_server(asgi_server, token, fake_smi, tmp_path):
    channel = CommandChannel(asgi_server.url, token, HOST)
    cap = _queue(params={"watts": 450})
    assert channel.tick() == 1
    cap.refresh_from_db()
    assert (cap.state, cap.verified) == ("succeeded", True)
    assert cap.result["commands"][0]["output"].startswith("Power limit for GPU 00000000:1B:00.0 was set to 450.00 W")
    assert fake_smi() == ["-i 1 -pl 450", "--query-gpu=power.limit --format=csv,noheader,nounits -i 1"]

    uncap = _queue("power_uncap")  # no watts: back to the board's default, read from the GPU
    reset = _queue("gpu_reset", gpu_index=0)
    # The agent's own loop runs the channel once per tick, before it collects.
    run(Sources(host=HOST), Pusher(asgi_server.url, token, tmp_path / "spool"), interval=1, ticks=1,
        commands=channel)
    for action in (uncap, reset):
        action.refresh_from_db()
        assert (action.state, action.verified) == ("succeeded", True), action.result
    assert uncap.result["commands"][0]["readback"] == {"power_limit_w": 700.0, "default_limit_w": 700.0}
    assert "-i 1 -pl 700" in fake_smi() and "-i 0 -r" in fake_smi()
    assert channel.tick() == 0


def test_agent_reports_nvidia_smi_refusing_a_cap(asgi_server, token, fake_smi):
    action = _queue(params={"watts": 900})
    assert CommandChannel(asgi_server.url, token, HOST).tick() == 1
    action.refresh_from_db()
    assert action.state == "failed" and action.verified is False
    assert "not a valid power limit" in action.result["error"]
    assert AgentCommand.objects.get().result["rc"] == 2


def test_agent_without_nvidia_smi_reports_it(asgi_server, token, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    action = _queue(params={"watts": 500})
    assert CommandChannel(asgi_server.url, token, HOST).tick() == 1
    action.refresh_from_db()
    assert action.state == "failed" and "nvidia-smi not found on this node" in action.result["error"]
