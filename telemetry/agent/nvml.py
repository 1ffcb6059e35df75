"""GPU telemetry through NVML (the `pynvml` module of nvidia-ml-py), mapped onto the field
registry in `telemetry.fields`.

The module object is passed in (default: `import pynvml`), which is where the tests put their
fake: every NVML call the collector makes goes through that one boundary. NVML answers
`NVMLError_NotSupported` for whatever a GPU or driver lacks (NVLink on a single-GPU VM, memory
temperature on consumer boards…); that is a missing value, counted, never a zero. Any other NVML
error is recorded as a problem for that GPU and the rest of its fields are still read.

Units converted here: power mW → W, memory bytes → MiB, PCIe throughput KB/s → B/s. Energy stays
in mJ and counters stay raw, as the store expects.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

MIB = 1024 * 1024
NVLINK_MAX_LINKS = 18
# nvmlNvLinkErrorCounter_t -> registry field.
NVLINK_COUNTERS = {0: "nvlink_replay_errors", 1: "nvlink_recovery_errors", 2: "nvlink_crc_flit_errors",
                   3: "nvlink_crc_data_errors"}
FI_DEV_MEMORY_TEMP = 82  # NVML field id: HBM temperature, only reachable through nvmlDeviceGetFieldValues


@dataclass
class NvmlReading:
    """One collection pass: ingest records plus what could not be read."""

    gpus: list[dict] = field(default_factory=list)
    migs: list[dict] = field(default_factory=list)
    not_supported: int = 0
    problems: list[str] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)  # indexes of GPUs that fell off the bus


def load_nvml() -> ModuleType:
    """The real pynvml, initialised."""
    nvml = importlib.import_module("pynvml")
    nvml.nvmlInit()
    return nvml


class _Reader:
    """Reads one device's values, turning NotSupported into 'missing' and errors into problems."""

    def __init__(self, nvml: ModuleType, reading: NvmlReading, label: str):
        self.nvml, self.reading, self.label = nvml, reading, label
        self.lost = False

    def get(self, fn, *args):
        try:
            value = fn(*args)
        except self.nvml.NVMLError as exc:
            if isinstance(exc, getattr(self.nvml, "NVMLError_GpuIsLost", ())):
                self.lost = True  # fallen off the bus: every further call fails the same way
            elif isinstance(exc, self.nvml.NVMLError_NotSupported):
                self.reading.not_supported += 1
            else:
                self.reading.problems.append(f"{self.label}: {fn.__name__}: {exc}")
            return None
        return value.decode() if isinstance(value, bytes) else value


def collect(nvml: ModuleType, *, host: str) -> NvmlReading:
    """Read every GPU (and MIG instance) once."""
    reading = NvmlReading()
    driver = _Reader(nvml, reading, "system").get(nvml.nvmlSystemGetDriverVersion)
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        r = _Reader(nvml, reading, f"GPU {index}")
        uuid = r.get(nvml.nvmlDeviceGetUUID, handle)
        if r.lost:
            reading.lost.append(index)
            continue
        if not uuid:
            reading.problems.append(f"GPU {index}: no UUID; skipped")
            continue
        record = {"host": host, "uuid": uuid, "index": index, "fields": _fields(nvml, r, handle)}
        for key, fn in (("model", nvml.nvmlDeviceGetName), ("serial", nvml.nvmlDeviceGetSerial)):
            value = r.get(fn, handle)
            if value:
                record[key] = value
        pci = r.get(nvml.nvmlDeviceGetPciInfo, handle)
        if pci is not None:
            record["pci_bus_id"] = _text(pci.busId)
        if driver:
            record["driver"] = driver
        reading.gpus.append(record)
        reading.migs.extend(_migs(nvml, r, handle, host, uuid))
    return reading


