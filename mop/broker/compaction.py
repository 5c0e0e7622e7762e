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

import heapq
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from mop.broker.cursor import Entry
from mop.broker.storage.api import Storage
from mop.broker.storage.ranges import IdRanges
from mop.broker.storage.records import decode_message, encode_message
from mop.message import TOMBSTONE_PROPERTY, Message, MessageId
from mop.topic_names import SYSTEM_NAMESPACE

__all__ = [
    "COMPACTED_TABLE_PREFIX",
    "SYSTEM_NAMESPACE",
    "CompactedTopics",
]

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
        b"",
        producer=first.producer,
        publish_time=first.publish_time,
        qos=max(message.qos for message in batch),  # held, and kept, if any member must be
        batch=batch,
    )


class _Table:
    """The latest message of every key of one compacted topic, plus what `last` needs without
    a scan: proxies ask for the last id on every catch-up, and tables hold many keys.

    `members` counts the live keys of each entry (by whole id) and notes whether that entry is
    a batch; `_newest` is a max-heap of entry ids (negated, as heapq is a min-heap) whose
    entries may have died since: they are dropped when they reach the top, and the heap is
    rebuilt from `members` when the dead ones outnumber the live, so it stays O(live entries).
    """

    __slots__ = ("_newest", "latest", "members")

    def __init__(self, latest: dict[str, _Latest]) -> None:
        self.latest = latest
        self.members: dict[MessageId, tuple[int, bool]] = {}
        for item in latest.values():
            self._add(item.position)
        self._newest: list[tuple[int, int]] = []
        self._rebuild()

    def put(self, key: str, kept: _Latest) -> None:
        old = self.latest.get(key)
        if old is not None:
            self._remove(old.position)
        self.latest[key] = kept
        if self._add(kept.position):
            whole = kept.position.whole
            heapq.heappush(self._newest, (-whole.ledger, -whole.entry))

    def delete(self, key: str) -> bool:
        """Drop `key`; whether it was live."""
        old = self.latest.pop(key, None)
        if old is None:
            return False
        self._remove(old.position)
        return True

    def last(self) -> MessageId | None:
        newest = self._newest
        members = self.members
        while newest:
            ledger, entry = newest[0]
            whole = MessageId(-ledger, -entry)
            counted = members.get(whole)
            if counted is not None:
                count, batched = counted
                return MessageId(whole.ledger, whole.entry, count - 1) if batched else whole
            heapq.heappop(newest)  # that entry has no live key any more
        return None

    def _add(self, position: MessageId) -> bool:
        """Count a live key at `position`; whether its entry had none before."""
        whole = position.whole
        counted = self.members.get(whole)
        count = 0 if counted is None else counted[0]
        self.members[whole] = (count + 1, position.batch_index >= 0)
        return counted is None

    def _remove(self, position: MessageId) -> None:
        whole = position.whole
        count, batched = self.members[whole]
        if count > 1:
            self.members[whole] = (count - 1, batched)
            return
        del self.members[whole]
        # Dead ids below the top are only dropped here; rebuilding at twice the live count
        # keeps the heap bounded at an amortized O(1) per removal.
        if len(self._newest) > 2 * len(self.members) + 16:
            self._rebuild()

    def _rebuild(self) -> None:
        self._newest = [(-whole.ledger, -whole.entry) for whole in self.members]
        heapq.heapify(self._newest)


class CompactedTopics:
    """The latest message of every key of every compacted topic, in memory and in storage."""

    def __init__(self, storage: Storage, *, tenant: str) -> None:
        self._storage = storage
        self.prefix = f"persistent://{tenant}/{SYSTEM_NAMESPACE}/"
        self._tables: dict[str, _Table] = {}
        # Told `(topic, key, before, after)` (None: no live message) as `record` changes a key,
        # whoever wrote it: the local backend's tables follow their topics through it.
        self.on_change: Callable[[str, str, Message | None, Message | None], None] | None = None

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
                self._tables[topic] = _Table({key: _decode(raw) for key, raw in rows})

    def record(self, topic: str, message_id: MessageId, message: Message) -> None:
        """Note a message just stored in compacted `topic` (each member, for a batch); one
        without a key is delivered to current subscribers but not kept."""
        kept_table = self._tables.get(topic)
        if kept_table is None:
            kept_table = self._tables[topic] = _Table({})
        table = self.table_name(topic)
        members = enumerate(message.batch) if message.batch else ((-1, message),)
        for index, member in members:
            key = member.key
            if key is None:
                continue
            before = kept_table.latest.get(key)
            if _is_tombstone(member):
                if kept_table.delete(key):
                    self._storage.table_put(table, key, None)
                    self._changed(topic, key, before, None)
                continue
            position = MessageId(message_id.ledger, message_id.entry, index)
            kept = _Latest(position, member)
            kept_table.put(key, kept)
            self._storage.table_put(table, key, _encode(kept))
            self._changed(topic, key, before, member)

    def _changed(self, topic: str, key: str, before: _Latest | None, after: Message | None) -> None:
        if self.on_change is not None:
            self.on_change(topic, key, None if before is None else before.message, after)

    def backlog(
        self,
        topic: str,
        after: MessageId | None,
        arrived: Sequence[MessageId],
        acked: IdRanges,
    ) -> tuple[list[MessageId], list[Entry]]:
        """What a subscription that stands at `after` reads: the ids of the entries that hold a
        current message after `after`, and those entries but the ones in `acked`. Entries from
        the first of `arrived` on (routed to the subscription while it was being set up) are
        left out, as it has them already (`arrived` is in id order)."""
        first_arrived = arrived[0] if arrived else None
        groups: dict[MessageId, list[tuple[int, Message]]] = {}
        kept_table = self._tables.get(topic)
        for latest in () if kept_table is None else kept_table.latest.values():
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
        kept_table = self._tables.get(topic)
        return None if kept_table is None else kept_table.last()

    def keys(self, topic: str) -> Iterator[str]:
        """The live keys of `topic`."""
        kept_table = self._tables.get(topic)
        return iter([] if kept_table is None else list(kept_table.latest))

    def latest(self, topic: str, key: str) -> Message | None:
        """The live message of `key` in `topic` (None: the key has none)."""
        kept_table = self._tables.get(topic)
        kept = None if kept_table is None else kept_table.latest.get(key)
        return None if kept is None else kept.message

    def items(self, topic: str) -> list[tuple[str, Message]]:
        """Every live key of `topic` with its message."""
        kept_table = self._tables.get(topic)
        if kept_table is None:
            return []
        return [(key, kept.message) for key, kept in kept_table.latest.items()]
