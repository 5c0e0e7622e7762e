"""Compacted topics: the system namespace `{tenant}/__mop`, where proxies keep shared state
(retained messages, sessions) as tables.

Every message of such a topic carries a key; the broker keeps the latest message of each key
(a message with property `mop.tombstone` = "1" deletes its key) in a storage table of its own,
so the state survives restarts and never ages out with the log. A subscription that starts on
such a topic, or moves back on it, reads these latest messages in id order instead of the log
(members of one batch come back as a batch of the members still current); messages published
after that come as they are published. The log itself is trimmed like any other.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from mop.broker.storage.api import Storage
from mop.broker.storage.records import decode_message, encode_message
from mop.broker.topic import Entry
from mop.message import Message, MessageId

__all__ = [
    "COMPACTED_TABLE_PREFIX",
    "SYSTEM_NAMESPACE",
    "TOMBSTONE_PROPERTY",
    "CompactedTopics",
]

SYSTEM_NAMESPACE: Final = "__mop"
# A message with this property set to "1" deletes its key.
TOMBSTONE_PROPERTY: Final = "mop.tombstone"
# One storage table per compacted topic, named after it (under the broker's reserved prefix).
COMPACTED_TABLE_PREFIX: Final = "$broker/compacted/"
# ledger, entry, batch index (-1: not a batch member), then the message record.
_POSITION: Final = struct.Struct("<qqi")


@dataclass(frozen=True, slots=True)
class _Latest:
    position: MessageId  # with the index in its batch for a batch member
    message: Message


def _is_tombstone(message: Message) -> bool:
    return (TOMBSTONE_PROPERTY, "1") in message.properties


def _encode(latest: _Latest) -> bytes:
    position = latest.position
    return _POSITION.pack(position.ledger, position.entry, position.batch_index) + (
        encode_message(0, 0, 0, latest.message)
    )


def _decode(raw: bytes) -> _Latest:
    ledger, entry, index = _POSITION.unpack_from(raw)
    _, message = decode_message(memoryview(raw)[_POSITION.size :])
    return _Latest(MessageId(ledger, entry, index), message)


def _entry_message(members: list[tuple[int, Message]]) -> Message:
    """What one entry delivers: its message, or a batch of its members still current."""
    if len(members) == 1 and members[0][0] < 0:
        return members[0][1]
    batch = tuple(message for _, message in sorted(members, key=lambda item: item[0]))
    first = batch[0]
    # No wire metadata: it would announce the original batch size.
    return Message(
        b"", producer=first.producer, publish_time=first.publish_time, qos=first.qos, batch=batch
    )


class CompactedTopics:
    """The latest message of every key of every compacted topic, in memory and in storage."""

    def __init__(self, storage: Storage, *, tenant: str) -> None:
        self._storage = storage
        self.prefix = f"persistent://{tenant}/{SYSTEM_NAMESPACE}/"
        self._latest: dict[str, dict[str, _Latest]] = {}

    def __contains__(self, topic: str) -> bool:
        """Whether `topic` (a full name) is compacted."""
        return topic.startswith(self.prefix)

    @staticmethod
    def table_name(topic: str) -> str:
        return COMPACTED_TABLE_PREFIX + topic

    def restore(self) -> None:
        """Load the tables of every compacted topic in storage (once, at recovery)."""
        for topic in self._storage.topics():
            if topic in self:
                rows = self._storage.table_items(self.table_name(topic))
                self._latest[topic] = {key: _decode(raw) for key, raw in rows}

    def record(self, topic: str, message_id: MessageId, message: Message) -> None:
        """Note a message just stored in compacted `topic` (each member, for a batch); one
        without a key is delivered to current subscribers but not kept."""
        latest = self._latest.setdefault(topic, {})
        table = self.table_name(topic)
        members = enumerate(message.batch) if message.batch else ((-1, message),)
        for index, member in members:
            key = member.key
            if key is None:
                continue
            if _is_tombstone(member):
                if latest.pop(key, None) is not None:
                    self._storage.table_put(table, key, None)
                continue
            position = MessageId(message_id.ledger, message_id.entry, index)
            kept = latest[key] = _Latest(position, member)
            self._storage.table_put(table, key, _encode(kept))

    def backlog(
        self,
        topic: str,
        after: MessageId | None,
        arrived: Sequence[MessageId],
        acked: frozenset[MessageId],
    ) -> tuple[list[MessageId], list[Entry]]:
        """What a subscription that stands at `after` reads: the ids of the entries that hold a
        current message after `after`, and those entries but the ones in `acked`. Entries from
        the first of `arrived` on (routed to the subscription while it was being set up) are
        left out, as it has them already (`arrived` is in id order)."""
        first_arrived = arrived[0] if arrived else None
        groups: dict[MessageId, list[tuple[int, Message]]] = {}
        for latest in self._latest.get(topic, {}).values():
            whole = latest.position.whole
            if (after is not None and whole <= after) or (
                first_arrived is not None and whole >= first_arrived
            ):
                continue
            groups.setdefault(whole, []).append((latest.position.batch_index, latest.message))
        ids = sorted(groups)
        entries = [
            Entry(topic, mid, _entry_message(groups[mid])) for mid in ids if mid not in acked
        ]
        return ids, entries

    def last(self, topic: str) -> MessageId | None:
        """The id of the last current message of `topic` (with its index in what `backlog`
        delivers, for a batch): what a reader from the earliest position gets last."""
        latest = self._latest.get(topic)
        if not latest:
            return None
        whole = max(item.position.whole for item in latest.values())
        members = [item for item in latest.values() if item.position.whole == whole]
        if members[0].position.batch_index < 0:
            return whole
        return MessageId(whole.ledger, whole.entry, len(members) - 1)

    def keys(self, topic: str) -> Iterator[str]:
        """The live keys of `topic`."""
        return iter(list(self._latest.get(topic, {})))
