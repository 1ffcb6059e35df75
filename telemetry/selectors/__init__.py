"""Read-side queries for telemetry, one module per page or concern.

Other apps and the dashboard import from here (`from telemetry.selectors import fleet_summary`);
the modules behind it are free to move.
"""

from telemetry.health import DEGRADING_THROTTLE_MASK, RESET_OR_RMA_XIDS
from telemetry.selectors.fabric import fabric_graph, fabric_matrix, port_detail
from telemetry.selectors.fleet import fleet_summary, gpu_events, latest_values
from telemetry.selectors.inventory import allocation_history, gpu_detail, node_detail
from telemetry.selectors.jobs import job_detail, job_list, job_step_series
from telemetry.selectors.nvlink import nvlink_domains
from telemetry.selectors.power import power_overview, pue_series
from telemetry.selectors.search import search

__all__ = ["DEGRADING_THROTTLE_MASK", "RESET_OR_RMA_XIDS", "fleet_summary", "gpu_events", "latest_values"]
__all__ += ["fabric_graph", "fabric_matrix", "port_detail", "nvlink_domains", "power_overview", "pue_series"]
__all__ += ["allocation_history", "gpu_detail", "node_detail", "job_detail", "job_list", "job_step_series", "search"]
