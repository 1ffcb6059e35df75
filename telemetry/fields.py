"""The one registry of stored telemetry fields.

Every wide hypertable column, its unit, how it rolls up and which source names map onto it is
declared here once. Migrations, the ingest validator, the Prometheus/DCGM mapper, the rollup task
and the series selector all read this module, so adding a field is a one-line change plus a
migration.

Kinds decide the rollup:
- ``gauge``: min / avg / max / last per bucket.
- ``counter``: monotonically increasing raw counter; rollups keep the delta over the bucket
  (a drop is a reset: the new value counts from zero) and the last raw value.
- ``state``: an enumerated or bitmask value (throttle reasons, last XID): bit_or and last.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GAUGE = "gauge"
COUNTER = "counter"
STATE = "state"


@dataclass(frozen=True, slots=True)
class Field:
    """One column of a wide sample table."""

    name: str
    sql_type: str  # "real" for gauges, "bigint" for counters and states, "double precision" for big floats
    kind: str
    unit: str
    help: str
    sources: tuple[str, ...] = field(default=())  # DCGM / exporter names that map onto this column

    @property
    def is_int(self) -> bool:
        return self.sql_type == "bigint"


def _g(name, unit, help, *sources, sql_type="real"):
    return Field(name, sql_type, GAUGE, unit, help, tuple(sources))


def _c(name, unit, help, *sources, sql_type="bigint"):
    return Field(name, sql_type, COUNTER, unit, help, tuple(sources))


def _s(name, unit, help, *sources):
    return Field(name, "bigint", STATE, unit, help, tuple(sources))


GPU_FIELDS: tuple[Field, ...] = (
    _g("gpu_util", "%", "GPU utilization", "DCGM_FI_DEV_GPU_UTIL"),
    _g("mem_copy_util", "%", "Memory copy utilization", "DCGM_FI_DEV_MEM_COPY_UTIL"),
    _g("enc_util", "%", "Encoder utilization", "DCGM_FI_DEV_ENC_UTIL"),
    _g("dec_util", "%", "Decoder utilization", "DCGM_FI_DEV_DEC_UTIL"),
    _g("sm_clock", "MHz", "SM clock", "DCGM_FI_DEV_SM_CLOCK"),
    _g("mem_clock", "MHz", "Memory clock", "DCGM_FI_DEV_MEM_CLOCK"),
    _g("fb_used", "MiB", "Framebuffer used", "DCGM_FI_DEV_FB_USED"),
    _g("fb_free", "MiB", "Framebuffer free", "DCGM_FI_DEV_FB_FREE"),
    _g("fb_reserved", "MiB", "Framebuffer reserved", "DCGM_FI_DEV_FB_RESERVED"),
    _g("gpu_temp", "°C", "GPU temperature", "DCGM_FI_DEV_GPU_TEMP"),
    _g("memory_temp", "°C", "Memory (HBM) temperature", "DCGM_FI_DEV_MEMORY_TEMP"),
    _g("power_w", "W", "Power draw", "DCGM_FI_DEV_POWER_USAGE"),
    _g(
        "power_limit_w", "W", "Enforced power limit",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    ),
    _c("energy_mj", "mJ", "Energy since boot", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
    _c("ecc_sbe_vol", "errors", "ECC single-bit, volatile", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    _c("ecc_dbe_vol", "errors", "ECC double-bit, volatile", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    _c("ecc_sbe_agg", "errors", "ECC single-bit, aggregate", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    _c("ecc_dbe_agg", "errors", "ECC double-bit, aggregate", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    _s("xid", "code", "Last XID error", "DCGM_FI_DEV_XID_ERRORS"),
    _c(
        "nvlink_crc_flit_errors", "errors", "NVLink flow-control CRC errors",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    ),
    _c(
        "nvlink_crc_data_errors", "errors", "NVLink data CRC errors",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    ),
    _c(
        "nvlink_replay_errors", "errors", "NVLink replays",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    ),
    _c(
        "nvlink_recovery_errors", "errors", "NVLink recoveries",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    ),
    _c(
        "nvlink_bandwidth", "counts", "NVLink bandwidth counter, all lanes",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    ),
    _g("nvlink_tx_bps", "B/s", "NVLink transmit rate", "DCGM_FI_PROF_NVLINK_TX_BYTES"),
    _g("nvlink_rx_bps", "B/s", "NVLink receive rate", "DCGM_FI_PROF_NVLINK_RX_BYTES"),
    _c("pcie_replay", "retries", "PCIe replays", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    _g("pcie_tx_bps", "B/s", "PCIe transmit rate", "DCGM_FI_PROF_PCIE_TX_BYTES"),
    _g("pcie_rx_bps", "B/s", "PCIe receive rate", "DCGM_FI_PROF_PCIE_RX_BYTES"),
    _s(
        "throttle_reasons", "bitmask", "Clock throttle / clock-event reasons",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    ),
    _c("retired_sbe", "pages", "Pages retired for SBE", "DCGM_FI_DEV_RETIRED_SBE"),
    _c("retired_dbe", "pages", "Pages retired for DBE", "DCGM_FI_DEV_RETIRED_DBE"),
    _s("retired_pending", "flag", "Page retirement pending", "DCGM_FI_DEV_RETIRED_PENDING"),
    _c(
        "remapped_rows_correctable", "rows", "Rows remapped for correctable errors",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    ),
    _c(
        "remapped_rows_uncorrectable", "rows", "Rows remapped for uncorrectable errors",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    ),
    _s("row_remap_failure", "flag", "Row remapping failed", "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    _s("row_remap_pending", "flag", "Row remap pending a reset", "DCGM_FI_DEV_ROW_REMAP_PENDING"),
    _g("gr_engine_active", "ratio", "Graphics engine active", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    _g("sm_active", "ratio", "SM active", "DCGM_FI_PROF_SM_ACTIVE"),
    _g("sm_occupancy", "ratio", "SM occupancy", "DCGM_FI_PROF_SM_OCCUPANCY"),
    _g("tensor_active", "ratio", "Tensor pipe active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    _g("dram_active", "ratio", "DRAM active", "DCGM_FI_PROF_DRAM_ACTIVE"),
    _g("fp64_active", "ratio", "FP64 pipe active", "DCGM_FI_PROF_PIPE_FP64_ACTIVE"),
    _g("fp32_active", "ratio", "FP32 pipe active", "DCGM_FI_PROF_PIPE_FP32_ACTIVE"),
    _g("fp16_active", "ratio", "FP16 pipe active", "DCGM_FI_PROF_PIPE_FP16_ACTIVE"),
)

# A MIG GPU instance reports the profiling and memory fields of its slice; the rest of the
# physical GPU's fields stay on the whole-GPU row.
MIG_FIELDS: tuple[Field, ...] = tuple(
    f for f in GPU_FIELDS
    if f.name in {
        "fb_used", "fb_free", "fb_reserved", "xid", "gr_engine_active", "sm_active",
        "sm_occupancy", "tensor_active", "dram_active", "fp64_active", "fp32_active",
        "fp16_active", "nvlink_tx_bps", "nvlink_rx_bps", "pcie_tx_bps", "pcie_rx_bps",
    }
)

PORT_FIELDS: tuple[Field, ...] = (
    # Data counters are stored in bytes: perfquery's 4-byte words are converted by its parser.
    _c("xmit_data_bytes", "B", "Bytes transmitted", "port_xmit_data"),
    _c("rcv_data_bytes", "B", "Bytes received", "port_rcv_data"),
    _c("xmit_pkts", "packets", "Packets transmitted", "port_xmit_packets"),
    _c("rcv_pkts", "packets", "Packets received", "port_rcv_packets"),
    _c("xmit_wait", "ticks", "PortXmitWait: ticks with data queued but no credit", "port_xmit_wait"),
    _c("symbol_errors", "errors", "Symbol errors", "symbol_error"),
    _c("link_downed", "events", "Link downed", "link_downed"),
    _c("link_error_recovery", "events", "Link error recovery", "link_error_recovery"),
    _c("rcv_errors", "errors", "Receive errors", "port_rcv_errors"),
    _c("rcv_remote_phys_errors", "errors", "Remote physical errors", "port_rcv_remote_physical_errors"),
    _c("xmit_discards", "packets", "Transmit discards", "port_xmit_discards"),
    _c("local_link_integrity_errors", "errors", "Local link integrity errors", "local_link_integrity_errors"),
    _c("buffer_overrun_errors", "errors", "Excessive buffer overrun errors", "excessive_buffer_overrun_errors"),
    # RoCE congestion control and flow control (mlx5 hw_counters / ethtool).
    _c("ecn_marked", "packets", "RoCE ECN-marked packets received", "np_ecn_marked_roce_packets"),
    _c("cnp_sent", "packets", "RoCE CNPs sent", "np_cnp_sent"),
    _c("cnp_handled", "packets", "RoCE CNPs handled", "rp_cnp_handled"),
    _c("pfc_pause_rx", "frames", "PFC pause frames received", "rx_pause_ctrl_phy"),
    _c("pfc_pause_tx", "frames", "PFC pause frames sent", "tx_pause_ctrl_phy"),
    _g("link_speed_gbps", "Gb/s", "Negotiated link speed", "rate"),
    _s("link_state", "state", "Port state (1 down .. 4 active)", "state"),
)

POWER_FIELDS: tuple[Field, ...] = (
    _g("watts", "W", "Power draw"),
    _c("energy_j", "J", "Energy counter", sql_type="double precision"),
    _g("inlet_temp", "°C", "Inlet air temperature"),
    _g("outlet_temp", "°C", "Exhaust air temperature"),
    _g("coolant_supply_temp", "°C", "Coolant supply temperature"),
    _g("coolant_return_temp", "°C", "Coolant return temperature"),
    _g("flow_lpm", "L/min", "Coolant flow"),
    _g("facility_watts", "W", "Facility power feeding this device, for PUE"),
)


@dataclass(frozen=True, slots=True)
class SampleKind:
    """One entity kind with a wide hypertable."""

    name: str  # "gpu", "mig", "port", "power"
    table: str  # raw hypertable
    entity_column: str  # FK column to the inventory row
    fields: tuple[Field, ...]

    @property
    def latest_table(self) -> str:
        return f"{self.table}_latest"

    def rollup_table(self, resolution: str) -> str:
        return f"{self.table}_{resolution}"

    @property
    def by_name(self) -> dict[str, Field]:
        return {f.name: f for f in self.fields}


KINDS: dict[str, SampleKind] = {
    "gpu": SampleKind("gpu", "telemetry_gpu_sample", "gpu_id", GPU_FIELDS),
    "mig": SampleKind("mig", "telemetry_mig_sample", "mig_id", MIG_FIELDS),
    "port": SampleKind("port", "telemetry_port_sample", "port_id", PORT_FIELDS),
    "power": SampleKind("power", "telemetry_power_sample", "device_id", POWER_FIELDS),
}

# DCGM source name -> column, for the exposition mapper.
DCGM_TO_GPU_FIELD: dict[str, str] = {s: f.name for f in GPU_FIELDS for s in f.sources}

# DCGM/NVML "blank" sentinels (dcgm_structs.h): a value at or above these means
# not supported / not found / no permission, never a reading.
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0


def is_dcgm_blank(value: float) -> bool:
    """True for DCGM/NVML sentinels that mean 'no value'."""
    if value >= DCGM_FP64_BLANK:
        return True
    return DCGM_INT32_BLANK <= value <= DCGM_INT32_BLANK + 15
