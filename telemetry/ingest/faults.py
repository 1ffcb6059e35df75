"""Fault events found at ingest: sent explicitly by agents, or read off GPU samples.

From samples (compared with the last-value row, before it is overwritten):
- the XID gauge changing to a new non-zero code (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS keeps only
  the last code, so a change is the only trace of a new one);
- the volatile DBE counter rising; a first-seen GPU already showing DBEs;
- row_remap_failure turning on;
- NVLink CRC / replay / recovery error counters growing (a non-zero count at first sight is a
  baseline, not news: links accumulate a few CRC errors over their life);
- a GPU reset: the energy counter or a volatile ECC counter starting again from a lower value,
  which clears that GPU's open events (they stay as history).
A frame with several times per GPU is compared once, against the last value before the batch.

Only suspects are compared in SQL: GPUs whose new values show a fault sign (a non-zero XID, DBE,
remap failure or NVLink error count) or that have an open event a reset could clear. A healthy
interval therefore costs two set scans in Python, not a join of the whole batch with the
last-value table.
"""

from __future__ import annotations

import numpy as np

from telemetry.actions import EventIn

NVLINK_FIELDS = ("nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors")
DERIVE_FIELDS = {"xid", "ecc_dbe_vol", "ecc_sbe_vol", "row_remap_failure", "energy_mj", *NVLINK_FIELDS}
_NV_S = " + ".join(f"coalesce(s.{f}, 0)" for f in NVLINK_FIELDS)
_NV_L = " + ".join(f"coalesce(l.{f}, 0)" for f in NVLINK_FIELDS)
_NV_KNOWN = " OR ".join(f"l.{f} IS NOT NULL" for f in NVLINK_FIELDS)

DERIVE_SQL = """
SELECT s.gpu_id, s.time, s.xid, l.xid, s.ecc_dbe_vol, l.ecc_dbe_vol, s.row_remap_failure,
       l.row_remap_failure, (s.energy_mj < l.energy_mj OR s.ecc_sbe_vol < l.ecc_sbe_vol
                             OR s.ecc_dbe_vol < l.ecc_dbe_vol) AS reset,
       CASE WHEN ({nv_known}) THEN ({nv_s}) - ({nv_l}) ELSE 0 END AS nvlink_growth
FROM {stage} s LEFT JOIN telemetry_gpu_sample_latest l ON l.gpu_id = s.gpu_id
WHERE s.gpu_id = ANY(%s) AND (
   l.gpu_id IS NULL AND (s.xid > 0 OR s.ecc_dbe_vol > 0 OR s.row_remap_failure = 1)
   OR l.time < s.time AND (
        (s.xid > 0 AND s.xid IS DISTINCT FROM l.xid) OR s.ecc_dbe_vol > l.ecc_dbe_vol
        OR (s.row_remap_failure = 1 AND l.row_remap_failure IS DISTINCT FROM 1)
        OR s.energy_mj < l.energy_mj OR s.ecc_sbe_vol < l.ecc_sbe_vol OR s.ecc_dbe_vol < l.ecc_dbe_vol
        OR (({nv_known}) AND ({nv_s}) > ({nv_l}))))
ORDER BY s.time
"""
SIGN_FIELDS = ("xid", "ecc_dbe_vol", "row_remap_failure", *NVLINK_FIELDS)


def suspects(values: dict[str, list], ids: list, open_gpus: set[int]) -> list[int]:
    """GPU ids worth comparing with their last values (see the module docstring)."""
    found = set(open_gpus.intersection(ids))
    for name in SIGN_FIELDS:
        col = values.get(name)
        if isinstance(col, np.ma.MaskedArray):
            found.update(ids[i] for i in np.flatnonzero(col.filled(0)).tolist())
        elif col is not None:
            found.update(gid for gid, v in zip(ids, col, strict=True) if v)
    return list(found)


def open_event_gpus(cur) -> set[int]:
    """GPUs with an open fault event (the partial index on open events answers this)."""
    cur.execute("SELECT DISTINCT gpu_id FROM telemetry_gpu_event WHERE cleared_at IS NULL")
    return {row[0] for row in cur.fetchall()}


def derive(cur, stage: str, gpu_ids: list[int]) -> tuple[list[EventIn], list[tuple[int, object]]]:
    """(new sightings, GPU resets as (gpu_id, time)) from the staged rows of `gpu_ids`."""
    if not gpu_ids:
        return [], []
    cur.execute(DERIVE_SQL.format(stage=stage, nv_s=_NV_S, nv_l=_NV_L, nv_known=_NV_KNOWN), [gpu_ids])
    events, resets = [], []
    for gpu_id, t, xid, old_xid, dbe, old_dbe, remap, old_remap, reset, nvlink in cur.fetchall():
        if reset:
            resets.append((gpu_id, t))
        if xid and xid != old_xid:
            events.append(EventIn(gpu_id, "xid", t, code=int(xid), message=f"XID {xid} reported", source="samples"))
        if dbe and dbe > (old_dbe or 0) and not reset:
            grew = dbe - (old_dbe or 0)
            events.append(EventIn(gpu_id, "ecc_dbe", t, count=int(grew), source="samples",
                                  message=f"volatile double-bit ECC errors: {dbe} (+{grew})"))
        if nvlink and nvlink > 0 and not reset:
            events.append(EventIn(gpu_id, "nvlink_errors", t, count=int(nvlink), source="samples",
                                  message=f"NVLink CRC/replay/recovery errors grew by {nvlink}"))
        if remap == 1 and old_remap != 1:
            events.append(EventIn(gpu_id, "row_remap_failure", t, source="samples",
                                  message="row remapping failed: the memory cannot be repaired"))
    return events, resets
