"""Websocket routes: one per live page family; each page subscribes by message after connecting."""

from django.urls import path

from dashboard.consumers import anomalies, fabric, facility, fleet, heatmap, inventory, jobs, pages

websocket_urlpatterns = [
    path("ws/fleet/", fleet.FleetConsumer.as_asgi()),
    path("ws/heatmap/", heatmap.HeatmapConsumer.as_asgi()),
    path("ws/jobs/", jobs.JobConsumer.as_asgi()),
    path("ws/series/", inventory.SeriesConsumer.as_asgi()),
    path("ws/fabric/", fabric.FabricConsumer.as_asgi()),
    path("ws/facility/", facility.FacilityConsumer.as_asgi()),
    path("ws/anomalies/", anomalies.AnomalyConsumer.as_asgi()),
    # Server-rendered pages (alerts, remediation, node, GPU, port, portal): their live regions, re-rendered.
    path("ws/page/", pages.PageConsumer.as_asgi()),
]
