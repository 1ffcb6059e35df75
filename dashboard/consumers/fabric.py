"""STUB: being built."""

from dashboard.consumers.base import LiveConsumer


class FabricConsumer(LiveConsumer):
    async def push(self) -> None:
        return None
