"""Read-side queries for telemetry, one module per page or concern.

Other apps and the dashboard import from here (`from telemetry.selectors import fleet_summary`);
the modules behind it are free to move.
"""

from telemetry.selectors.fleet import (
    DEGRADING_THROTTLE_MASK,
    RESET_OR_RMA_XIDS,
    fleet_summary,
    gpu_events,
    latest_values,
)

__all__ = ["DEGRADING_THROTTLE_MASK", "RESET_OR_RMA_XIDS", "fleet_summary", "gpu_events", "latest_values"]
