"""What every app uses: the JSON API's one error edge, request hygiene, and shared time and database helpers.

Imports run one way: core ← telemetry ← anomaly, tenancy ← alerts ← dashboard. Nothing here imports an app.
"""
