"""The fleet page's consumer: forwards the summary that ingest computes once per second."""

from __future__ import annotations

import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from alerts.selectors import open_alert_counts
from dashboard.consumers.base import TickMemo, admit_operator
from dashboard.views import fleet_page_summary
from telemetry.live import FLEET_GROUP

# One summary's message with the open alert counts, read and encoded once for every fleet page of the process.
_messages = TickMemo()


class FleetConsumer(AsyncJsonWebsocketConsumer):
    """Pushes fleet summary changes to the operator's first page (operators only)."""

    bw_access = "operator"  # read by the isolation test (tests/tenancy/test_isolation.py)

    async def connect(self) -> None:
        if not await admit_operator(self):
            return
        # Join before reading, so a change committed while we read is still pushed afterwards.
        await self.channel_layer.group_add(FLEET_GROUP, self.channel_name)
        await self.accept()
        # The page was rendered some time ago; bring it up to date without waiting for ingest.
        await self.send_json(await database_sync_to_async(fleet_page_summary)())

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(FLEET_GROUP, self.channel_name)

    async def fleet_update(self, event: dict) -> None:
        # Alert counts ride along with every push so the fleet page and the alerts list agree.
        data = event["data"]
        # Keyed by the summary's time and id: ordered as ticks are, and never two summaries under one key.
        key = f"{data['generated_at']} {event.get('id', '')}"
        text = await _messages.run(_messages.get, "fleet", key, _message, data)
        await self.send(text_data=text)


def _message(summary: dict) -> str:
    return json.dumps({**summary, "alerts": open_alert_counts()})
