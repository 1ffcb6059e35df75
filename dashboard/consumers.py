"""Websocket consumers: thin, they join a group and forward what ingest publishes."""

from __future__ import annotations

from channels.generic.websocket import AsyncJsonWebsocketConsumer

FLEET_GROUP = "fleet"


class FleetConsumer(AsyncJsonWebsocketConsumer):
    """Pushes fleet summary changes to the operator's first page."""

    async def connect(self) -> None:
        if not self.scope["user"].is_authenticated:
            await self.close(code=4401)
            return
        await self.channel_layer.group_add(FLEET_GROUP, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(FLEET_GROUP, self.channel_name)

    async def fleet_update(self, event: dict) -> None:
        await self.send_json(event["data"])
