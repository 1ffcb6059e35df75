"""STUB: being built."""

from dashboard.consumers.base import LiveConsumer


class JobConsumer(LiveConsumer):
    async def push(self) -> None:
        return None
