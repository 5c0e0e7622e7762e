"""The entry feed pauses its reader while too much waits for the Spark task, counted in
messages and in bytes, and resumes it once the task has taken most of it."""

from __future__ import annotations

from typing import cast

import pytest

from mop.message import MessageId
from mop.protocols.pulsar.client import ClientAuth
from mop.protocols.pulsar.driver import ClientConsumer, ReceivedEntry
from mop.protocols.pulsar.metadata import MessageMetadata
from mop.spark import fetch
from mop.spark.fetch import EntryFeed

pytestmark = pytest.mark.spark


class _Reader:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


def _feed(reader: _Reader) -> EntryFeed:
    """A feed whose worker is not started: its thread's side is called directly."""
    feed = EntryFeed("pulsar://unused", cast(ClientAuth, None), "t", MessageId(-1, -1), 1000)
    feed._consumer = cast(ClientConsumer, reader)
    feed._call = lambda function: function()  # type: ignore[method-assign]
    return feed


def _entry(number: int, size: int, count: int = 1) -> ReceivedEntry:
    meta = MessageMetadata(
        producer_name="p", sequence_id=number, publish_time=1, num_messages_in_batch=count
    )
    return ReceivedEntry(MessageId(1, number), meta, b"x" * size, ())


def test_large_entries_pause_the_reader_by_bytes() -> None:
    reader = _Reader()
    feed = _feed(reader)
    consumer = cast(ClientConsumer, reader)
    size = fetch._HIGH_BYTES // 4
    for number in range(4):
        feed._take(consumer, _entry(number, size))
    assert reader.calls == ["pause"]  # 4 messages, but as many bytes as allowed
    for _ in range(3):
        assert feed.get(0.1) is not None
    assert reader.calls == ["pause", "resume"]


def test_many_messages_pause_the_reader() -> None:
    reader = _Reader()
    feed = _feed(reader)
    consumer = cast(ClientConsumer, reader)
    feed._take(consumer, _entry(0, 10, count=fetch._HIGH))
    assert reader.calls == ["pause"]
    assert feed.get(0.1) is not None
    assert reader.calls == ["pause", "resume"]
