"""Tests for the Kubernetes integration (telemetry/k8s)."""
