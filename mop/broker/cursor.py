"""`Entry`, a stored message as it travels through dispatch, and `Cursor`, one subscription on
one topic. The leaf of the broker's modules: every other one imports it, it imports none of them
but `rates` (it names `Subscription` and `Topic` for the type checker only). No I/O.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from mop.broker.storage.api import CursorState
from mop.broker.storage.ranges import IdRangeSet
from mop.message import Delivery, Message, MessageId
from mop.rates import RateMeter

if TYPE_CHECKING:
    from mop.broker.subscription import Subscription
    from mop.broker.topic import Topic

__all__ = ["Cursor", "Entry"]

# `ids` is compacted when an out-of-order acknowledgement finds it longer than this, or than
# twice its length after the last compaction: amortized O(1) per id, and a stalled cursor
# holds O(unacknowledged ids + runs of `acked` + this) ids however long it stalls.
_COMPACT_FLOOR = 1024


class Entry:
    """One message of one topic; created once per publish and shared by every subscription.

    `delivery` is the message as first delivered (made by the first consumer that takes it):
    a delivery is immutable, so every other consumer that takes the message for the first
    time is handed the same object instead of a copy of its own.
    """

    __slots__ = ("delivery", "message", "message_id", "topic")

    def __init__(self, topic: str, message_id: MessageId, message: Message) -> None:
        self.topic = topic
        self.message_id = message_id
        self.message = message
        self.delivery: Delivery | None = None

    def __repr__(self) -> str:
        return f"Entry({self.topic!r}, {self.message_id!r})"


class Cursor:
    """One subscription on one topic: what it acknowledged, and the messages it still waits
    to dispatch (`backlog`, in id order). `messages_out` and `bytes_out` count what its
    consumers took since it was made (at `since`, wall-clock seconds), for the stats."""

    __slots__ = (
        "acked",
        "attached",
        "backlog",
        "backlog_bytes",
        "bytes_out",
        "catching_up",
        "ids",
        "ids_limit",
        "in_ready",
        "loading",
        "mark_delete",
        "messages_out",
        "meter",
        "partial",
        "qos0",
        "read_after",
        "reading",
        "redeliveries",
        "returned",
        "since",
        "sub",
        "topic",
    )

    def __init__(self, sub: Subscription, topic: Topic, mark_delete: MessageId | None) -> None:
        self.sub = sub
        self.topic = topic
        self.mark_delete = mark_delete
        # The ids after mark_delete routed to this cursor and not yet folded into it, in
        # order; `acked` holds those among them acknowledged out of order, as runs (a
        # subscription that stalls with one message in flight acknowledges what it drops one
        # by one behind it: that is one run, whose cost does not grow with its length).
        # `compact` drops from `ids` the acknowledged ids that `settle` would only pass over,
        # so `ids` does not grow with that run either: of each stretch of acknowledged ids it
        # keeps the last (where mark_delete stops), and it always keeps the first id.
        self.ids: deque[MessageId] = deque()
        self.ids_limit = _COMPACT_FLOOR
        self.acked = IdRangeSet()
        self.backlog: deque[Entry] = deque()
        self.backlog_bytes = 0  # of the backlog's payloads (`payload_size`), for read-ahead
        self.redeliveries: dict[MessageId, int] = {}
        # Batch entries acknowledged in part: entry id -> bit set of the acknowledged indexes.
        # Kept in memory only: after a restart the whole batch is owed again.
        self.partial: dict[MessageId, int] = {}
        self.qos0 = 0  # qos-0 entries in the backlog, so a full backlog knows if it can evict
        self.returned = 0  # entries at the front of the backlog that came back from consumers
        self.in_ready = False
        # While the backlog is being read from storage, new messages queue up behind it.
        self.loading = False
        # While the cursor reads its stored backlog a chunk at a time (`catching_up`), new
        # messages are not routed to it: it reads them from storage in turn, after
        # `read_after`, the last stored id read; `reading` while a chunk is being read.
        self.catching_up = False
        self.read_after: MessageId | None = None
        self.reading = False
        self.attached = True
        self.messages_out = 0
        self.bytes_out = 0
        self.since = 0.0
        self.meter: RateMeter | None = None  # made when the stats are first read

    def __repr__(self) -> str:
        return f"Cursor({self.sub.name!r}, {self.topic.name!r})"

    def ack(self, message_id: MessageId) -> None:
        if self.redeliveries:
            self.redeliveries.pop(message_id, None)
        if self.partial:
            self.partial.pop(message_id, None)
        ids = self.ids
        # Usually the very object routed to the cursor: identity first, then equality.
        if ids and (ids[0] is message_id or ids[0] == message_id):
            ids.popleft()
            if self.mark_delete is None or message_id > self.mark_delete:
                self.mark_delete = message_id  # never back: that would deliver again
            self.settle()
        elif self.mark_delete is None or message_id > self.mark_delete:
            self.acked.add(message_id)
            if len(ids) > self.ids_limit:
                self.compact()
        self.sub.books.changed.add(self)

    def ack_taken(self, message_ids: list[MessageId]) -> None:
        """`ack` each of `message_ids` in turn (messages acknowledged as a consumer takes
        them, in the order routed): those first in `ids`, as they usually are, move
        `mark_delete` once for them all. A run of one (topics taken in turn) is `ack` alone,
        which costs least."""
        if len(message_ids) == 1 or self.redeliveries or self.partial or self.acked:
            for message_id in message_ids:
                self.ack(message_id)
            return
        ids = self.ids
        done = 0
        for message_id in message_ids:
            if not ids or not (ids[0] is message_id or ids[0] == message_id):
                break
            ids.popleft()
            done += 1
        if done:
            # `ids` is in id order, so the last one taken off is the highest. Nothing else
            # is acknowledged (`acked` was empty and stays so): nothing to settle.
            last = message_ids[done - 1]
            if self.mark_delete is None or last > self.mark_delete:
                self.mark_delete = last
            self.sub.books.changed.add(self)
        for message_id in message_ids[done:]:
            self.ack(message_id)

    def owed(self) -> int:
        """How many messages routed here the subscription has not acknowledged (Pulsar's
        msgBacklog): waiting for dispatch, with a consumer, or delayed. O(len(ids)), walked
        by runs of `acked` as `compact` does. While the cursor catches up with its stored
        backlog, only the part read so far counts."""
        acked = self.acked
        if not acked:
            return len(self.ids)
        owed = 0
        held, ledger, first, last = False, -1, 0, -1
        for message_id in self.ids:
            entry = message_id.entry
            if message_id.ledger != ledger or entry < first or entry > last:
                held, ledger, first, last = acked.span(message_id)
            if not held:
                owed += 1
        return owed

    def is_acked(self, message_id: MessageId) -> bool:
        mark = self.mark_delete
        return (mark is not None and message_id <= mark) or message_id in self.acked

    def ack_member(self, entry: Entry, index: int) -> bool:
        """Acknowledge one message of a batch entry; True when that completes the entry."""
        size = len(entry.message.batch)
        if not 0 <= index < size:
            return False
        bits = self.partial.get(entry.message_id, 0) | (1 << index)
        if bits == (1 << size) - 1:
            self.ack(entry.message_id)
            return True
        self.partial[entry.message_id] = bits
        return False

    def settle(self) -> None:
        """Fold acknowledged ids at the front into `mark_delete`."""
        acked = self.acked
        ids = self.ids
        if not (acked and ids and ids[0] in acked):
            return
        mark = ids.popleft()
        while ids and ids[0] in acked:
            mark = ids.popleft()
        if self.mark_delete is None or mark > self.mark_delete:
            self.mark_delete = mark
        acked.discard_through(mark)

    def compact(self) -> None:
        """Drop from `ids` each acknowledged id, but the first, that an acknowledged id
        follows in `ids`: `settle` then stops where it did (at the last acknowledged id before
        the first one still owed), `ack` finds the same first id, and `is_acked` and `state` do
        not read `ids`. O(len(ids)), and a search of `acked` for each run or gap met."""
        ids = self.ids
        acked = self.acked
        if acked and len(ids) > 2:
            rest = iter(ids)
            kept = [next(rest)]
            pending: MessageId | None = None  # the last of a stretch of acknowledged ids
            # The span of `acked` (a run, or a gap) that answered for the last id looked up:
            # routed ids are mostly consecutive, so most fall in the span of the one before.
            held, ledger, first, last = False, -1, 0, -1
            for message_id in rest:
                entry = message_id.entry
                if message_id.ledger != ledger or entry < first or entry > last:
                    held, ledger, first, last = acked.span(message_id)
                if held:
                    pending = message_id
                    continue
                if pending is not None:
                    kept.append(pending)
                    pending = None
                kept.append(message_id)
            if pending is not None:
                kept.append(pending)
            if len(kept) < len(ids):
                ids.clear()
                ids.extend(kept)
        self.ids_limit = max(2 * len(ids), _COMPACT_FLOOR)

    def state(self) -> CursorState:
        """The state to save: O(runs of `acked`), not O(ids acknowledged)."""
        return CursorState(self.mark_delete, self.acked.freeze())
