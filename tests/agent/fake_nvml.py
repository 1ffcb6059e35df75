"""A fake `pynvml` module, shaped from real NVML behaviour (tests/fixtures/device/nvidia-h200/nvml.json
was read from a real H200): same function names and argument order, values in NVML's units (mW,
bytes, mJ), `NVMLError_NotSupported` where real hardware answers it, event sets for XIDs."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "device" / "nvidia-h200" / "nvml.json"


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - pynvml's own name
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801
    pass


class NVMLError_Unknown(NVMLError):  # noqa: N801
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


@dataclass
class FakeGpu:
    """One device's readings in NVML units; None means the call raises NotSupported."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1650000000000"
    bus_id: str = "00000000:18:00.0"
    temp: int | None = 40
    memory_temp: int | None = 45
    power_mw: int | None = 120_000
    limit_mw: int | None = 700_000
    energy_mj: int | None = 1_000_000
    util: tuple[int, int] = (0, 0)
    mem: tuple[int, int, int] = (80 * 2**30, 0, 80 * 2**30)  # total, used, free
    clocks: tuple[int, int] = (345, 2619)  # SM, memory
    throttle: int = 1
    ecc: dict = field(default_factory=dict)  # (type, counter) -> value
    remapped: tuple | None = (0, 0, 0, 0)
    pcie_replay: int = 0
    nvlinks: list[dict] | None = None  # one dict of counter -> value per link; None = not supported
    mig: list[tuple[int, int, int]] | None = None  # (gi, ci, used bytes) when MIG is on
    broken: set[str] = field(default_factory=set)  # function names that raise NVMLError_Unknown
    lost: bool = False  # fallen off the bus: every call raises NVMLError_GpuIsLost


def h200_from_capture() -> FakeGpu:
    """The real H200's readings as captured on the lent machine."""
    g = json.loads(FIXTURE.read_text())["gpus"][0]
    return FakeGpu(
        uuid=g["uuid"], name=g["name"], serial=g["serial"], bus_id=g["pci_bus_id"], temp=g["gpu_temp"],
        power_mw=g["power_mw"], limit_mw=g["limit_mw"], energy_mj=g["energy_mj"],
        util=(g["util"]["gpu"], g["util"]["memory"]), mem=(g["mem"]["total"], g["mem"]["used"], g["mem"]["free"]),
        clocks=(g["sm_clock"], g["mem_clock"]), throttle=g["throttle"], remapped=tuple(g["remapped_rows"]),
        pcie_replay=g["pcie_replay"], nvlinks=None,
    )


