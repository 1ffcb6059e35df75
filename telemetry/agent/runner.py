"""The agent's collection loop: every interval, read every source once and push one batch.

Sources, each optional and each failing on its own (a broken BMC never stops GPU telemetry):
- GPUs: NVML when `pynvml` loads, else `nvidia-smi -q -x` (the fallback parser);
- XID events: NVML's event set, and NVRM lines from /dev/kmsg (read from where the agent started);
- fabric ports: /sys/class/infiniband;
- node power and thermals: the BMC over Redfish, when a URL is given.
Problems are logged with the source's name and counted in the agent's health.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from telemetry.agent import infiniband, kernel_log, nvml, nvsmi, redfish
from telemetry.agent.pusher import Pusher

log = logging.getLogger(__name__)


@dataclass
class Sources:
    """What this node has; built once at start by `discover()`."""

    host: str
    nvml: object | None = None
    xid_watcher: nvml.XidWatcher | None = None
    nvidia_smi: str | None = None
    ib_root: Path | None = None
    kmsg: int | None = None  # file descriptor, non-blocking, positioned at the end at start
    redfish: redfish.RedfishClient | None = None
    problems: dict[str, str] = field(default_factory=dict)
    uuids: dict[int, str] = field(default_factory=dict)  # index -> UUID, remembered for GPUs that get lost


def discover(host: str, *, ib_root: Path, kmsg_path: str | None, redfish_client=None, nvml_module=None) -> Sources:
    """Find the sources this node offers; every absence is logged once, not raised."""
    src = Sources(host=host, redfish=redfish_client, ib_root=ib_root if ib_root.is_dir() else None)
    try:
        src.nvml = nvml_module or nvml.load_nvml()
    except Exception as exc:  # noqa: BLE001 - no driver, no library: fall back, say why
        src.problems["nvml"] = str(exc)
        src.nvml = None
        src.nvidia_smi = _which("nvidia-smi")
    if src.nvml is not None:
        try:
            src.xid_watcher = nvml.XidWatcher(src.nvml)
        except Exception as exc:  # noqa: BLE001 - some vGPU/VM drivers refuse event sets; samples still flow
            src.problems["nvml_events"] = str(exc)
    if kmsg_path:
        try:
            src.kmsg = os.open(kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(src.kmsg, 0, os.SEEK_END)  # only what happens from now on
        except OSError as exc:
            src.problems["kmsg"] = str(exc)
    return src


def _which(name: str) -> str | None:
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def collect_batch(src: Sources, now: datetime | None = None) -> tuple[dict, list[str]]:
    """One batch for the ingest API, and the problems met while reading."""
    now = now or datetime.now(UTC)
    batch: dict = {"time": now.isoformat(), "gpus": [], "migs": [], "ports": [], "power": [], "events": []}
    problems: list[str] = []
    for name, step in (("gpus", _gpus), ("xid", _xids), ("kmsg", _kmsg), ("infiniband", _ports), ("redfish", _bmc)):
        try:
            step(src, batch, problems)
        except Exception as exc:  # noqa: BLE001 - one source failing must not stop the others
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    return {k: v for k, v in batch.items() if v}, problems


def _gpus(src: Sources, batch: dict, problems: list[str]) -> None:
    if src.nvml is not None:
        reading = nvml.collect(src.nvml, host=src.host)
        problems.extend(f"nvml: {p}" for p in reading.problems)
        src.uuids.update({g["index"]: g["uuid"] for g in reading.gpus})
        for index in reading.lost:
            if index in src.uuids:  # a lost GPU cannot tell its UUID any more: use the one it had
                batch["events"].append({"host": src.host, "gpu_uuid": src.uuids[index], "kind": "fallen_off_bus",
                                        "code": 79, "source": "nvml", "message": "NVML: GPU is lost"})
    elif src.nvidia_smi:
        out = subprocess.run([src.nvidia_smi, "-q", "-x"], capture_output=True, timeout=30, check=True).stdout
        reading = nvsmi.parse_nvsmi_xml(out, host=src.host)
    else:
        return
    batch["gpus"].extend(reading.gpus)
    batch["migs"].extend(reading.migs)


def _xids(src: Sources, batch: dict, problems: list[str]) -> None:
    if src.xid_watcher is None:
        return
    for ev in src.xid_watcher.poll():
        batch["events"].append({"host": src.host, "gpu_uuid": ev["gpu_uuid"], "kind": "xid", "code": ev["xid"],
                                "source": "nvml", "message": f"XID {ev['xid']} (NVML event)"})


def _kmsg(src: Sources, batch: dict, problems: list[str]) -> None:
    if src.kmsg is None:
        return
    chunks = []
    while True:
        try:
            chunk = os.read(src.kmsg, 8192)  # /dev/kmsg returns one record per read
        except BlockingIOError:
            break
        except OSError as exc:  # EPIPE: records were overwritten before we read them
            problems.append(f"kmsg: {exc}")
            continue
        if not chunk:
            break
        chunks.append(chunk.decode(errors="replace"))
    parsed = kernel_log.parse_kernel_log("".join(chunks))
    for ev in parsed.events:
        if ev.get("pci_bus_id") is None:
            continue
        kind = "fallen_off_bus" if ev.get("fallen_off_bus") else "xid"
        batch["events"].append({"host": src.host, "pci_bus_id": ev["pci_bus_id"], "kind": kind,
                                "code": ev.get("xid") or 0, "message": ev["message"][:2000], "source": "kmsg"})
    problems.extend(f"kmsg line {u['line']}: {u['reason']}" for u in parsed.unparsed)


def _ports(src: Sources, batch: dict, problems: list[str]) -> None:
    if src.ib_root is None:
        return
    found: list = []
    batch["ports"].extend(infiniband.read_sysfs(src.ib_root, host=src.host, problems=found))
    problems.extend(f"infiniband: {p.path}: {p.reason}" for p in found)


def _bmc(src: Sources, batch: dict, problems: list[str]) -> None:
    if src.redfish is None:
        return
    reading = redfish.collect(src.redfish, host=src.host)
    # Naming the host lets the server register this node's BMC readings as its power device.
    batch["power"].extend({**rec, "host": src.host} for rec in reading.power)
    problems.extend(f"redfish: {p}" for p in reading.problems)


def agent_report(src: Sources, pusher: Pusher, problems: list[str]) -> dict:
    """The agent's own health, sent with every batch (the server keeps the newest per host)."""
    h = pusher.health
    return {
        "host": src.host, "sent_batches": h.sent_batches, "sent_samples": h.sent_samples,
        "spooled_batches": h.spooled_batches, "dropped_samples": dict(h.dropped_samples),
        "last_error": h.last_error[:500], "last_success": h.last_success,
        "sources": {"nvml": src.nvml is not None, "nvidia_smi": bool(src.nvidia_smi), "kmsg": src.kmsg is not None,
                    "infiniband": src.ib_root is not None, "redfish": src.redfish is not None},
        "unavailable": dict(src.problems), "problems": problems[:20],
    }


def run(src: Sources, pusher: Pusher, *, interval: float, ticks: int | None = None, commands=None) -> None:
    """Collect and push every `interval` seconds, aligned to the wall clock, until stopped. With `commands` (a
    `telemetry.agent.commands.CommandChannel`), remediation commands are fetched and run once per tick too."""
    done = 0
    while ticks is None or done < ticks:
        if commands is not None:
            commands.tick()
        batch, problems = collect_batch(src)
        for p in problems[:20]:
            log.warning("%s", p)
        batch["agent"] = agent_report(src, pusher, problems)
        delivered = pusher.push(batch)
        h = pusher.health
        log.info("tick: %d GPUs, %d ports, %d events; %s; sent=%d spooled=%d dropped=%s",
                 len(batch.get("gpus", [])), len(batch.get("ports", [])), len(batch.get("events", [])),
                 "delivered" if delivered else "queued", h.sent_batches, h.spooled_batches, h.dropped_samples)
        done += 1
        if ticks is None or done < ticks:
            time.sleep(interval - time.time() % interval)
