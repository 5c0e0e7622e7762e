"""Positions in a topic, read from storage: the message at a publish time,
the last message still readable, and how far acknowledged data can be trimmed.
"""

from __future__ import annotations

from mop.broker.storage.api import Storage
from mop.broker.topic import Topic
from mop.message import MessageId

__all__ = ["id_before", "last_message", "mark_for_time", "trim_point"]

READ_BATCH = 1000
# An entry number above any a store hands out, for "just before the first entry of a ledger".
_LAST_ENTRY = (1 << 63) - 1
# How often `last_message` looks again when the last message changes while it reads.
_LAST_ATTEMPTS = 3


def id_before(message_id: MessageId) -> MessageId | None:
    """An id that sorts just before the entry of `message_id`: a cursor whose mark_delete is
    there still owes that entry. None when nothing can sort before it."""
    if message_id.entry > 0:
        return MessageId(message_id.ledger, message_id.entry - 1)
    if message_id.ledger > 0:
        return MessageId(message_id.ledger - 1, _LAST_ENTRY)
    return None


async def mark_for_time(
    storage: Storage, topic: str, publish_time: int, last: MessageId | None
) -> MessageId | None:
    """The id just before the first stored message published at or after `publish_time`
    (`last`, the topic's last id, when there is none)."""
    mark: MessageId | None = None
    after: MessageId | None = None
    while True:
        page = await storage.read(topic, after, READ_BATCH)
        if not page:
            return last if last is not None else mark
        for message_id, message in page:
            if message.publish_time >= publish_time:
                return mark
            mark = message_id
        after = page[-1][0]


async def last_message(storage: Storage, topic: Topic) -> MessageId | None:
    """The id of the last message of `topic` that a reader can still get (for a batch, of its
    last message in the batch); None when there is none: nothing was published, or all of it
    has been trimmed. Pulsar clients take any id here as "there is more to read", so an id
    whose entry is gone would make a reader wait for a message that never comes."""
    for _ in range(_LAST_ATTEMPTS):
        last = topic.last_id
        if last is None or (topic.trimmed is not None and last <= topic.trimmed):
            return None
        # Retention trims without the broker knowing: look the entry up (it is usually still
        # in the log tail's memory), which also gives its batch size.
        page = await storage.read(topic.name, id_before(last), 1)
        if page and page[0][0] == last:
            count = len(page[0][1].batch)
            return MessageId(last.ledger, last.entry, count - 1) if count else last
        if not page or topic.last_id == last:
            return None  # the whole topic is trimmed
        # Trimmed while newer messages came in during the read: look again at the newest.
    return None


def trim_point(topic: Topic) -> MessageId | None:
    """Up to where every subscription of `topic` has acknowledged (everything, without any)."""
    if not topic.cursors:
        return topic.last_id
    lowest: MessageId | None = None
    for cursor in topic.cursors:
        mark = cursor.mark_delete
        if mark is None:
            return None
        if lowest is None or mark < lowest:
            lowest = mark
    return lowest
