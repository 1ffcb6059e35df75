"""Ingest API routes."""

from django.urls import path

from telemetry.api import events, health, jobs, training, views

urlpatterns = [
    path("ingest", views.ingest_json, name="ingest-json"),
    path("ingest/prometheus", views.ingest_prometheus, name="ingest-prometheus"),
    path("events", events.list_events, name="gpu-events"),
    path("health", health.fleet_health, name="fleet-health"),
    path("training", training.ingest_training, name="ingest-training"),
    path("jobs", jobs.ingest_jobs, name="ingest-jobs"),
]
