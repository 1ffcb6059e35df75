"""Prometheus exposition (dcgm-exporter) → validated Batch, shared by the push endpoint and the
beat scraper."""

from __future__ import annotations

from telemetry.ingest.dcgm import dcgm_records
from telemetry.ingest.prometheus import ExpositionError, parse_exposition
from telemetry.ingest.schema import Batch, BatchError, TimeParser, add_record


def parse_dcgm_exposition(body: bytes | str, times: TimeParser, host: str | None) -> tuple[Batch, int]:
    """Parse a dcgm-exporter scrape; returns the batch and how many NVML 'blank' values were dropped.

    `host` names the machine when the exporter emits no Hostname label.
    """
    try:
        recs = dcgm_records(parse_exposition(body))
    except ExpositionError as exc:
        raise BatchError(f"line {exc.line}", exc.message) from exc
    batch = Batch()
    for i, gpu in enumerate(recs.gpus):
        rec = _ident(gpu, host, ("uuid", "index", "model", "pci_bus_id", "driver"), f"gpu {gpu.get('uuid')}")
        add_record(batch, "gpu", rec, f"gpus[{i}]", times, None)
    for i, mig in enumerate(recs.migs):
        rec = _ident(mig, host, ("gpu_uuid", "gpu_index", "gi_id", "ci_id", "profile"), f"mig {mig.get('gpu_uuid')}")
        add_record(batch, "mig", rec, f"migs[{i}]", times, None)
    return batch, recs.blanks


def _ident(raw: dict, host: str | None, keys: tuple[str, ...], what: str) -> dict:
    hostname = raw.get("host") or host
    if not hostname:
        raise BatchError(what, "no Hostname label and no ?host= given: cannot tell which node this is")
    rec = {k: raw[k] for k in keys if raw.get(k) not in (None, "")}
    rec["host"] = hostname
    rec["fields"] = raw.get("fields") or {}
    rec["extra"] = raw.get("extra") or {}
    if raw.get("time") is not None:
        rec["time"] = raw["time"].timestamp()
    return rec
