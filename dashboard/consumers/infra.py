"""STUB: being built."""

from dashboard.consumers.base import LiveConsumer


class InfraConsumer(LiveConsumer):
    async def push(self) -> None:
        return None
