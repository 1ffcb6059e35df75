"""The alert lifecycle's lock: one writer of alert state at a time (evaluation, routing, silences, webhooks)."""

from __future__ import annotations

from django.db import connection

# pg_advisory_xact_lock(namespace, key): one writer of the alert lifecycle at a time.
LIFECYCLE_LOCK = (0x6277_0006, 1)


def lock_lifecycle(*, wait: bool = True) -> bool:
    """Take the lifecycle's advisory lock until the end of the current transaction.

    With wait=False, returns False at once when another transaction holds it.
    """
    with connection.cursor() as cur:
        if not wait:
            cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(LIFECYCLE_LOCK))
            return cur.fetchone()[0]
        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", list(LIFECYCLE_LOCK))
        return True