def _fields(nvml: ModuleType, r: _Reader, h) -> dict:
    out: dict = {}
    util = r.get(nvml.nvmlDeviceGetUtilizationRates, h)
    if util is not None:
        out["gpu_util"], out["mem_copy_util"] = util.gpu, util.memory
    for name, fn in (("enc_util", nvml.nvmlDeviceGetEncoderUtilization),
                     ("dec_util", nvml.nvmlDeviceGetDecoderUtilization)):
        value = r.get(fn, h)
        if value is not None:
            out[name] = value[0]
    out["sm_clock"] = r.get(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
    out["mem_clock"] = r.get(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)
    mem = r.get(nvml.nvmlDeviceGetMemoryInfo, h)
    if mem is not None:
        out["fb_used"], out["fb_free"] = mem.used / MIB, mem.free / MIB
    out["gpu_temp"] = r.get(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
    out["memory_temp"] = _field_value(nvml, r, h, FI_DEV_MEMORY_TEMP)
    out.update(_power(nvml, r, h))
    out.update(_errors(nvml, r, h))
    out.update(_nvlink(nvml, r, h))
    return {k: v for k, v in out.items() if v is not None}


def _power(nvml: ModuleType, r: _Reader, h) -> dict:
    power = r.get(nvml.nvmlDeviceGetPowerUsage, h)
    limit = r.get(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    tx = r.get(nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_TX_BYTES)
    rx = r.get(nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_RX_BYTES)
    return {
        "power_w": None if power is None else power / 1000,
        "power_limit_w": None if limit is None else limit / 1000,
        "energy_mj": r.get(nvml.nvmlDeviceGetTotalEnergyConsumption, h),
        "pcie_tx_bps": None if tx is None else tx * 1024,
        "pcie_rx_bps": None if rx is None else rx * 1024,
        "pcie_replay": r.get(nvml.nvmlDeviceGetPcieReplayCounter, h),
        "throttle_reasons": r.get(_throttle_fn(nvml), h),
    }


def _throttle_fn(nvml: ModuleType):
    # Renamed "clocks event reasons" in recent drivers; older bindings only have the old name.
    renamed = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    return renamed or nvml.nvmlDeviceGetCurrentClocksThrottleReasons


def _errors(nvml: ModuleType, r: _Reader, h) -> dict:
    ecc = nvml.nvmlDeviceGetTotalEccErrors
    out = {
        "ecc_sbe_vol": r.get(ecc, h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC),
        "ecc_dbe_vol": r.get(ecc, h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
        "ecc_sbe_agg": r.get(ecc, h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_AGGREGATE_ECC),
        "ecc_dbe_agg": r.get(ecc, h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC),
    }
    rows = r.get(nvml.nvmlDeviceGetRemappedRows, h)
    if rows is not None:  # (correctable, uncorrectable, pending, failure)
        out["remapped_rows_correctable"], out["remapped_rows_uncorrectable"] = int(rows[0]), int(rows[1])
        out["row_remap_pending"], out["row_remap_failure"] = int(bool(rows[2])), int(bool(rows[3]))
    return out


def _nvlink(nvml: ModuleType, r: _Reader, h) -> dict:
    """Error counters summed over the links that are up; a GPU without NVLink adds nothing."""
    totals: dict[str, int] = {}
    for link in range(NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except nvml.NVMLError:
            # Not supported / invalid argument past the last link: no (more) links to read.
            break
        for counter, name in NVLINK_COUNTERS.items():
            value = r.get(nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            if value is not None:
                totals[name] = totals.get(name, 0) + int(value)
    return totals


def _field_value(nvml: ModuleType, r: _Reader, h, field_id: int):
    values = r.get(nvml.nvmlDeviceGetFieldValues, h, [field_id])
    if not values or values[0].nvmlReturn != nvml.NVML_SUCCESS:
        return None
    return values[0].value.uiVal


def _migs(nvml: ModuleType, r: _Reader, handle, host: str, gpu_uuid: str) -> list[dict]:
    mode = r.get(nvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    out = []
    for i in range(r.get(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError:
            continue  # an empty slot
        mr = _Reader(nvml, r.reading, f"{r.label} MIG {i}")
        mem = mr.get(nvml.nvmlDeviceGetMemoryInfo, mig)
        fields = {} if mem is None else {"fb_used": mem.used / MIB, "fb_free": mem.free / MIB}
        out.append({
            "host": host, "gpu_uuid": gpu_uuid, "gi_id": mr.get(nvml.nvmlDeviceGetGpuInstanceId, mig),
            "ci_id": mr.get(nvml.nvmlDeviceGetComputeInstanceId, mig), "fields": fields,
        })
    return [m for m in out if m["gi_id"] is not None]


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class XidWatcher:
    """NVML's XID events through an event set (what dcgm-exporter's last-value gauge loses)."""

    def __init__(self, nvml: ModuleType):
        self.nvml = nvml
        self.event_set = nvml.nvmlEventSetCreate()
        for index in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, self.event_set)

    def poll(self, timeout_ms: int = 0) -> list[dict]:
        """Every XID event waiting now (or within timeout_ms for the first)."""
        events = []
        while True:
            try:
                data = self.nvml.nvmlEventSetWait(self.event_set, timeout_ms)
            except self.nvml.NVMLError_Timeout:
                return events
            # The event's device is a fresh handle object: ask it for its UUID.
            events.append({"gpu_uuid": _text(self.nvml.nvmlDeviceGetUUID(data.device)), "xid": int(data.eventData)})
            timeout_ms = 0
