"""STUB: being built."""

from dashboard.consumers.base import LiveConsumer


class SeriesConsumer(LiveConsumer):
    async def push(self) -> None:
        return None
