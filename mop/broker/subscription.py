"""Subscriptions, their cursors (one per matching topic) and attached consumers, and the dispatch
rules of the four subscription types. Plain objects and plain calls, with no I/O and no trio, so
every rule can be tested directly; `Broker` drives them and talks to storage.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Iterable
from enum import StrEnum

from mop.broker.storage.api import CursorState
from mop.broker.topic import Entry, Topic
from mop.message import Delivery, MessageId

__all__ = ["Attachment", "Bookkeeping", "Cursor", "Subscription", "SubscriptionType"]

_MASK64 = (1 << 64) - 1


class SubscriptionType(StrEnum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    FAILOVER = "failover"
    KEY_SHARED = "key_shared"


class Bookkeeping:
    """What the subscription logic reports to the broker: cursors whose state changed since the
    broker last looked (to save them and to consider their topic for trimming) and drop
    counters. `clock` gives the wall clock in milliseconds, for message expiry."""

    __slots__ = ("changed", "clock", "dropped", "expired")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.changed: set[Cursor] = set()
        self.dropped = 0
        self.expired = 0


def _by_id(entry: Entry) -> MessageId:
    return entry.message_id


class Cursor:
    """One subscription on one topic: what it acknowledged, and the messages it still waits
    to dispatch (`backlog`, in id order)."""

    __slots__ = (
        "acked",
        "attached",
        "backlog",
        "ids",
        "in_ready",
        "loading",
        "mark_delete",
        "qos0",
        "redeliveries",
        "returned",
        "sub",
        "topic",
    )

    def __init__(self, sub: Subscription, topic: Topic, mark_delete: MessageId | None) -> None:
        self.sub = sub
        self.topic = topic
        self.mark_delete = mark_delete
        # Every id after mark_delete routed to this cursor and not yet folded into it, in
        # order; `acked` holds those among them acknowledged out of order.
        self.ids: deque[MessageId] = deque()
        self.acked: set[MessageId] = set()
        self.backlog: deque[Entry] = deque()
        self.redeliveries: dict[MessageId, int] = {}
        self.qos0 = 0  # qos-0 entries in the backlog, so a full backlog knows if it can evict
        self.returned = 0  # entries at the front of the backlog that came back from consumers
        self.in_ready = False
        # While the backlog is being read from storage, new messages queue up behind it.
        self.loading = False
        self.attached = True

    def __repr__(self) -> str:
        return f"Cursor({self.sub.name!r}, {self.topic.name!r})"

    def ack(self, message_id: MessageId) -> None:
        if self.redeliveries:
            self.redeliveries.pop(message_id, None)
        ids = self.ids
        if ids and ids[0] == message_id:
            ids.popleft()
            self.mark_delete = message_id
            self.settle()
        elif self.mark_delete is None or message_id > self.mark_delete:
            self.acked.add(message_id)
        self.sub.books.changed.add(self)

    def settle(self) -> None:
        """Fold acknowledged ids at the front into `mark_delete`."""
        acked = self.acked
        ids = self.ids
        while acked and ids and ids[0] in acked:
            message_id = ids.popleft()
            acked.discard(message_id)
            self.mark_delete = message_id

    def state(self) -> CursorState:
        return CursorState(self.mark_delete, frozenset(self.acked))


class Attachment:
    """A consumer attached to a subscription. `queue` holds messages dispatched to it and not
    yet taken, `unacked` those taken and not yet acknowledged; together they are bounded by
    `capacity` (the receiver queue). `on_ready` is called when `queue` stops being empty."""

    __slots__ = (
        "capacity",
        "closed",
        "ident",
        "member",
        "on_ready",
        "queue",
        "seed",
        "seq",
        "sub",
        "unacked",
    )

    def __init__(
        self,
        sub: Subscription,
        member: str,
        seq: int,
        capacity: int,
        on_ready: Callable[[], None] | None,
    ) -> None:
        self.sub = sub
        self.member = member
        self.seq = seq
        self.ident = member or f"#{seq}"
        self.seed = zlib.crc32(self.ident.encode("utf-8", "surrogatepass"))
        self.capacity = capacity
        self.on_ready = on_ready
        self.queue: deque[Entry] = deque()
        self.unacked: dict[tuple[str, MessageId], Entry] = {}
        self.closed = False

    def __repr__(self) -> str:
        return f"Attachment({self.sub.name!r}, {self.ident!r})"

    @property
    def space(self) -> int:
        return self.capacity - len(self.queue) - len(self.unacked)

    def push(self, entry: Entry) -> None:
        queue = self.queue
        queue.append(entry)
        if len(queue) == 1 and self.on_ready is not None:
            self.on_ready()


Picker = Callable[["Subscription", Entry], Attachment | None]


def _pick_first(sub: Subscription, entry: Entry) -> Attachment | None:
    # Exclusive has one attachment; failover keeps them sorted, the first one is active.
    att = sub.attachments[0]
    return att if att.space > 0 else None


def _pick_round_robin(sub: Subscription, entry: Entry) -> Attachment | None:
    atts = sub.attachments
    count = len(atts)
    start = sub.rr
    for step in range(count):
        index = (start + step) % count
        att = atts[index]
        if att.space > 0:
            sub.rr = index + 1
            return att
    return None


def _mix(value: int) -> int:
    # splitmix64 finaliser: spreads a 32-bit key hash into well-mixed per-member weights.
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _pick_by_key(sub: Subscription, entry: Entry) -> Attachment | None:
    key = entry.message.key
    if key is None:
        return _pick_round_robin(sub, entry)
    # Rendezvous hashing: each key goes to the member with the highest weight for it, so a
    # key keeps its member while membership is unchanged and only the keys of a member that
    # leaves (or some keys, for one that joins) move.
    digest = zlib.crc32(key.encode("utf-8", "surrogatepass"))
    best = max(sub.attachments, key=lambda att: _mix(digest ^ (att.seed << 32)))
    return best if best.space > 0 else None


_PICKERS: dict[SubscriptionType, Picker] = {
    SubscriptionType.EXCLUSIVE: _pick_first,
    SubscriptionType.FAILOVER: _pick_first,
    SubscriptionType.SHARED: _pick_round_robin,
    SubscriptionType.KEY_SHARED: _pick_by_key,
}


class Subscription:
    """A named subscription: its selectors, members, attached consumers and cursors.

    `selectors` maps each selector as given to the filter stored in the broker's trie.
    `members` are the durable identities (e.g. client ids of a share group) that keep the
    subscription alive while offline. `ready` lists the cursors whose backlog is not empty,
    `retry` those whose backlog starts with messages returned by a consumer.
    """

    __slots__ = (
        "_pick",
        "attachments",
        "books",
        "cursors",
        "durable",
        "max_backlog",
        "members",
        "name",
        "ready",
        "retry",
        "rr",
        "selectors",
        "type",
    )

    def __init__(
        self,
        name: str,
        type: SubscriptionType,
        *,
        durable: bool,
        max_backlog: int,
        books: Bookkeeping,
    ) -> None:
        self.name = name
        self.type = type
        self.durable = durable
        self.max_backlog = max_backlog
        self.books = books
        self.selectors: dict[str, str] = {}
        self.members: set[str] = set()
        self.attachments: list[Attachment] = []
        self.cursors: dict[str, Cursor] = {}
        self.ready: deque[Cursor] = deque()
        self.retry: deque[Cursor] = deque()
        self.rr = 0
        self._pick = _PICKERS[type]

    def __repr__(self) -> str:
        return f"Subscription({self.name!r}, {self.type.value})"

    # -- routing ---------------------------------------------------------------------------

    def offer(self, cursor: Cursor, entry: Entry) -> None:
        """Route a newly published message: straight to a consumer when nothing is queued
        before it, else into the backlog. This is the per-subscription publish path."""
        cursor.ids.append(entry.message_id)
        if not cursor.backlog and not cursor.loading and self.attachments:
            att = self._pick(self, entry)
            if att is not None:
                att.push(entry)
                return
        self.enqueue(cursor, entry)

    def enqueue(self, cursor: Cursor, entry: Entry) -> None:
        """Append to the backlog under the `max_backlog` rule: a full backlog drops its oldest
        qos-0 message to make room, or else the new message is dropped."""
        backlog = cursor.backlog
        if cursor.loading:
            # The rule is applied when loading completes, over the whole backlog in order.
            backlog.append(entry)
            return
        limit = self.max_backlog
        if limit and len(backlog) >= limit and not self._evict_qos0(cursor):
            self.books.dropped += 1
            cursor.ack(entry.message_id)
            return
        backlog.append(entry)
        if entry.message.qos == 0:
            cursor.qos0 += 1
        self._mark_ready(cursor)

    def _evict_qos0(self, cursor: Cursor) -> bool:
        if not cursor.qos0:
            return False
        backlog = cursor.backlog
        for index, queued in enumerate(backlog):
            if queued.message.qos == 0:
                del backlog[index]
                cursor.qos0 -= 1
                self.books.dropped += 1
                cursor.ack(queued.message_id)
                return True
        return False

    def _mark_ready(self, cursor: Cursor) -> None:
        if not cursor.in_ready and not cursor.loading:
            cursor.in_ready = True
            self.ready.append(cursor)

    def pump(self) -> None:
        """Move backlog to consumers with space: first the messages that came back from a
        consumer (topic by topic), then the rest one message per topic in turn, so that no
        topic starves the others. Called whenever consumers gain space or backlog returns."""
        ready = self.ready
        retry = self.retry
        if not (ready or retry) or not self.attachments:
            return
        pick = self._pick
        blocked: list[tuple[deque[Cursor], Cursor]] = []
        while retry or ready:
            lane = retry if retry else ready
            cursor = lane[0]
            backlog = cursor.backlog
            done = lane is retry and cursor.returned <= 0
            if done or not backlog or cursor.loading or not cursor.attached:
                lane.popleft()
                if lane is retry:
                    cursor.returned = 0
                else:
                    cursor.in_ready = False
                continue
            entry = backlog[0]
            att = pick(self, entry)
            if att is None:
                if self.type is not SubscriptionType.KEY_SHARED:
                    break  # every consumer is full
                # This topic waits for its key's consumer; other topics may still move.
                blocked.append((lane, lane.popleft()))
                continue
            backlog.popleft()
            if entry.message.qos == 0:
                cursor.qos0 -= 1
            att.push(entry)
            if lane is retry:
                cursor.returned -= 1
            elif backlog:
                ready.rotate(-1)
            else:
                ready.popleft()
                cursor.in_ready = False
        for lane, cursor in blocked:
            lane.append(cursor)

    def return_front(self, cursor: Cursor, entries: list[Entry]) -> None:
        """Put dispatched messages back at the front of the backlog, merged in id order."""
        if not cursor.attached or not entries:
            return
        count = len(entries)
        cursor.qos0 += sum(1 for entry in entries if entry.message.qos == 0)
        entries.sort(key=_by_id)
        backlog = cursor.backlog
        last = entries[-1].message_id
        if backlog and backlog[0].message_id < last:
            while backlog and backlog[0].message_id < last:
                entries.append(backlog.popleft())
            entries.sort(key=_by_id)
        backlog.extendleft(reversed(entries))
        # Returned messages are now the first `returned` of the backlog (dispatch takes from
        # the front in id order, so everything behind them was never dispatched).
        if cursor.returned <= 0:
            cursor.returned = 0
            self.retry.append(cursor)
        cursor.returned = min(len(backlog), cursor.returned + count)
        self._mark_ready(cursor)

    def finish_load(
        self,
        cursor: Cursor,
        ids: list[MessageId],
        entries: list[Entry],
        acked: frozenset[MessageId],
    ) -> None:
        """Complete a backlog read from storage: `ids` are every stored id after the cursor's
        mark_delete, `entries` those not in `acked`; messages that arrived meanwhile follow."""
        cursor.ids.extendleft(reversed(ids))
        cursor.acked.update(message_id for message_id in ids if message_id in acked)
        cursor.settle()
        arrived = list(cursor.backlog)
        cursor.backlog.clear()
        cursor.qos0 = 0
        cursor.loading = False
        for entry in entries:
            self.enqueue(cursor, entry)
        for entry in arrived:
            self.enqueue(cursor, entry)
        self.books.changed.add(cursor)

    # -- consumers -------------------------------------------------------------------------

    def attach(
        self, member: str, seq: int, capacity: int, on_ready: Callable[[], None] | None
    ) -> Attachment:
        att = Attachment(self, member, seq, capacity, on_ready)
        self.attachments.append(att)
        # Sorted by member, so that failover's active consumer is the lowest member id.
        self.attachments.sort(key=lambda a: (a.member, a.seq))
        self.pump()
        return att

    def detach(self, att: Attachment) -> None:
        """Remove a consumer; what it had not acknowledged goes back to the front (counted as
        a redelivery if it was taken) and on to the remaining consumers."""
        att.closed = True
        self.attachments.remove(att)
        if self.rr >= len(self.attachments):
            self.rr = 0
        returned: dict[Cursor, list[Entry]] = {}
        for entry in att.unacked.values():
            cursor = self.cursors.get(entry.topic)
            if cursor is not None:
                cursor.redeliveries[entry.message_id] = (
                    cursor.redeliveries.get(entry.message_id, 0) + 1
                )
                returned.setdefault(cursor, []).append(entry)
        for entry in att.queue:
            cursor = self.cursors.get(entry.topic)
            if cursor is not None:
                returned.setdefault(cursor, []).append(entry)
        att.unacked.clear()
        att.queue.clear()
        for cursor, entries in returned.items():
            self.return_front(cursor, entries)
        self.pump()

    def take(self, att: Attachment, max_messages: int) -> list[Delivery]:
        """Hand up to `max_messages` queued messages to the consumer, dropping expired ones."""
        taken: list[Delivery] = []
        queue = att.queue
        unacked = att.unacked
        cursors = self.cursors
        now = 0.0
        freed = False
        while queue and len(taken) < max_messages:
            entry = queue.popleft()
            cursor = cursors[entry.topic]
            message = entry.message
            if message.expires_at:
                now = now or self.books.clock()
                if message.expires_at <= now:
                    self.books.expired += 1
                    cursor.ack(entry.message_id)
                    freed = True
                    continue
            unacked[(entry.topic, entry.message_id)] = entry
            count = cursor.redeliveries.get(entry.message_id, 0) if cursor.redeliveries else 0
            taken.append(Delivery(entry.topic, entry.message_id, message, count))
        if freed:
            self.pump()
        return taken

    def ack(self, att: Attachment, deliveries: Iterable[Delivery]) -> None:
        unacked = att.unacked
        cursors = self.cursors
        done = False
        for delivery in deliveries:
            entry = unacked.pop((delivery.topic, delivery.message_id), None)
            if entry is None:
                continue  # acknowledged twice, or its topic left the subscription
            done = True
            cursor = cursors.get(entry.topic)
            if cursor is not None:
                cursor.ack(entry.message_id)
        if done:
            self.pump()

    def nack(self, att: Attachment, deliveries: Iterable[Delivery]) -> list[tuple[Cursor, Entry]]:
        """Take messages back from a consumer, counting a redelivery; the caller puts them back
        now or after a delay (`return_front`)."""
        back: list[tuple[Cursor, Entry]] = []
        for delivery in deliveries:
            entry = att.unacked.pop((delivery.topic, delivery.message_id), None)
            cursor = self.cursors.get(delivery.topic)
            if entry is None or cursor is None:
                continue
            cursor.redeliveries[entry.message_id] = cursor.redeliveries.get(entry.message_id, 0) + 1
            back.append((cursor, entry))
        return back

    # -- cursors ---------------------------------------------------------------------------

    def add_cursor(self, topic: Topic, mark_delete: MessageId | None, *, load: bool) -> Cursor:
        cursor = Cursor(self, topic, mark_delete)
        cursor.loading = load
        self.cursors[topic.name] = cursor
        topic.cursors.append(cursor)
        self.books.changed.add(cursor)
        return cursor

    def drop_cursor(self, cursor: Cursor) -> None:
        """Detach from a topic: its backlog goes, and its messages leave the consumers."""
        name = cursor.topic.name
        cursor.attached = False
        del self.cursors[name]
        cursor.topic.cursors.remove(cursor)
        cursor.backlog.clear()
        cursor.returned = 0
        self.books.changed.discard(cursor)
        for att in self.attachments:
            if any(entry.topic == name for entry in att.queue):
                att.queue = deque(entry for entry in att.queue if entry.topic != name)
            for key in [key for key in att.unacked if key[0] == name]:
                del att.unacked[key]
        self.pump()
