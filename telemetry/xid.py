"""NVIDIA XID catalogue: what each Xid code means and what an operator should do about it.

Pure data plus lookups, shared by the node agent (which must not import Django) and the server (which
shows each deduplicated fault with its meaning and recommended action). Stdlib only.

Source: NVIDIA XID Errors documentation, r5xx -- "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, catalogue revision for drivers
R565-R575), whose "Resolution Bucket (Immediate Action)" column is mapped onto Breakwater's actions:

    IGNORE -> "none", RESTART_APP -> "restart_app", RESET_GPU -> "reset_gpu",
    RESTART_BM (restart bare metal) -> "drain_node" for Xid 79 (the GPU is gone: evacuate, then reboot),
    WORKFLOW_XID_48 / WORKFLOW_NVLINK_ERR / WORKFLOW_NVLINK5_ERR -> "reset_gpu" (where those workflows end
    for the uncorrectable case), CONTACT_SUPPORT as the *only* remedy (retirement failures) -> "rma".

Codes 56, 57, 58 and 61 are marked "Unused" on Ampere and newer; their meanings come from the older
(pre-Ampere) Xid table of the same documentation, so Volta-era nodes still get a useful description.

Unknown codes: ``describe()`` returns severity "warning" and action "none" (``known=False``). A code we do not
know is worth a human look (hence not "info"), but recommending a destructive step such as a GPU reset on no
information would kill healthy jobs; the UI should say "unknown Xid, consult the NVIDIA catalogue".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
# Ordered from least to most disruptive, so callers can take the max() of several recommendations.
ACTIONS: tuple[str, ...] = ("none", "restart_app", "reset_gpu", "drain_node", "reboot_node", "rma")


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One catalogue entry. ``action`` is one of ACTIONS, ``severity`` one of SEVERITIES."""

    code: int
    mnemonic: str  # NVIDIA's identifier, e.g. ROBUST_CHANNEL_GPU_ECC_DBE
    name: str  # short human name, e.g. "Double bit ECC error"
    meaning: str  # one or two sentences for the fault page
    severity: str
    action: str
    gpu_lost: bool = False  # the GPU no longer answers (Xid 79): every job on it is dead
    known: bool = True


def _x(code: int, mnemonic: str, name: str, meaning: str, severity: str, action: str,
       gpu_lost: bool = False) -> tuple[int, XidInfo]:
    return code, XidInfo(code, mnemonic, name, meaning, severity, action, gpu_lost)


_NVLINK5 = "NVLink5 (Blackwell) link error; decode the intrinfo sub-code per NVIDIA's NVLINK5 workflow. " \
    "Fatal sub-codes need a GPU reset; if it recurs after reset, contact support."

