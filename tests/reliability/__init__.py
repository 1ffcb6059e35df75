"""Reliability under faults and load (issue 8)."""
