"""Helpers of the tests of mop's own Pulsar client: a running client for a service URL, and a
consumer's sink that keeps what it is handed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from mop.protocols.pulsar.driver import ClientConsumer, ClientOptions, PulsarClient, Received


@asynccontextmanager
async def open_driver(url: str, **options: float) -> AsyncIterator[PulsarClient]:
    """A running client of the brokers at `url` (operation timeout 5 s unless given)."""
    options.setdefault("operation_timeout", 5)
    client = PulsarClient(url, ClientOptions("test", **options))
    async with trio.open_nursery() as nursery:
        await nursery.start(client.serve)
        try:
            yield client
        finally:
            await client.aclose()


class Inbox:
    """A consumer's sink that keeps what it is handed, and lets a test wait for a count."""

    def __init__(self, *, ack: bool = False) -> None:
        self.items: list[Received] = []
        self.ack = ack  # acknowledge each message as it is handed over
        self._changed = trio.Event()

    def __call__(self, consumer: ClientConsumer, items: list[Received]) -> None:
        self.items += items
        if self.ack:
            for item in items:
                consumer.ack(item.message_id)
        self._changed.set()

    async def wait_for(self, count: int, seconds: float = 5) -> list[Received]:
        with trio.fail_after(seconds):
            while len(self.items) < count:
                self._changed = trio.Event()
                await self._changed.wait()
        return self.items

    async def wait_for_distinct(self, count: int, seconds: float = 5) -> list[Received]:
        """Wait until `count` distinct payloads came (a broker may deliver one again)."""
        with trio.fail_after(seconds):
            while len(set(self.payloads)) < count:
                self._changed = trio.Event()
                await self._changed.wait()
        return self.items

    @property
    def payloads(self) -> list[bytes]:
        return [item.payload for item in self.items]
