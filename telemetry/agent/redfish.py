"""Node power, thermals and GPU health read from the BMC over Redfish (standard library only).

``collect(client, host=...)`` walks the service root and returns ingest-ready records
(docs/ingest.md): ``power`` records ``{"device", "fields", "extra"}`` and ``gpus`` records
``{"host", "uuid", "model", "fields", "extra"}``.

What is read, and which model wins when a BMC exposes both:
- Node chassis: the newer ``EnvironmentMetrics`` / ``PowerSubsystem`` / ``ThermalSubsystem`` first, then
  the legacy ``Power`` / ``Thermal`` fill only the fields still missing (the DMTF rackmount mockup
  reports both, with different numbers). The record is named ``<host>``; when several node chassis
  report data, each is ``<host>/<chassis id>``.
- ``energy_j`` is the chassis ``EnvironmentMetrics.EnergykWh`` (kWh x 3.6e6), else the sum of the power
  supplies' ``EnergykWh``; ``watts`` falls back to the sum of the supplies' input watts.
- Power shelves and PDUs (Chassis of type PowerShelf, a LiteOn-style ``Shelf`` without computer systems,
  chassis linked to a ``PowerDistribution``, and the ``/redfish/v1/PowerEquipment`` tree) become
  ``<host>/<chassis id>``; their outlets ``<host>/<chassis id>/<outlet id>``.
- GPUs: every ``Processor`` with ``ProcessorType == "GPU"`` under ``/redfish/v1/Systems``. A GPU is keyed
  by the processor's ``UUID`` when the BMC exposes one, else by its Redfish ``Id`` (``GPU_0``), which
  will not match the DCGM UUID: such records carry ``extra["redfish_key"] = "id"``.

A resource that is absent (no link, or HTTP 404) is normal; one that fails (HTTP error, bad JSON,
wrong shape) becomes a ``problems`` entry naming its URL, and the walk goes on.
"""

from __future__ import annotations

import base64
import json
import math
import re
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

KWH_TO_J = 3.6e6
ROOT = "/redfish/v1"
# Redfish collections under /redfish/v1/PowerEquipment that hold power-distribution equipment.
EQUIPMENT_COLLECTIONS = ("RackPDUs", "FloorPDUs", "PowerShelves", "TransferSwitches", "ElectricalBuses")
SHELF_TYPES = {"PowerShelf", "Shelf"}


class RedfishError(Exception):
    """A Redfish request failed; the message names the URL and the problem."""

    def __init__(self, url: str, problem: str, *, status: int | None = None) -> None:
        super().__init__(f"{url}: {problem}")
        self.url = url
        self.problem = problem
        self.status = status


