"""Parsers for ipmitool text output: ``dcmi power reading`` and ``sdr elist`` / ``sdr`` (stdlib only).

The agent runs ipmitool where a BMC has no Redfish; these functions only turn its text into numbers.
"""

from __future__ import annotations

import re
from typing import Any


class IpmiError(ValueError):
    """ipmitool output that cannot be parsed; the message names the offending line."""


_DCMI_WATTS = {
    "Instantaneous power reading": "instantaneous_watts",
    "Minimum during sampling period": "min_watts",
    "Maximum during sampling period": "max_watts",
    "Average power reading over sample period": "avg_watts",
}


def parse_dcmi_power_reading(text: str) -> dict[str, Any]:
    """Parse ``ipmitool dcmi power reading``.

    Returns ``instantaneous_watts``, ``min_watts``, ``max_watts``, ``avg_watts`` (floats),
    ``sampling_period_s`` (int), ``state`` ("activated"/"deactivated"), ``timestamp`` (the BMC's own
    clock, as printed: it has no zone) and ``reason`` when no watts are reported. When power reading is
    deactivated the BMC's numbers are meaningless (often 0), so the watts are dropped.
    """
    out: dict[str, Any] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        label, sep, value = line.partition(":")
        label, value = label.strip(), value.strip()
        if not sep:
            raise IpmiError(f"line {number}: no 'label: value' in {line!r}")
        _dcmi_line(out, label, value, number, line)
    if "state" not in out and not any(k in out for k in _DCMI_WATTS.values()):
        raise IpmiError("no DCMI power reading lines found")
    if out.get("state") == "deactivated":
        for key in _DCMI_WATTS.values():
            out.pop(key, None)
        out["reason"] = "power reading state is deactivated: the BMC reports no power"
    return out


def _dcmi_line(out: dict[str, Any], label: str, value: str, number: int, line: str) -> None:
    if label in _DCMI_WATTS:
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*Watts", value)
        if not match:
            raise IpmiError(f"line {number}: expected '<n> Watts' in {line!r}")
        out[_DCMI_WATTS[label]] = float(match.group(1))
    elif label == "IPMI timestamp":
        out["timestamp"] = value
    elif label == "Sampling period":
        match = re.fullmatch(r"(\d+)\s*Seconds\.?", value)
        if not match:
            raise IpmiError(f"line {number}: expected '<n> Seconds' in {line!r}")
        out["sampling_period_s"] = int(match.group(1))
    elif label == "Power reading state is":
        if value not in ("activated", "deactivated"):
            raise IpmiError(f"line {number}: unknown power reading state {value!r}")
        out["state"] = value
    # Other labels (newer ipmitool versions add some) are ignored rather than fatal.


_UNITS = {
    "degrees C": ("temperature", "°C"),
    "RPM": ("fan", "RPM"),
    "Watts": ("power", "W"),
    "Volts": ("voltage", "V"),
    "Amps": ("current", "A"),
    "percent": ("percent", "%"),
    "feet": ("altitude", "ft"),
}
_READING = re.compile(r"(-?\d+(?:\.\d+)?)\s+(degrees C|RPM|Watts|Volts|Amps|percent|feet)\b(.*)")
_MISSING = ("no reading", "disabled", "not readable", "")


def parse_sdr_elist(text: str) -> list[dict[str, Any]]:
    """Parse ``ipmitool sdr elist`` (name | id | status | entity | reading) or plain ``ipmitool sdr``
    (name | reading | status).

    Each sensor gives ``{"name", "status", "kind", "value", "unit"}`` plus ``id`` / ``entity`` for elist;
    "No Reading", "Disabled" and "Not Readable" give ``value`` None. Discrete sensors (``0x00``,
    "Connected") keep their text in ``state`` with ``kind`` "discrete".
    """
    sensors = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) == 5:
            name, sid, status, entity, reading = cells
            sensor: dict[str, Any] = {"name": name, "id": sid, "status": status, "entity": entity}
        elif len(cells) == 3:
            name, reading, status = cells
            sensor = {"name": name, "status": status}
        else:
            raise IpmiError(f"line {number}: expected 3 or 5 '|'-separated cells in {line!r}")
        if not name:
            raise IpmiError(f"line {number}: sensor without a name in {line!r}")
        sensor.update(_reading(reading))
        sensors.append(sensor)
    return sensors


def _reading(reading: str) -> dict[str, Any]:
    match = _READING.match(reading)
    if match:
        kind, unit = _UNITS[match.group(2)]
        out: dict[str, Any] = {"kind": kind, "value": float(match.group(1)), "unit": unit}
        if match.group(3).strip(" ,"):  # "110 Watts, Presence detected"
            out["state"] = match.group(3).strip(" ,")
        return out
    if reading.lower() in _MISSING:
        return {"kind": "unknown", "value": None, "unit": None}
    return {"kind": "discrete", "value": None, "unit": None, "state": reading}
