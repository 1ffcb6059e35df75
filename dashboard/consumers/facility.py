"""STUB: being built."""

from dashboard.consumers.base import LiveConsumer


class FacilityConsumer(LiveConsumer):
    async def push(self) -> None:
        return None