def make_nvml(gpus: list[FakeGpu], driver: str = "580.159.04"):
    """A module-like namespace with the pynvml API over `gpus`."""
    events: deque = deque()
    ns = SimpleNamespace(
        NVMLError=NVMLError, NVMLError_NotSupported=NVMLError_NotSupported, NVMLError_Timeout=NVMLError_Timeout,
        NVMLError_GpuIsLost=NVMLError_GpuIsLost,
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0, NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1, NVML_MEMORY_ERROR_TYPE_CORRECTED=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0, NVML_AGGREGATE_ECC=1, NVML_FEATURE_ENABLED=1, NVML_SUCCESS=0,
        NVML_DEVICE_MIG_ENABLE=1, nvmlEventTypeXidCriticalError=8, events=events,
    )

    def api(fn):
        def wrapper(h, *args):
            if getattr(h, "lost", False):
                raise NVMLError_GpuIsLost("GPU is lost")
            if fn.__name__ in h.broken:
                raise NVMLError_Unknown("Unknown Error")
            return fn(h, *args)
        wrapper.__name__ = fn.__name__
        setattr(ns, fn.__name__, wrapper)
        return fn

    def need(value):
        if value is None:
            raise NVMLError_NotSupported("Not Supported")
        return value

    ns.nvmlSystemGetDriverVersion = lambda: driver
    ns.nvmlDeviceGetCount = lambda: len(gpus)
    ns.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]

    @api
    def nvmlDeviceGetUUID(h): return h.uuid  # noqa: E704,N802
    @api
    def nvmlDeviceGetName(h): return h.name  # noqa: E704,N802
    @api
    def nvmlDeviceGetSerial(h): return h.serial  # noqa: E704,N802
    @api
    def nvmlDeviceGetPciInfo(h): return SimpleNamespace(busId=h.bus_id.encode())  # noqa: E704,N802
    @api
    def nvmlDeviceGetTemperature(h, sensor): return need(h.temp)  # noqa: E704,N802
    @api
    def nvmlDeviceGetPowerUsage(h): return need(h.power_mw)  # noqa: E704,N802
    @api
    def nvmlDeviceGetEnforcedPowerLimit(h): return need(h.limit_mw)  # noqa: E704,N802
    @api
    def nvmlDeviceGetTotalEnergyConsumption(h): return need(h.energy_mj)  # noqa: E704,N802
    @api
    def nvmlDeviceGetUtilizationRates(h): return SimpleNamespace(gpu=h.util[0], memory=h.util[1])  # noqa: E704,N802
    @api
    def nvmlDeviceGetEncoderUtilization(h): return [0, 167000]  # noqa: E704,N802
    @api
    def nvmlDeviceGetDecoderUtilization(h): return [0, 167000]  # noqa: E704,N802
    @api
    def nvmlDeviceGetClockInfo(h, kind): return h.clocks[0 if kind == 1 else 1]  # noqa: E704,N802
    @api
    def nvmlDeviceGetMemoryInfo(h):  # noqa: N802
        return SimpleNamespace(total=h.mem[0], used=h.mem[1], free=h.mem[2])
    @api
    def nvmlDeviceGetCurrentClocksEventReasons(h): return h.throttle  # noqa: E704,N802
    @api
    def nvmlDeviceGetTotalEccErrors(h, kind, counter): return h.ecc.get((kind, counter), 0)  # noqa: E704,N802
    @api
    def nvmlDeviceGetRemappedRows(h): return need(h.remapped)  # noqa: E704,N802
    @api
    def nvmlDeviceGetPcieReplayCounter(h): return h.pcie_replay  # noqa: E704,N802
    @api
    def nvmlDeviceGetPcieThroughput(h, counter): return 1000 if counter == 0 else 2000  # noqa: E704,N802

    @api
    def nvmlDeviceGetNvLinkState(h, link):  # noqa: N802
        if h.nvlinks is None:
            raise NVMLError_NotSupported("Not Supported")
        if link >= len(h.nvlinks):
            raise NVMLError("Invalid Argument")
        return 1

    @api
    def nvmlDeviceGetNvLinkErrorCounter(h, link, counter): return h.nvlinks[link].get(counter, 0)  # noqa: E704,N802

    @api
    def nvmlDeviceGetFieldValues(h, ids):  # noqa: N802
        ok = h.memory_temp is not None
        return [SimpleNamespace(nvmlReturn=0 if ok else 3, value=SimpleNamespace(uiVal=h.memory_temp))]

    @api
    def nvmlDeviceGetMigMode(h): return [1, 1] if h.mig is not None else [0, 0]  # noqa: E704,N802
    @api
    def nvmlDeviceGetMaxMigDeviceCount(h): return 7  # noqa: E704,N802

    def nvmlDeviceGetMigDeviceHandleByIndex(h, i):  # noqa: N802
        if h.mig is None or i >= len(h.mig):
            raise NVMLError("Not Found")
        gi, ci, used = h.mig[i]
        return SimpleNamespace(gi=gi, ci=ci, used=used, broken=set())

    ns.nvmlDeviceGetMigDeviceHandleByIndex = nvmlDeviceGetMigDeviceHandleByIndex
    ns.nvmlDeviceGetGpuInstanceId = lambda m: m.gi
    ns.nvmlDeviceGetComputeInstanceId = lambda m: m.ci
    real_mem = ns.nvmlDeviceGetMemoryInfo

    def mem_info(h):
        if isinstance(h, SimpleNamespace):
            return SimpleNamespace(total=10 * 2**30, used=h.used, free=10 * 2**30 - h.used)
        return real_mem(h)

    ns.nvmlDeviceGetMemoryInfo = mem_info
    ns.nvmlEventSetCreate = lambda: "event-set"
    ns.nvmlDeviceRegisterEvents = lambda h, mask, es: None

    def wait(es, timeout_ms):
        if not events:
            raise NVMLError_Timeout("Timeout")
        return events.popleft()

    ns.nvmlEventSetWait = wait
    ns.nvmlDeviceGetMigMode.__name__ = "nvmlDeviceGetMigMode"
    return ns
