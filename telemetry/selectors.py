"""Read-side queries for telemetry (filled in below)."""
