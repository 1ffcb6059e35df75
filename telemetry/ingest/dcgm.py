"""Map parsed dcgm-exporter samples onto GPU and MIG-instance records.

dcgm-exporter emits one series per (metric, GPU) and, with MIG enabled, extra series per GPU
instance that carry ``GPU_I_ID`` / ``GPU_I_PROFILE`` for the same UUID. :func:`dcgm_records`
folds them into one record per whole GPU and one per GPU instance (per distinct sample timestamp),
keyed by host and UUID, with values under the column names of :mod:`telemetry.fields`.

Rules:
- A sample is a MIG-instance sample iff it has a ``GPU_I_ID`` label; its fields are limited to
  ``MIG_FIELDS``. Mapped metrics outside that set, and metrics with no column at all, go to
  ``extra`` under their DCGM metric name, as parsed floats.
- DCGM/NVML blank sentinels ("not supported", "no permission"...) are dropped and counted, never
  stored as numbers. NaN and +/-Inf are kept: the ingest validator rejects and counts those.
- Integer columns get ``int`` values in DCGM's own units (energy stays in mJ). Counters above
  2**53 lose precision in the float parse; DCGM counters do not get near that. A non-integral
  value in an integer column stays a float, for the validator to judge.
- Where two DCGM metrics feed one column (e.g. enforced vs management power limit), the one listed
  first in the field's ``sources`` wins and the other is kept in ``extra``.
- The same series twice within one record (a repeated scrape) keeps the last value.
- A sample timestamp outside the calendar (before year 1 or after 9999) raises `ExpositionError` for
  its line: there is no time to store it at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from telemetry.fields import (
    DCGM_FP64_BLANK,
    DCGM_INT32_BLANK,
    DCGM_INT64_BLANK,
    DCGM_TO_GPU_FIELD,
    GPU_FIELDS,
    MIG_FIELDS,
    is_dcgm_blank,
)
from telemetry.ingest.prometheus import ExpositionError, PromSample

__all__ = ["DcgmRecords", "dcgm_records", "is_blank"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_INT_COLUMNS = frozenset(f.name for f in GPU_FIELDS if f.is_int)
_MIG_COLUMNS = frozenset(f.name for f in MIG_FIELDS)
# Rank of a metric among the sources of its column, only for columns with more than one source.
_SOURCE_RANK: dict[str, int] = {
    source: rank for f in GPU_FIELDS if len(f.sources) > 1 for rank, source in enumerate(f.sources)
}
_SOURCES_BY_COLUMN = {f.name: f.sources for f in GPU_FIELDS}
# Every sentinel is at least this large, so smaller readings skip the full blank test.
_LOWEST_BLANK = min(DCGM_INT32_BLANK, DCGM_FP64_BLANK, DCGM_INT64_BLANK)


@dataclass(slots=True)
class DcgmRecords:
    """Result of :func:`dcgm_records`; rows are in order of first appearance."""

    gpus: list[dict[str, Any]] = field(default_factory=list)
    migs: list[dict[str, Any]] = field(default_factory=list)
    blanks: int = 0  # sentinel values dropped
    ignored: int = 0  # samples that are not DCGM series or carry no UUID


@dataclass(slots=True)
class _Series:
    """One GPU or GPU instance: its identity and its rows by sample timestamp."""

    is_mig: bool
    header: dict[str, Any]  # identity fields, copied into each new row
    rows: dict[int | None, _Row] = field(default_factory=dict)


@dataclass(slots=True)
class _Row:
    record: dict[str, Any]
    fields: dict[str, Any]
    extra: dict[str, float]
    ranks: dict[str, int] = field(default_factory=dict)  # column -> rank of the source that set it


# (column or None for extra, store as int, column has several sources)
_Plan = tuple[str | None, bool, bool]


def is_blank(value: float) -> bool:
    """True for DCGM/NVML 'no value' sentinels; NaN and infinities are readings, not blanks."""
    if value != value or value in (math.inf, -math.inf):
        return False
    # INT64 sentinels (0x7ffffffffffffff0..+15) sit above the FP64 one; kept explicit for clarity.
    return is_dcgm_blank(value) or DCGM_INT64_BLANK <= value <= DCGM_INT64_BLANK + 15


def dcgm_records(samples: list[PromSample]) -> DcgmRecords:
    """Group DCGM samples into whole-GPU and MIG-instance records (see module docstring)."""
    result = DcgmRecords()
    by_key: dict[tuple[str | None, str, int | None], _Series] = {}
    # Keyed by id(): the parser shares one labels dict per label set, so this is one lookup per
    # sample instead of re-reading labels. The dict is kept in the value so its id cannot be
    # reused while this map lives.
    by_labels: dict[int, tuple[dict[str, str], _Series | None]] = {}
    plans: tuple[dict[str, _Plan], dict[str, _Plan]] = ({}, {})  # whole GPU, MIG instance
    times: dict[int, datetime] = {}
    for name, labels, value, stamp, _line in samples:
        cached = by_labels.get(id(labels))
        if cached is None:
            cached = by_labels[id(labels)] = (labels, _series_for(labels, by_key))
        series = cached[1]
        if series is None or not name.startswith("DCGM_"):
            result.ignored += 1
            continue
        row = series.rows.get(stamp)
        if row is None:
            row = series.rows[stamp] = _new_row(series, stamp, times, result, _line)
        # One comparison clears ordinary readings; only huge values (or inf) need the full test.
        if value >= _LOWEST_BLANK and is_blank(value):
            result.blanks += 1
            continue
        kind_plans = plans[series.is_mig]
        plan = kind_plans.get(name)
        if plan is None:
            plan = kind_plans[name] = _plan(name, series.is_mig)
        column, as_int, ranked = plan
        if column is None:
            row.extra[name] = value
        elif ranked:
            _put_ranked(row, name, column, value, as_int)
        else:
            row.fields[column] = int(value) if as_int and value.is_integer() else value
    return result


def _plan(metric: str, mig: bool) -> _Plan:
    column = DCGM_TO_GPU_FIELD.get(metric)
    if column is None or (mig and column not in _MIG_COLUMNS):
        return None, False, False
    return column, column in _INT_COLUMNS, metric in _SOURCE_RANK


def _series_for(
    labels: dict[str, str], by_key: dict[tuple[str | None, str, int | None], _Series]
) -> _Series | None:
    """The series a label set belongs to; label sets that differ only in other labels share it."""
    uuid = labels.get("UUID")
    if not uuid:
        return None
    host = labels.get("Hostname") or None
    raw_gi = labels.get("GPU_I_ID")
    gi_id = None if raw_gi is None else _as_int(raw_gi)
    if raw_gi is not None and gi_id is None:
        return None  # an instance we cannot key is no better than a series without a UUID
    key = (host, uuid, gi_id)
    series = by_key.get(key)
    if series is None:
        series = by_key[key] = _Series(gi_id is not None, _header(labels, host, uuid, gi_id))
    return series


def _header(labels: dict[str, str], host: str | None, uuid: str, gi_id: int | None) -> dict:
    index = _as_int(labels.get("gpu"))
    if gi_id is None:
        return {
            "host": host, "uuid": uuid, "index": index, "model": labels.get("modelName"),
            "pci_bus_id": labels.get("pci_bus_id"), "driver": labels.get("DCGM_FI_DRIVER_VERSION"),
        }
    return {
        "host": host, "gpu_uuid": uuid, "gpu_index": index, "gi_id": gi_id,
        "ci_id": _as_int(labels.get("GPU_I_CI_ID", labels.get("CI_ID"))),
        "profile": labels.get("GPU_I_PROFILE"),
    }


def _as_int(raw: str | None) -> int | None:
    # GPU and instance ids are small; a 5,000-digit label is no id (and int() refuses 4,300+ digits).
    if raw is None or not raw.isdecimal() or not raw.isascii() or len(raw) > 9:
        return None
    return int(raw)


def _new_row(
    series: _Series, stamp: int | None, times: dict[int, datetime], result: DcgmRecords, line: int
) -> _Row:
    when = None
    if stamp is not None:
        when = times.get(stamp)
        if when is None:
            # Integer milliseconds through timedelta: exact, unlike fromtimestamp(stamp / 1000).
            try:
                when = times[stamp] = _EPOCH + timedelta(milliseconds=stamp)
            except OverflowError:
                raise ExpositionError(line, f"timestamp {stamp} ms is outside the years 1 to 9999") from None
    fields: dict[str, Any] = {}
    extra: dict[str, float] = {}
    record = {**series.header, "time": when, "fields": fields, "extra": extra}
    (result.migs if series.is_mig else result.gpus).append(record)
    return _Row(record, fields, extra)


def _put_ranked(row: _Row, metric: str, column: str, value: float, as_int: bool) -> None:
    """Fill a column fed by several DCGM metrics: the first-listed source wins."""
    rank = _SOURCE_RANK[metric]
    held = row.ranks.get(column)
    if held is not None and held < rank:
        row.extra[metric] = value
        return
    if held is not None and held > rank:
        displaced = _SOURCES_BY_COLUMN[column][held]
        row.extra[displaced] = float(row.fields[column])
    row.ranks[column] = rank
    row.fields[column] = int(value) if as_int and value.is_integer() else value
