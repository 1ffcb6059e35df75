"""Websocket routes."""

from django.urls import path

from dashboard import consumers

websocket_urlpatterns = [
    path("ws/fleet/", consumers.FleetConsumer.as_asgi()),
    path("ws/heatmap/", consumers.HeatmapConsumer.as_asgi()),
]