class RedfishClient:
    """A minimal Redfish GET client: basic auth, JSON objects only."""

    def __init__(
        self,
        base_url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 5,
        verify: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._origin = urlsplit(self.base_url)[:2]  # (scheme, host:port): where links may lead
        self.timeout = timeout
        self._headers = {"Accept": "application/json", "OData-Version": "4.0"}
        if username is not None:
            token = base64.b64encode(f"{username}:{password or ''}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._ssl = None
        if not verify:  # BMCs ship self-signed certificates; the operator opted out explicitly
            self._ssl = ssl.create_default_context()
            self._ssl.check_hostname = False
            self._ssl.verify_mode = ssl.CERT_NONE

    def url(self, path: str) -> str:
        """Absolute URL for an ``@odata.id`` path (or an absolute URL, returned as is); a path that
        cannot be joined (``http://[``) comes back as it is, for messages: `get` refuses it."""
        try:
            return urljoin(self.base_url + "/", path)
        except ValueError:
            return str(path)

    def get(self, path: str) -> dict[str, Any]:
        """GET one resource and decode it; every failure is a RedfishError naming the URL.

        Links are followed only on the BMC itself: a resource naming another host or a ``file:`` URL
        must not make the agent fetch it (urllib would read local files).
        """
        url = self.url(path)
        try:
            origin = urlsplit(url)[:2]
        except ValueError as exc:  # "http://[": an unterminated IPv6 host
            raise RedfishError(url[:200], f"bad URL: {exc}") from exc
        if origin != self._origin:
            raise RedfishError(url[:200], "link leaves the BMC (another scheme or host); not followed")
        try:
            request = urllib.request.Request(url, headers=self._headers)
        except ValueError as exc:
            raise RedfishError(url[:200], f"bad URL: {exc}") from exc
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._ssl) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise RedfishError(url, f"HTTP {exc.code} {exc.reason}", status=exc.code) from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise RedfishError(url, f"timed out after {self.timeout}s") from exc
            raise RedfishError(url, f"connection failed: {exc.reason}") from exc
        except TimeoutError as exc:  # a read timeout after the headers arrived is not wrapped
            raise RedfishError(url, f"timed out after {self.timeout}s") from exc
        except OSError as exc:
            raise RedfishError(url, f"connection failed: {exc}") from exc
        except ValueError as exc:  # http.client.InvalidURL: control characters or blanks in the link
            raise RedfishError(url[:200], f"bad URL: {exc}") from exc
        return _decode(url, body)

    def follow(self, resource: dict[str, Any], key: str) -> dict[str, Any] | None:
        """The resource linked from ``resource[key]``; None when there is no link."""
        target = link(resource.get(key))
        return None if target is None else self.get(target)


def _decode(url: str, body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RedfishError(url, f"bad JSON: {exc}") from exc
    except RecursionError as exc:  # the C scanner's own depth guard: safe to catch
        raise RedfishError(url, "bad JSON: nested too deeply") from exc
    if not isinstance(data, dict):
        raise RedfishError(url, f"bad JSON: expected an object, got {type(data).__name__}")
    return data


def link(value: Any) -> str | None:
    """The ``@odata.id`` of a link object, else None."""
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return value["@odata.id"]
    return None


@dataclass
class RedfishReading:
    """One walk of a BMC: ingest records plus what went wrong on the way."""

    power: list[dict] = field(default_factory=list)
    gpus: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _dict(value: Any) -> dict[str, Any]:
    """`value` if it is an object, else {}: a BMC that puts a list or a string where an object belongs
    gets the field read as absent, not the walk stopped."""
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    """A non-blank string, stripped; anything else None."""
    return value.strip() if isinstance(value, str) and value.strip() else None


def _key(name: Any) -> str:
    """A stable ``extra`` key from a sensor or device name."""
    return re.sub(r"[^0-9a-z]+", "_", str(name).lower()).strip("_") or "unnamed"


class _Walk:
    """State of one ``collect``: the client, records being built and problems found."""

    def __init__(self, client: RedfishClient, host: str) -> None:
        self.client = client
        self.host = host
        self.reading = RedfishReading()
        self.seen: set[str] = set()
        self.devices: dict[str, dict] = {}  # device name -> power record, merged across sources

    def problem(self, where: str, message: str) -> None:
        self.reading.problems.append(f"{where}: {message}")

    def get(self, path: str | None, what: str) -> dict[str, Any] | None:
        """Fetch ``path``; absent (None or 404) is None silently, any other failure is a problem."""
        if path is None:
            return None
        try:
            return self.client.get(path)
        except RedfishError as exc:
            if exc.status != 404:
                self.reading.problems.append(f"{what}: {exc}")
            return None

    def follow(self, resource: dict[str, Any], key: str, what: str) -> dict[str, Any] | None:
        return self.get(link(resource.get(key)), what)

    def members(self, collection: dict[str, Any] | None, what: str) -> list[dict[str, Any]]:
        """A collection's members; expanded members (more than a link) are used without a GET."""
        if collection is None:
            return []
        raw = collection.get("Members", [])
        if not isinstance(raw, list):
            self.problem(self.client.url(str(collection.get("@odata.id", what))), "Members is not a list")
            return []
        out = []
        for member in raw:
            if isinstance(member, dict) and len(set(member) - {"@odata.id"}) > 1:
                out.append(member)
            elif (got := self.get(link(member), what)) is not None:
                out.append(got)
        return out

    def number(self, value: Any, where: str) -> float | None:
        """A reading as float; a ``{"Reading": x}`` excerpt is unwrapped; junk is a problem."""
        if isinstance(value, dict):
            value = value.get("Reading")
        if value is None or isinstance(value, bool):
            return None
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if not math.isfinite(number):  # "1e999", NaN or an integer past float range: not a reading
            self.problem(where, f"not a number: {_shown(value)}")
            return None
        return number

    def record(self, device: str) -> dict:
        return self.devices.setdefault(device, {"device": device, "fields": {}, "extra": {}})


def _put(target: dict, name: str, value: float | None) -> None:
    """Set ``name`` unless already set: earlier (newer-model) sources win."""
    if value is not None and name not in target:
        target[name] = value


def collect(client: RedfishClient, *, host: str) -> RedfishReading:
    """Walk a BMC and return power, thermal and GPU records for ``host``."""
    walk = _Walk(client, host)
    root = walk.get(ROOT, "service root")
    if root is None:
        if not walk.reading.problems:
            walk.problem(client.url(ROOT), "no Redfish service root (HTTP 404)")
        return walk.reading
    node_records = []
    for chassis in walk.members(walk.follow(root, "Chassis", "chassis collection"), "chassis"):
        if _is_power_equipment(chassis):
            _power_chassis(walk, chassis)
        else:
            rec = _node_chassis(walk, chassis)
            if rec["fields"] or rec["extra"]:
                node_records.append(rec)
    _name_node_records(walk, node_records)
    _power_equipment(walk, root)
    for system in walk.members(walk.follow(root, "Systems", "systems collection"), "system"):
        _system_gpus(walk, system)
    walk.reading.power.extend(r for r in walk.devices.values() if r["fields"] or r["extra"])
    return walk.reading


def _name_node_records(walk: _Walk, records: list[dict]) -> None:
    for rec in records:
        name = walk.host if len(records) == 1 else f"{walk.host}/{rec.pop('_chassis_id')}"
        rec.pop("_chassis_id", None)
        walk.devices[name] = {"device": name, **rec}


def _is_power_equipment(chassis: dict[str, Any]) -> bool:
    """Power shelves and PDUs: by type, or by a link to their PowerDistribution resource."""
    links = _dict(chassis.get("Links"))
    kind = chassis.get("ChassisType")
    if kind == "PowerShelf" or link(links.get("PowerDistribution")):
        return True
    if links.get("ComputerSystems"):
        return False
    # "Shelf" is also a generic enclosure; a LiteOn power shelf has no computer systems. A Delta
    # shelf calls itself "RackMount": its Id/Name say PowerShelf and it has no systems either.
    name = f"{chassis.get('Id', '')} {chassis.get('Name', '')}".lower().replace("_", "").replace(" ", "")
    return (isinstance(kind, str) and kind in SHELF_TYPES) or "powershelf" in name


# --- node chassis ------------------------------------------------------------------------------


def _node_chassis(walk: _Walk, chassis: dict[str, Any]) -> dict:
    cid = str(chassis.get("Id", "chassis"))
    fields: dict[str, float] = {}
    extra: dict[str, Any] = {}
    _environment(walk, chassis, fields, extra)
    _power_subsystem(walk, chassis, fields, extra)
    _thermal_subsystem(walk, chassis, fields, extra)
    _legacy_power(walk, chassis, fields, extra)
    _legacy_thermal(walk, chassis, fields, extra)
    return {"_chassis_id": cid, "fields": fields, "extra": extra}


def _environment(walk: _Walk, owner: dict[str, Any], fields: dict, extra: dict) -> None:
    env = walk.follow(owner, "EnvironmentMetrics", "EnvironmentMetrics")
    if env is None:
        return
    where = walk.client.url(str(env.get("@odata.id", "EnvironmentMetrics")))
    _put(fields, "watts", walk.number(env.get("PowerWatts"), where))
    kwh = walk.number(env.get("EnergykWh"), where)
    _put(fields, "energy_j", None if kwh is None else kwh * KWH_TO_J)
    _put(extra, "temperature_c", walk.number(env.get("TemperatureCelsius"), where))


def _power_subsystem(walk: _Walk, chassis: dict[str, Any], fields: dict, extra: dict) -> None:
    subsystem = walk.follow(chassis, "PowerSubsystem", "PowerSubsystem")
    if subsystem is None:
        return
    supplies = walk.members(walk.follow(subsystem, "PowerSupplies", "PowerSupplies"), "power supply")
    watts, energy = [], []
    for psu in supplies:
        metrics = walk.follow(psu, "Metrics", "PowerSupplyMetrics") or {}
        where = walk.client.url(str(metrics.get("@odata.id", psu.get("@odata.id", "power supply"))))
        name = f"psu_{_key(psu.get('Id', len(watts)))}"
        w = walk.number(metrics.get("InputPowerWatts"), where)
        kwh = walk.number(metrics.get("EnergykWh"), where)
        _put(extra, f"{name}_input_watts", w)
        _put(extra, f"{name}_output_watts", walk.number(metrics.get("OutputPowerWatts"), where))
        _put(extra, f"{name}_energy_kwh", kwh)
        watts += [w] if w is not None else []
        energy += [kwh] if kwh is not None else []
    # Chassis-level readings win; the supplies' sum is the fallback (both are input-side figures).
    _put(fields, "watts", sum(watts) if watts else None)
    _put(fields, "energy_j", sum(energy) * KWH_TO_J if energy else None)


def _thermal_subsystem(walk: _Walk, chassis: dict[str, Any], fields: dict, extra: dict) -> None:
    subsystem = walk.follow(chassis, "ThermalSubsystem", "ThermalSubsystem")
    if subsystem is None:
        return
    metrics = walk.follow(subsystem, "ThermalMetrics", "ThermalMetrics")
    if metrics is not None:
        where = walk.client.url(str(metrics.get("@odata.id", "ThermalMetrics")))
        summary = _dict(metrics.get("TemperatureSummaryCelsius"))
        _put(fields, "inlet_temp", walk.number(summary.get("Intake"), where))
        _put(fields, "outlet_temp", walk.number(summary.get("Exhaust"), where))
        readings = metrics.get("TemperatureReadingsCelsius") or []
        for item in [r for r in readings if isinstance(r, dict)] if isinstance(readings, list) else []:
            context = item.get("PhysicalContext") or item.get("DeviceName")
            _temperature(walk, fields, extra, context, item.get("DeviceName"), item.get("Reading"), where)
    _coolant(walk, subsystem, fields)
    _leaks(walk, subsystem, extra)


def _temperature(walk: _Walk, fields: dict, extra: dict, context: Any, name: Any, value: Any, where: str) -> None:
    """Intake and exhaust go to the registry's fields; every other temperature to ``extra``."""
    reading = walk.number(value, where)
    target = {"Intake": "inlet_temp", "Exhaust": "outlet_temp"}.get(str(context))
    if target:
        _put(fields, target, reading)
    _put(extra, f"temp_{_key(name or context)}", reading)


def _coolant(walk: _Walk, subsystem: dict[str, Any], fields: dict) -> None:
    connectors = walk.members(walk.follow(subsystem, "CoolantConnectors", "CoolantConnectors"), "coolant connector")
    for connector in connectors:
        where = walk.client.url(str(connector.get("@odata.id", "CoolantConnector")))
        _put(fields, "coolant_supply_temp", walk.number(connector.get("SupplyTemperatureCelsius"), where))
        _put(fields, "coolant_return_temp", walk.number(connector.get("ReturnTemperatureCelsius"), where))
        _put(fields, "flow_lpm", walk.number(connector.get("FlowLitersPerMinute"), where))


def _leaks(walk: _Walk, subsystem: dict[str, Any], extra: dict) -> None:
    detection = walk.follow(subsystem, "LeakDetection", "LeakDetection")
    if detection is None:
        return
    detectors = walk.members(walk.follow(detection, "LeakDetectors", "LeakDetectors"), "leak detector")
    states = {"OK": 0, "Warning": 1, "Critical": 2}
    for detector in detectors:
        state = detector.get("DetectorState")
        if isinstance(state, str) and state in states:
            extra[f"leak_{_key(detector.get('Id', 'detector'))}"] = states[state]
    if detectors:
        extra["leaks_detected"] = sum(1 for d in detectors if d.get("DetectorState") in ("Warning", "Critical"))


def _list(walk: _Walk, resource: dict[str, Any], key: str, where: str) -> list[dict]:
    value = resource.get(key) or []
    if not isinstance(value, list):
        walk.problem(where, f"{key} is not a list")
        return []
    return [item for item in value if isinstance(item, dict)]


def _legacy_power(walk: _Walk, chassis: dict[str, Any], fields: dict, extra: dict) -> None:
    power = walk.follow(chassis, "Power", "Power")
    if power is None:
        return
    where = walk.client.url(str(power.get("@odata.id", "Power")))
    for control in _list(walk, power, "PowerControl", where)[:1]:  # [0] is the whole system by convention
        _put(fields, "watts", walk.number(control.get("PowerConsumedWatts"), where))
        metrics = _dict(control.get("PowerMetrics"))
        for src, dst in (("AverageConsumedWatts", "avg"), ("MinConsumedWatts", "min"), ("MaxConsumedWatts", "max")):
            _put(extra, f"power_{dst}_watts", walk.number(metrics.get(src), where))
        _put(extra, "power_interval_min", walk.number(metrics.get("IntervalInMin"), where))
    for i, psu in enumerate(_list(walk, power, "PowerSupplies", where)):
        name = f"psu_{_key(psu.get('MemberId', i))}"
        _put(extra, f"{name}_input_watts", walk.number(psu.get("PowerInputWatts"), where))
        output = psu.get("PowerOutputWatts", psu.get("LastPowerOutputWatts"))
        _put(extra, f"{name}_output_watts", walk.number(output, where))
        _put(extra, f"{name}_line_input_volts", walk.number(psu.get("LineInputVoltage"), where))


def _legacy_thermal(walk: _Walk, chassis: dict[str, Any], fields: dict, extra: dict) -> None:
    thermal = walk.follow(chassis, "Thermal", "Thermal")
    if thermal is None:
        return
    where = walk.client.url(str(thermal.get("@odata.id", "Thermal")))
    for t in _list(walk, thermal, "Temperatures", where):
        _temperature(walk, fields, extra, t.get("PhysicalContext"), t.get("Name"), t.get("ReadingCelsius"), where)
    for fan in _list(walk, thermal, "Fans", where):
        # Older iLO firmware names the reading CurrentReading and the fan FanName.
        value = fan.get("Reading", fan.get("CurrentReading"))
        unit = _key(fan.get("ReadingUnits") or ("RPM" if "CurrentReading" not in fan else "percent"))
        _put(extra, f"fan_{_key(fan.get('Name') or fan.get('FanName'))}_{unit}", walk.number(value, where))


# --- power shelves and PDUs ------------------------------------------------------------------------


def _power_chassis(walk: _Walk, chassis: dict[str, Any]) -> None:
    rec = walk.record(f"{walk.host}/{chassis.get('Id', 'shelf')}")
    _environment(walk, chassis, rec["fields"], rec["extra"])
    _shelf_sensors(walk, chassis, rec)
    _power_subsystem(walk, chassis, rec["fields"], rec["extra"])


def _shelf_sensors(walk: _Walk, chassis: dict[str, Any], rec: dict) -> None:
    """Expanded sensors only (a GET per sensor would be dozens of requests per poll)."""
    sensors = walk.follow(chassis, "Sensors", "Sensors")
    members = _dict(sensors).get("Members") or []
    where = walk.client.url(str((sensors or {}).get("@odata.id", "Sensors")))
    for sensor in members if isinstance(members, list) else []:
        if not isinstance(sensor, dict) or "Reading" not in sensor:
            continue
        sid = _key(sensor.get("Id", "sensor"))
        value = walk.number(sensor.get("Reading"), where)
        _put(rec["extra"], f"sensor_{sid}", value)
        if sensor.get("ReadingType") == "Power" and sid in ("chassis_input_power", "total_input_power",
                                                             "total_power_in"):
            _put(rec["fields"], "watts", value)


def _power_equipment(walk: _Walk, root: dict[str, Any]) -> None:
    tree = walk.follow(root, "PowerEquipment", "PowerEquipment")
    if tree is None:
        return
    for name in EQUIPMENT_COLLECTIONS:
        for item in walk.members(walk.follow(tree, name, name), name):
            _equipment(walk, item)


def _equipment(walk: _Walk, item: dict[str, Any]) -> None:
    chassis = _dict(item.get("Links")).get("Chassis")
    first = link(chassis[0]) if isinstance(chassis, list) and chassis else None
    cid = first.rstrip("/").rsplit("/", 1)[-1] if first else None
    device = f"{walk.host}/{cid or item.get('Id', 'equipment')}"
    rec = walk.record(device)
    _meter(walk, walk.follow(item, "Metrics", "PowerDistributionMetrics"), rec)
    for outlet in walk.members(walk.follow(item, "Outlets", "Outlets"), "outlet"):
        _meter(walk, outlet, walk.record(f"{device}/{outlet.get('Id', 'outlet')}"))


def _meter(walk: _Walk, resource: dict[str, Any] | None, rec: dict) -> None:
    if resource is None:
        return
    where = walk.client.url(str(resource.get("@odata.id", rec["device"])))
    _put(rec["fields"], "watts", walk.number(resource.get("PowerWatts"), where))
    kwh = walk.number(resource.get("EnergykWh"), where)
    _put(rec["fields"], "energy_j", None if kwh is None else kwh * KWH_TO_J)


# --- GPUs ----------------------------------------------------------------------------------------


def _system_gpus(walk: _Walk, system: dict[str, Any]) -> None:
    for proc in walk.members(walk.follow(system, "Processors", "Processors"), "processor"):
        pid = proc.get("@odata.id")
        # GB300 BMCs list the same GPU under two systems; one record per processor resource.
        if proc.get("ProcessorType") != "GPU" or (isinstance(pid, str) and pid in walk.seen):
            continue
        if isinstance(pid, str):
            walk.seen.add(pid)
        walk.reading.gpus.append(_gpu(walk, proc))


def _gpu(walk: _Walk, proc: dict[str, Any]) -> dict:
    uuid = _text(proc.get("UUID"))
    record: dict[str, Any] = {"host": walk.host, "uuid": uuid or _text(proc.get("Id")) or str(proc.get("@odata.id")),
                              "fields": {}, "extra": {}}
    if _text(proc.get("Model")):
        record["model"] = proc["Model"].strip()
    if _text(proc.get("SerialNumber")):
        record["serial"] = proc["SerialNumber"].strip()
    if not uuid:
        record["extra"]["redfish_key"] = "id"
    fields, extra = record["fields"], record["extra"]
    env = walk.follow(proc, "EnvironmentMetrics", "GPU EnvironmentMetrics")
    if env is not None:
        where = walk.client.url(str(env.get("@odata.id", "EnvironmentMetrics")))
        _put(fields, "power_w", walk.number(env.get("PowerWatts"), where))
        _put(fields, "gpu_temp", walk.number(env.get("TemperatureCelsius"), where))
        kwh = walk.number(env.get("EnergykWh"), where)
        _put(extra, "redfish_energy_j", None if kwh is None else kwh * KWH_TO_J)
    metrics = walk.follow(proc, "Metrics", "ProcessorMetrics")
    if metrics is not None:
        _gpu_metrics(walk, metrics, fields, extra)
    return record


def _gpu_metrics(walk: _Walk, metrics: dict[str, Any], fields: dict, extra: dict) -> None:
    where = walk.client.url(str(metrics.get("@odata.id", "ProcessorMetrics")))
    _put(fields, "sm_clock", walk.number(metrics.get("OperatingSpeedMHz"), where))
    _put(fields, "power_w", walk.number(metrics.get("ConsumedPowerWatt"), where))
    _put(fields, "gpu_temp", walk.number(metrics.get("TemperatureCelsius"), where))
    pcie = _dict(metrics.get("PCIeErrors"))
    _put(fields, "pcie_replay", walk.number(pcie.get("ReplayCount"), where))
    for name, value in pcie.items():
        _put(extra, f"redfish_pcie_{_key(name)}", walk.number(value, where))
    # Cache (SRAM) ECC is not the DRAM ECC that DCGM's ecc_* fields count, so it stays in extra.
    lifetime = _dict(_dict(metrics.get("CacheMetricsTotal")).get("LifeTime"))
    for name, value in lifetime.items():
        _put(extra, f"redfish_cache_{_key(name)}_lifetime", walk.number(value, where))