CATALOGUE: dict[int, XidInfo] = dict([
    _x(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing",
       "A channel stopped making progress (idle timeout); usually an application hang.", "warning", "restart_app"),
    _x(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "Invalid or corrupted push buffer stream",
       "The GPU was sent an invalid command stream; check the application and CUDA version.",
       "warning", "restart_app"),
    _x(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics engine exception",
       "General application fault: typically an out-of-bounds access or illegal instruction in a kernel. "
       "Rarely hardware; debug with compute-sanitizer / cuda-gdb.", "warning", "restart_app"),
    _x(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault",
       "The GPU MMU reported an illegal address access; typically an application bug, occasionally driver "
       "or hardware.", "warning", "restart_app"),
    _x(32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream",
       "The DMA controller feeding the GPU over PCIe reported a fault; mostly PCIe signal-quality issues, "
       "not the application.", "warning", "restart_app"),
    _x(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error",
       "A GPU firmware watchdog fired; contact support if it repeats.", "warning", "none"),
    _x(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (application fault)",
       "A user application hit a software-induced fault and was terminated; the GPU remains healthy.",
       "info", "none"),
    _x(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup",
       "The driver tore down an application's channels (Ctrl-C, kill, GPU reset, or after another Xid such as "
       "a DBE). Follow the accompanying Xid, if any.", "info", "none"),
    _x(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing (timeout)",
       "The GPU stopped processing work; a GPU reset is needed.", "critical", "reset_gpu"),
    _x(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double bit ECC error",
       "An uncorrectable (double-bit) ECC error was detected; the affected application is notified. A GPU reset "
       "or node reboot clears it; repeated SRAM DBEs past NVIDIA's threshold mean field diagnostics / RMA.",
       "critical", "reset_gpu"),
    _x(56, "DISPLAY_CHANNEL_EXCEPTION", "Display engine error",
       "Display engine error (pre-Ampere only; unused on data-centre GPUs since Ampere).", "warning", "reset_gpu"),
    _x(57, "FB_LINK_TRAINING_FAILURE_ERROR", "Error programming video memory interface",
       "Video memory interface could not be programmed (pre-Ampere); hardware or driver fault.",
       "critical", "reset_gpu"),
    _x(58, "FB_MEMORY_ERROR", "Unstable video memory interface",
       "The video memory interface is unstable (pre-Ampere); likely a hardware fault.", "critical", "reset_gpu"),
    _x(61, "PMU_BREAKPOINT", "Internal micro-controller breakpoint/warning",
       "An internal micro-controller hit a breakpoint (older drivers); reset the GPU if work stalls.",
       "warning", "reset_gpu"),
    _x(62, "PMU_HALT_ERROR", "Internal micro-controller halt",
       "An internal micro-controller halted; the GPU must be reset.", "critical", "reset_gpu"),
    _x(63, "INFOROM_DRAM_RETIREMENT_EVENT", "Row remapping / page retirement event",
       "The GPU handled an ECC memory error by marking a row for remapping (Ampere+) or retiring a page (older). "
       "It takes effect at the next GPU reset; reset when convenient.", "info", "none"),
    _x(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "Row remapping / page retirement failure",
       "The GPU could not remap a row or retire a page after an ECC error; this meets NVIDIA's RMA criteria "
       "for memory.", "critical", "rma"),
    _x(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 exception",
       "Video decoder engine exception; restart the application.", "warning", "restart_app"),
    _x(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class error",
       "The application used an invalid graphics/compute class; check the application and CUDA version.",
       "warning", "restart_app"),
    _x(74, "NVLINK_ERROR", "NVLink error",
       "A GPU-to-GPU or GPU-to-NVSwitch NVLink connection failed; may be this link or the device at the far end. "
       "A GPU reset or node reboot is needed; contact the vendor if it persists.", "critical", "reset_gpu"),
    _x(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus",
       "The driver can no longer reach the GPU over PCIe (link down, failing GPU or driver fault). Every job on "
       "it is lost; drain the node and restart it, then check PCIe/system event logs.",
       "critical", "drain_node", gpu_lost=True),
    _x(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate",
       "Single-bit ECC errors are being corrected at a high rate; no immediate action, watch for a trend.",
       "warning", "none"),
    _x(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error",
       "An uncorrectable error was contained to one application, which must be restarted; others are "
       "unaffected. Reset the GPU when convenient.", "warning", "restart_app"),
    _x(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error",
       "An uncorrectable error could affect several applications; the GPU must be reset before reuse.",
       "critical", "reset_gpu"),
    _x(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context switch timeout",
       "The GPU failed to switch contexts in time; reset the GPU.", "critical", "reset_gpu"),
    _x(110, "SEC_FAULT_ERROR", "Security fault error",
       "A security fault was detected; uncommon unless hardware failed. Reset (cold-reset if it repeats).",
       "critical", "reset_gpu"),
    _x(119, "GSP_RPC_TIMEOUT", "GSP RPC timeout",
       "The GPU System Processor did not answer a driver RPC in time. Reset the GPU (or power-cycle the node "
       "if it persists).", "critical", "reset_gpu"),
    _x(120, "GSP_ERROR", "GSP error",
       "Code running on the GPU System Processor failed. Reset the GPU (or power-cycle the node if it persists).",
       "critical", "reset_gpu"),
    _x(121, "C2C_ERROR", "C2C link corrected error",
       "Corrected errors on the chip-to-chip NVLink to a Grace CPU; no operational impact. Reset at a service "
       "window to retrain the link.", "info", "none"),
    _x(136, "ALI_TRAINING_FAIL", "NVLink training failed",
       "NVLink link training failed; reset the GPU and investigate link signal integrity.", "critical", "reset_gpu"),
    _x(137, "NVLINK_PRIV_ERR", "NVLink privilege error",
       "The remote MMU reported an illegal NVLink peer access; typically an application bug.", "warning", "none"),
    _x(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC unrecovered error",
       "Uncorrectable memory errors escaped page offlining / row remapping. Reset the GPU; contact the vendor if "
       "it persists.", "critical", "reset_gpu"),
    _x(143, "GPU_INIT_ERROR", "GPU initialization error",
       "The GPU failed to initialise; reset it and contact support if it persists.", "critical", "reset_gpu"),
    _x(144, "NVLINK_SAW_ERROR", "NVLink SAW error", _NVLINK5, "critical", "reset_gpu"),
    _x(145, "NVLINK_RLW_ERROR", "NVLink RLW error", _NVLINK5, "critical", "reset_gpu"),
    _x(146, "NVLINK_TLW_ERROR", "NVLink TLW error", _NVLINK5, "critical", "reset_gpu"),
    _x(147, "NVLINK_TREX_ERROR", "NVLink TREX error", _NVLINK5, "critical", "reset_gpu"),
    _x(148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink NVLPW_CTRL error", _NVLINK5, "critical", "reset_gpu"),
    _x(149, "NVLINK_NETIR_ERROR", "NVLink NETIR error", _NVLINK5, "critical", "reset_gpu"),
    _x(150, "NVLINK_MSE_ERROR", "NVLink MSE error", _NVLINK5, "critical", "reset_gpu"),
    _x(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed",
       "Summarises the recovery action the driver now requires for accompanying Xids, e.g. 'changed from 0x0 "
       "(None) to 0x2 (Node Reboot Required)'. Use recovery_action_from_message() for the action.",
       "info", "none"),
    _x(155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error",
       "An NVLink went down intentionally (e.g. to sleep) or by software decision; reset the GPU if links are "
       "needed.", "warning", "reset_gpu"),
    _x(156, "RESOURCE_RETIREMENT_EVENT", "Resource retirement event",
       "A GPU resource was retired after errors; it takes effect after a GPU reset.", "warning", "reset_gpu"),
    _x(157, "RESOURCE_RETIREMENT_FAILURE", "Resource retirement failure",
       "No repair is possible for lack of spare resources; the Xid may recur. Contact support.", "critical", "rma"),
    _x(158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout",
       "A fatal GPU timeout; reset the GPU and contact support if it persists.", "critical", "reset_gpu"),
])


def describe(code: int) -> XidInfo:
    """Return the catalogue entry for ``code``, or the documented unknown-code default (warning, "none")."""
    info = CATALOGUE.get(code)
    if info is not None:
        return info
    return XidInfo(code, "UNKNOWN", f"Unknown Xid {code}",
                   "Not in Breakwater's catalogue (newer driver?); look it up in NVIDIA's Xid catalogue.",
                   "warning", "none", known=False)


# Xid 154 text -> action. Labels from NVIDIA's catalogue; "PF FLR" is how 0x1 printed on earlier r5xx drivers.
_RECOVERY_LABELS: dict[str, str] = {
    "none": "none",
    "gpu reset required": "reset_gpu",
    "pf flr": "reset_gpu",
    "drain p2p": "drain_node",
    "drain and reset": "drain_node",  # drain P2P traffic first, then reset: the node must stop taking work
    "node reboot required": "reboot_node",
}
_RECOVERY_RE = re.compile(r"to\s+0x[0-9a-fA-F]+\s*\(([^)]+)\)")


def recovery_action_from_message(message: str) -> str | None:
    """Map an Xid 154 message ("... changed from 0x0 (None) to 0x2 (Node Reboot Required)") to an action."""
    match = _RECOVERY_RE.search(message)
    if match is None:
        return None
    return _RECOVERY_LABELS.get(match.group(1).strip().lower())


def effective_action(code: int, message: str = "") -> str:
    """The action to recommend for one event: Xid 154 carries its own; every other code uses the catalogue."""
    if code == 154:
        return recovery_action_from_message(message) or "none"
    return describe(code).action
