"""Telemetry models, split by domain and re-exported here."""

from .events import GpuEvent, GpuEventKind
from .ingest import AgentStatus, CollectorToken, IngestBatch, RollupWatermark, ScrapeTarget
from .inventory import (
    Gpu,
    Hall,
    HealthState,
    Link,
    MigInstance,
    Node,
    NodeState,
    NvlinkDomain,
    Port,
    PowerDevice,
    Rack,
    Row,
    Site,
    Switch,
)
from .jobs import Allocation, Job, JobState, JobStateChange, TrainingStep
from .samples import (
    SAMPLE_MODELS,
    NarrowSample,
    NarrowSample1h,
    NarrowSample1m,
)

__all__ = [
    "Allocation", "Job", "JobState", "JobStateChange", "TrainingStep",
    "AgentStatus", "CollectorToken", "IngestBatch", "RollupWatermark", "ScrapeTarget", "GpuEvent", "GpuEventKind",
    "Gpu", "Hall", "HealthState", "Link", "MigInstance", "Node", "NodeState", "NvlinkDomain",
    "Port", "PowerDevice", "Rack", "Row", "Site", "Switch",
    "SAMPLE_MODELS", "NarrowSample", "NarrowSample1m", "NarrowSample1h",
]
