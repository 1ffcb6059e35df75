"""The agent's side of the remediation command channel: fetch this node's commands, run them with nvidia-smi,
read the result back, and report it. Standard library only, like the rest of the agent.

1. GET <server>/api/v1/agent/commands?host=<host> with the collector token: the commands queued for this node
   (the server marks them sent, so each is handed out once).
2. Each command runs nvidia-smi on the GPU at params["index"]:
   power_cap    `nvidia-smi -i <index> -pl <watts>`
   power_uncap  `nvidia-smi -i <index> -pl <default>` (params["watts"], else the GPU's power.default_limit)
   gpu_reset    `nvidia-smi -i <index> -r`
   then reads back `nvidia-smi --query-gpu=power.limit --format=csv,noheader,nounits -i <index>`.
3. POST <server>/api/v1/agent/commands/<id>/result {"ok", "rc", "output", "readback"}; the server verifies
   the read-back against what it asked for. A post that fails is retried on the next tick (the server
   accepts a repeated report).
Commands are opt-in on the agent (`--accept-commands`): power caps and resets change the node.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

KNOWN = ("power_cap", "power_uncap", "gpu_reset")
TIMEOUT_S = 60.0  # a GPU reset can take tens of seconds


class ChannelError(Exception):
    """The server could not be reached or refused the request."""


def _query(nvidia_smi: str, index: int, field_name: str) -> float | None:
    try:
        res = subprocess.run([nvidia_smi, f"--query-gpu={field_name}", "--format=csv,noheader,nounits", "-i",
                              str(index)], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return float(res.stdout.strip().splitlines()[0]) if res.returncode == 0 else None
    except (ValueError, IndexError):  # "[N/A]" or nothing: no reading
        return None


def run_command(cmd: dict, nvidia_smi: str) -> dict:
    """Run one command; the report for the server (never raises)."""
    kind, params = cmd.get("command"), cmd.get("params") or {}
    index = params.get("index")
    if kind not in KNOWN or not isinstance(index, int):
        return {"ok": False, "rc": None, "output": f"unknown command {kind!r} or no GPU index", "readback": {}}
    if kind == "gpu_reset":
        argv = [nvidia_smi, "-i", str(index), "-r"]
    else:
        watts = params.get("watts") if kind == "power_cap" else params.get("watts") or _query(
            nvidia_smi, index, "power.default_limit")
        if watts is None:
            return {"ok": False, "rc": None, "output": "the GPU reports no default power limit", "readback": {}}
        argv = [nvidia_smi, "-i", str(index), "-pl", f"{float(watts):g}"]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "rc": None, "output": f"{' '.join(argv)}: {exc}", "readback": {}}
    readback = {"power_limit_w": _query(nvidia_smi, index, "power.limit")}
    if kind == "power_uncap":
        readback["default_limit_w"] = _query(nvidia_smi, index, "power.default_limit")
    output = (res.stdout + res.stderr).strip()[-4000:]
    return {"ok": res.returncode == 0, "rc": res.returncode, "output": output, "readback": readback}


@dataclass
class CommandChannel:
    """Polls the server for this node's commands and answers them; `tick()` once per agent loop."""

    server: str
    token: str
    host: str
    nvidia_smi: str | None = None
    timeout: float = 10.0
    unsent: dict[int, dict] = field(default_factory=dict)  # reports whose post failed, retried next tick

    def __post_init__(self) -> None:
        self.server = self.server.rstrip("/")
        self.nvidia_smi = self.nvidia_smi or shutil.which("nvidia-smi")

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise ChannelError(f"{method} {path}: HTTP {exc.code} {exc.read()[:300]!r}") from exc
        except (OSError, ValueError) as exc:
            raise ChannelError(f"{method} {path}: {exc}") from exc

    def fetch(self) -> list[dict]:
        """This node's commands (marked sent by the server)."""
        query = urllib.parse.urlencode({"host": self.host})
        return self._request("GET", f"/api/v1/agent/commands?{query}").get("commands") or []

    def report(self, command_id: int, result: dict) -> None:
        """Post one command's result."""
        self._request("POST", f"/api/v1/agent/commands/{command_id}/result", result)

    def tick(self) -> int:
        """Retry unsent reports, then fetch, run and report new commands; returns how many ran. Never raises."""
        for command_id, result in list(self.unsent.items()):
            self._send(command_id, result)
        try:
            commands = self.fetch()
        except ChannelError as exc:
            log.warning("agent commands: %s", exc)
            return 0
        for cmd in commands:
            if self.nvidia_smi is None:
                result = {"ok": False, "rc": None, "output": "nvidia-smi not found on this node", "readback": {}}
            else:
                result = run_command(cmd, self.nvidia_smi)
            log.info("agent command #%s %s: ok=%s", cmd.get("id"), cmd.get("command"), result["ok"])
            self._send(cmd["id"], result)
        return len(commands)

    def _send(self, command_id: int, result: dict) -> None:
        try:
            self.report(command_id, result)
            self.unsent.pop(command_id, None)
        except ChannelError as exc:
            if "HTTP 4" in str(exc):  # refused (expired, unknown): retrying cannot help
                self.unsent.pop(command_id, None)
            else:
                self.unsent[command_id] = result
            log.warning("agent command #%s: report failed: %s", command_id, exc)
