"""Websocket consumers, one module per page; thin: they check access, call one selector and
send what changed (see `base.LiveConsumer`)."""

from dashboard.consumers.base import CLOSE_UNAUTHENTICATED, LiveConsumer
from dashboard.consumers.fleet import FleetConsumer
from dashboard.consumers.heatmap import HeatmapConsumer

__all__ = ["CLOSE_UNAUTHENTICATED", "FleetConsumer", "HeatmapConsumer", "LiveConsumer"]
