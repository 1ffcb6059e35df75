"""Entities named as an operator says them: "GPU 7 of node-0227", "node-0227 mlx5_2 ↔ leaf-03 p12".

Database ids and UUIDs identify rows; nobody on call says them. The anomaly list, the reliability
page and anything else that names a GPU, a port or a job takes the words from here, one query per
kind for a whole list, so two pages never call the same GPU two things.
"""

from __future__ import annotations

from collections.abc import Iterable

from telemetry.models import Gpu, Job, Port
from telemetry.selectors.inventory import job_key

LINK = " ↔ "


def gpu_name(index: int | None, host: str, uuid: str = "") -> str:
    """ "GPU 7 of node-0227"; a GPU whose index is unknown is named by its UUID's head instead."""
    which = f"GPU {index}" if index is not None else f"GPU {uuid[:12]}…" if uuid else "GPU ?"
    return f"{which} of {host}" if host else which


def gpu_names(uuids: Iterable[str]) -> dict[str, dict]:
    """{uuid: {"name", "index", "host", "rack"}} for the GPUs that exist (one query)."""
    rows = Gpu.objects.filter(uuid__in=set(uuids)).values_list("uuid", "index", "node__hostname", "node__rack__name")
    return {u: {"name": gpu_name(i, h, u), "index": i, "host": h, "rack": r or ""} for u, i, h, r in rows}


def port_end(port: Port | None) -> str:
    """One end of a cable: "leaf-03 p12" on a switch, "node-0227 mlx5_2" on a node's HCA."""
    if port is None:
        return "?"
    owner = port.switch.name if port.switch_id else port.node.hostname if port.node_id else ""
    return f"{owner} {port.name}".strip()


def _peer(port: Port) -> Port | None:
    for side, other in (("link_as_a", "b"), ("link_as_b", "a")):
        link = getattr(port, side, None)  # a missing reverse one-to-one raises, which getattr turns into None
        if link is not None:
            return getattr(link, other)
    return None


def port_names(ids: Iterable[int]) -> dict[int, dict]:
    """{port id: {"name": its own end, "link": both ends (the node's end first), "host": a node at
    either end or ""}}. A port without a cable is named by its own end alone."""
    ports = Port.objects.filter(pk__in=set(ids)).select_related(
        "switch", "node", "link_as_a__b__switch", "link_as_a__b__node", "link_as_b__a__switch", "link_as_b__a__node")
    out = {}
    for p in ports:
        peer = _peer(p)
        ends = [port_end(p)] if peer is None else [port_end(p), port_end(peer)]
        if peer is not None and peer.node_id and not p.node_id:
            ends.reverse()  # the host first: that is how a node's cabling is read
        node = p.node if p.node_id else peer.node if peer is not None and peer.node_id else None
        out[p.pk] = {"name": port_end(p), "link": LINK.join(ends), "host": node.hostname if node else ""}
    return out


def job_names(keys: Iterable[str]) -> dict[str, str]:
    """{job key: "llm-pretrain (slurm:100)"} for the jobs that exist; a nameless job keeps its key."""
    pairs = {tuple(k.split(":", 1)) for k in keys if ":" in k}
    if not pairs:
        return {}
    sources = {s for s, _ in pairs}
    rows = Job.objects.filter(source__in=sources, external_id__in=[e for _, e in pairs]).values_list(
        "source", "external_id", "name")
    out = {}
    for source, external, name in rows:
        key = job_key(source, external)
        if (source, external) in pairs:
            out[key] = f"{name} ({key})" if name else key
    return out
