"""Tests for the operator UI: pages, websocket consumers and live publishing."""
