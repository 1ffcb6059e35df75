"""What telemetry tells the apps above it, without importing them (they connect in their AppConfig.ready).

`fleet_changed` is sent after ingest commits new samples or events, and when a state changed with time alone (a
GPU gone silent): news for whatever evaluates the fleet (the alert rules). Receivers must not raise and must be
cheap (ingest waits for them): queue work, do not do it. `new_faults` (default 0) counts the fault events the
commit opened: what the alert rules should see at once rather than paced.
"""

from django.dispatch import Signal

fleet_changed = Signal()
