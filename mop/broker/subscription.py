"""Subscriptions, their cursors (one per matching topic) and how messages move through them to
attached consumers (`mop.broker.dispatch`). Plain objects and plain calls, with no I/O and no
trio, so every rule can be tested directly; `Broker` drives them and talks to storage.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable

from mop.broker.cursor import Cursor, Entry
from mop.broker.delays import DelayQueue
from mop.broker.dispatch import PICKERS, Attachment
from mop.broker.errors import ConsumerBusy, SubscriptionMismatch
from mop.broker.storage.ranges import IdRanges
from mop.broker.topic import Topic, payload_size
from mop.message import Delivery, MessageId
from mop.messaging import QUEUE_FULL, SubscriptionKind

__all__ = [
    "READ_AHEAD",
    "READ_AHEAD_BYTES",
    "Bookkeeping",
    "Subscription",
    "over_spill_bound",
    "wants_chunk",
]

# A cursor catching up with its stored backlog reads it in chunks of this many entries, the
# next one once its backlog holds less than half a chunk: what it holds stays under 1.5 chunks.
READ_AHEAD = 1000
# ... and of about this many bytes at most, by the same rule (a chunk of 1000 entries of large
# batches could be gigabytes).
READ_AHEAD_BYTES = 16 * 1024 * 1024
# A cursor that has caught up is handed what is published in memory; once its backlog (what its
# consumers have no room for) is past this many entries or payload bytes, it keeps half a chunk
# and reads the rest back from storage as one catching up does (`Subscription.spill`).
SPILL_AT = 2 * READ_AHEAD
SPILL_AT_BYTES = READ_AHEAD_BYTES
# What a batch delivery acknowledged already, when nothing was (the usual case).
_NONE_ACKED: frozenset[int] = frozenset()


class Bookkeeping:
    """What the subscription logic reports to the broker: cursors whose state changed since the
    broker last looked (to save them and to consider their topic for trimming) and drop
    counters. `clock` gives the wall clock in milliseconds, for message expiry.
    `on_dropped(subscription, reason, count)`, when set, hears of each drop as it happens.
    `behind`, while a caller notes it (`noting`, see `Broker.note_behind`), collects the
    subscriptions with consumers that a message had to queue for (their consumers' receive
    queues are full), each with whether the publisher waits for it (`waits_for(subscription,
    producer)`, asked once per subscription): while it does, the `max_backlog` rule does not
    drop for it, the publisher is held back instead."""

    __slots__ = (
        "behind",
        "changed",
        "clock",
        "dropped",
        "expired",
        "held",
        "noting",
        "on_dropped",
        "waits_for",
        "wanting",
    )

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.changed: set[Cursor] = set()
        # Cursors catching up with their stored backlog whose next chunk is due (see `pump`).
        self.wanting: set[Cursor] = set()
        self.dropped = 0
        self.on_dropped: Callable[[str, str, int], None] | None = None
        self.expired = 0
        # Messages held back until their `deliver_at` (on `clock`).
        self.held = DelayQueue()
        self.noting = False
        self.behind: dict[Subscription, bool] = {}  # emptied by whoever notes it
        self.waits_for: Callable[[Subscription, str], bool] = _waits_for_none


def _waits_for_none(sub: Subscription, producer: str) -> bool:
    return False


def wants_chunk(cursor: Cursor) -> bool:
    """Whether a cursor's backlog holds less than half a chunk, in entries and in bytes (an
    empty one always does, whatever its byte count says)."""
    backlog = cursor.backlog
    return len(backlog) < READ_AHEAD // 2 and (
        not backlog or cursor.backlog_bytes < READ_AHEAD_BYTES // 2
    )


def over_spill_bound(cursor: Cursor) -> bool:
    """Whether a cursor's backlog is past what it holds in memory before it spills."""
    return len(cursor.backlog) > SPILL_AT or cursor.backlog_bytes > SPILL_AT_BYTES


def _by_id(entry: Entry) -> MessageId:
    return entry.message_id


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
        "holds",
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
        type: SubscriptionKind,
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
        self._pick = PICKERS[type]
        # Shared subscriptions hold a message back until its `deliver_at`; the others do not.
        self.holds = type in (SubscriptionKind.SHARED, SubscriptionKind.KEY_SHARED)

    def __repr__(self) -> str:
        return f"Subscription({self.name!r}, {self.type.value})"

    def admit(self, type: SubscriptionKind, member: str) -> None:
        """Check that one more consumer of `type` (and `member`) may attach."""
        if self.type is not type:
            raise SubscriptionMismatch(
                f"subscription {self.name!r} is {self.type.value}, not {type.value}"
            )
        if self.attachments and (
            type is SubscriptionKind.EXCLUSIVE
            or (member and any(att.member == member for att in self.attachments))
        ):
            who = f"member {member!r} of " if member else ""
            raise ConsumerBusy(f"{who}subscription {self.name!r} already has a consumer")

    def record(self) -> bytes:
        """What recovery needs of a durable subscription (its cursors are saved apart)."""
        return json.dumps(
            {
                "type": self.type.value,
                "selectors": sorted(self.selectors),
                "members": sorted(self.members),
                "max_backlog": self.max_backlog,
            }
        ).encode()

    @classmethod
    def from_record(
        cls, name: str, raw: bytes, books: Bookkeeping
    ) -> tuple[Subscription, list[str]]:
        """The durable subscription of a `record`, and the selectors it is to get again."""
        record = json.loads(raw)
        sub = cls(
            name,
            SubscriptionKind(record["type"]),
            durable=True,
            max_backlog=int(record["max_backlog"]),
            books=books,
        )
        sub.members.update(record["members"])
        return sub, list(record["selectors"])

    # -- routing ---------------------------------------------------------------------------

    def offer(self, cursor: Cursor, entry: Entry) -> None:
        """Route a newly published message: straight to a consumer when nothing is queued
        before it, else into the backlog. This is the per-subscription publish path."""
        cursor.ids.append(entry.message_id)
        if self.holds and self._held(cursor, entry):
            return
        if not cursor.backlog and not cursor.loading and self.attachments:
            att = self._pick(self, entry)
            if att is not None:
                att.push(entry)
                return
        self.enqueue(cursor, entry)

    def _held(self, cursor: Cursor, entry: Entry) -> bool:
        """Hold a message with a future `deliver_at` back (the broker releases it when due)."""
        due = entry.message.deliver_at
        if due and due > self.books.clock():
            self.books.held.push(due, cursor, entry)
            return True
        return False

    def enqueue(self, cursor: Cursor, entry: Entry) -> None:
        """Append to the backlog under the `max_backlog` rule: a full backlog drops its oldest
        qos-0 message to make room, or else the new message is dropped."""
        backlog = cursor.backlog
        if cursor.loading:
            # The rule is applied when loading completes, over the whole backlog in order.
            backlog.append(entry)
            cursor.backlog_bytes += payload_size(entry.message)
            return
        limit = self.max_backlog
        if (
            limit
            and len(backlog) >= limit
            and not self._waited_for(entry)
            and not self._evict_qos0(cursor)
        ):
            self._dropped()
            cursor.ack(entry.message_id)
            return
        backlog.append(entry)
        cursor.backlog_bytes += payload_size(entry.message)
        if entry.message.qos == 0:
            cursor.qos0 += 1
        self._mark_ready(cursor)
        books = self.books
        if books.noting and self.attachments and self not in books.behind:
            books.behind[self] = books.waits_for(self, entry.message.producer)

    def _waited_for(self, entry: Entry) -> bool:
        """Whether the publisher of the message being routed waits for this subscription
        (`Bookkeeping.behind`)."""
        books = self.books
        if not books.noting or not self.attachments:
            return False
        waited = books.behind.get(self)
        if waited is None:
            waited = books.behind[self] = books.waits_for(self, entry.message.producer)
        return waited

    def queued_bytes(self) -> int:
        """Payload bytes waiting in the backlogs of its cursors: beyond what its consumers'
        receive queues hold (a cursor still loading its stored backlog does not count)."""
        return sum(cursor.backlog_bytes for cursor in self.ready if not cursor.loading)

    def _evict_qos0(self, cursor: Cursor) -> bool:
        if not cursor.qos0:
            return False
        backlog = cursor.backlog
        for index, queued in enumerate(backlog):
            if queued.message.qos == 0:
                del backlog[index]
                cursor.backlog_bytes -= payload_size(queued.message)
                cursor.qos0 -= 1
                self._dropped()
                cursor.ack(queued.message_id)
                return True
        return False

    def _dropped(self) -> None:
        books = self.books
        books.dropped += 1
        if books.on_dropped is not None:
            books.on_dropped(self.name, QUEUE_FULL, 1)

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
                if self.type is not SubscriptionKind.KEY_SHARED:
                    break  # every consumer is full
                # This topic waits for its key's consumer; other topics may still move.
                blocked.append((lane, lane.popleft()))
                continue
            backlog.popleft()
            cursor.backlog_bytes -= payload_size(entry.message)
            if entry.message.qos == 0:
                cursor.qos0 -= 1
            if cursor.catching_up and wants_chunk(cursor):
                self.books.wanting.add(cursor)  # the consumer pushed to reads on
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
        cursor.backlog_bytes += sum(payload_size(entry.message) for entry in entries)
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
        acked: IdRanges,
    ) -> None:
        """Complete a backlog read from storage: `ids` are every stored id after the cursor's
        mark_delete, `entries` those not in `acked`; messages that arrived meanwhile follow."""
        cursor.ids.extendleft(reversed(ids))
        for message_id in ids:
            if message_id in acked:
                cursor.acked.add(message_id)
        cursor.settle()
        cursor.compact()  # a stalled subscription's acknowledged run is read back as ids
        arrived = list(cursor.backlog)
        cursor.backlog.clear()
        cursor.backlog_bytes = 0
        cursor.qos0 = 0
        cursor.loading = False
        for entry in entries:
            if not (self.holds and self._held(cursor, entry)):
                self.enqueue(cursor, entry)
        for entry in arrived:
            self.enqueue(cursor, entry)
        self.books.changed.add(cursor)

    def read_chunk(
        self,
        cursor: Cursor,
        ids: list[MessageId],
        entries: list[Entry],
        caught_up: bool,
    ) -> None:
        """Add a chunk of the cursor's stored backlog: `ids` are the next stored ids after the
        ones read before, `entries` those not acknowledged (the cursor's `acked` holds what
        was). With `caught_up` it was the last: new messages are routed to it from now on."""
        cursor.loading = False
        cursor.ids.extend(ids)
        cursor.settle()
        cursor.compact()
        for entry in entries:
            if not (self.holds and self._held(cursor, entry)):
                self.enqueue(cursor, entry)
        if caught_up:
            cursor.catching_up = False
        self.books.changed.add(cursor)

    def spill(self, cursor: Cursor) -> int:
        """Bound the backlog of a cursor that has caught up but whose consumers fall behind:
        drop its entries past the first half chunk and catch up from storage after the last
        id it keeps, so that what is published next is not routed to it either. Only the
        entries routed last (the tail of `ids`: none held back, with a consumer or
        acknowledged after them) of QoS >= 1 (routed once written, so storage reads them
        back) go: their redelivery counts and acknowledged batch messages stay with the
        cursor. The caller checks that the topic's messages are stored. Returns how many
        entries were dropped."""
        backlog = cursor.backlog
        ids = cursor.ids
        kept = kept_bytes = 0
        for entry in backlog:
            size = payload_size(entry.message)
            if kept >= READ_AHEAD // 2 or kept_bytes + size > READ_AHEAD_BYTES // 2:
                break
            kept += 1
            kept_bytes += size
        droppable = len(backlog) - kept
        dropped = 0
        for entry, message_id in zip(reversed(backlog), reversed(ids), strict=False):
            if dropped >= droppable or entry.message.qos == 0 or entry.message_id != message_id:
                break
            dropped += 1
        if not dropped:
            return 0
        for _ in range(dropped):
            entry = backlog.pop()
            ids.pop()
            cursor.backlog_bytes -= payload_size(entry.message)
        if cursor.returned > len(backlog):
            cursor.returned = len(backlog)
        cursor.read_after = ids[-1] if ids else cursor.mark_delete
        cursor.catching_up = True
        self._read_on(cursor)
        return dropped

    # -- consumers -------------------------------------------------------------------------

    def attach(self, att: Attachment) -> Attachment:
        self.attachments.append(att)
        # Sorted by rank and member, so that failover's active consumer is the first of them.
        self.attachments.sort(key=lambda a: (a.rank, a.member, a.seq))
        self._update_active()
        self.pump()
        return att

    def _update_active(self) -> None:
        if self.type is not SubscriptionKind.FAILOVER:
            return
        first = self.attachments[0] if self.attachments else None
        for att in self.attachments:
            active = att is first
            if att.active is not active:
                att.active = active
                if att.on_active is not None:
                    att.on_active(active)

    def detach(self, att: Attachment) -> None:
        """Remove a consumer; what it had not acknowledged goes back to the front (counted as
        a redelivery if it was taken) and on to the remaining consumers."""
        att.closed = True
        self.attachments.remove(att)
        if self.rr >= len(self.attachments):
            self.rr = 0
        self._update_active()
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
        """Hand up to `max_messages` queued entries to the consumer, dropping expired ones.

        A batch entry is one delivery for a consumer that takes batches whole, else one
        delivery per message of it not acknowledged yet (so the list may be longer)."""
        taken: list[Delivery] = []
        queue = att.queue
        unacked = att.unacked
        cursors = self.cursors
        now = 0.0
        freed = False
        entries = 0
        # What `counted` hands out, added to its counters when another cursor comes (or at
        # the end): a take is usually of one topic.
        counted: Cursor | None = None
        out = out_bytes = 0
        # QoS 0 messages of `counted` acknowledged as they are taken: acknowledged together
        # (`Cursor.ack_taken`) when another cursor comes, before any other acknowledgement
        # of it, and at the end.
        auto_acked: list[MessageId] = []
        while queue and entries < max_messages:
            entry = queue.popleft()
            cursor = cursors[entry.topic]
            if cursor is not counted:
                if counted is not None:
                    counted.messages_out += out
                    counted.bytes_out += out_bytes
                    out = out_bytes = 0
                    if auto_acked:
                        counted.ack_taken(auto_acked)
                        auto_acked.clear()
                counted = cursor
            message = entry.message
            if message.expires_at:
                now = now or self.books.clock()
                if message.expires_at <= now:
                    self.books.expired += 1
                    if auto_acked:
                        cursor.ack_taken(auto_acked)
                        auto_acked.clear()
                    cursor.ack(entry.message_id)
                    if att.credit is not None:
                        att.credit += message.count
                    freed = True
                    continue
            entries += 1
            count = cursor.redeliveries.get(entry.message_id, 0) if cursor.redeliveries else 0
            if not message.batch:
                out += message.count  # 1, or the messages of an entry kept packed
                out_bytes += len(message.payload)
                if message.qos == 0 and att.ack_qos0:
                    # At most once: acknowledged as it is taken, never tracked as unacked.
                    auto_acked.append(entry.message_id)
                    freed = True
                else:
                    unacked[(entry.topic, entry.message_id)] = entry
                if count:
                    taken.append(Delivery(entry.topic, entry.message_id, message, count))
                else:
                    delivery = entry.delivery
                    if delivery is None:
                        delivery = entry.delivery = Delivery(entry.topic, entry.message_id, message)
                    taken.append(delivery)
                continue
            unacked[(entry.topic, entry.message_id)] = entry
            out += len(message.batch)
            out_bytes += payload_size(message)
            bits = cursor.partial.get(entry.message_id, 0) if cursor.partial else 0
            if att.whole_batches:
                acked = _NONE_ACKED
                if bits:
                    acked = frozenset(i for i in range(len(message.batch)) if bits >> i & 1)
                taken.append(Delivery(entry.topic, entry.message_id, message, count, acked))
            else:
                mid = entry.message_id
                taken.extend(
                    Delivery(entry.topic, MessageId(mid.ledger, mid.entry, index), member, count)
                    for index, member in enumerate(message.batch)
                    if not bits >> index & 1
                )
        if counted is not None:
            counted.messages_out += out
            counted.bytes_out += out_bytes
            if auto_acked:
                counted.ack_taken(auto_acked)
        if freed:
            self.pump()
        return taken

    def ack(self, att: Attachment, deliveries: Iterable[Delivery]) -> None:
        """Acknowledge deliveries; one with a batch index acknowledges that message of its
        batch, and the entry once all of them are."""
        unacked = att.unacked
        cursors = self.cursors
        done = False
        for delivery in deliveries:
            mid = delivery.message_id
            key = (delivery.topic, mid.whole)
            if mid.batch_index >= 0:
                member_of = unacked.get(key)
                cursor = cursors.get(delivery.topic)
                if member_of is None or cursor is None:
                    continue
                if cursor.ack_member(member_of, mid.batch_index):
                    del unacked[key]
                    done = True
                continue
            entry = unacked.pop(key, None)
            if entry is None:
                continue  # acknowledged twice, or its topic left the subscription
            done = True
            cursor = cursors.get(entry.topic)
            if cursor is not None:
                cursor.ack(entry.message_id)
        if done:
            self.pump()

    def ack_through(self, topic: str, message_id: MessageId) -> None:
        """Cumulative acknowledgement: every message of `topic` up to `message_id` (up to and
        including that message of its batch, with a batch index), wherever it is."""
        cursor = self.cursors.get(topic)
        if cursor is None:
            return
        whole = message_id.whole
        through = whole
        if message_id.batch_index >= 0 and not self._ack_batch_prefix(cursor, message_id):
            # The rest of that batch is still owed: acknowledge through the entry before it.
            through = MessageId(whole.ledger, whole.entry - 1)
        ids = cursor.ids
        while ids and ids[0] <= through:
            cursor.ack(ids[0])
        if cursor.catching_up and (cursor.read_after is None or cursor.read_after < through):
            # Past what it read of its stored backlog: the rest of the way is acknowledged
            # too, and reading goes on after it.
            cursor.read_after = cursor.mark_delete = through
        cursor.acked.discard_through(through)
        if len(cursor.backlog) and cursor.backlog[0].message_id <= through:
            kept = [entry for entry in cursor.backlog if entry.message_id > through]
            cursor.returned = max(0, cursor.returned - (len(cursor.backlog) - len(kept)))
            cursor.backlog = deque(kept)
            cursor.backlog_bytes = sum(payload_size(entry.message) for entry in kept)
            cursor.qos0 = sum(1 for entry in kept if entry.message.qos == 0)
        self._read_on(cursor)
        for att in self.attachments:
            for key in [k for k in att.unacked if k[0] == topic and k[1] <= through]:
                del att.unacked[key]
            att.withdraw(topic, through)
        self.books.changed.add(cursor)
        self.pump()

    def _read_on(self, cursor: Cursor) -> None:
        """A cursor catching up whose backlog went below half a chunk other than by dispatch
        (which asks for the next chunk itself) asks for it, and wakes the consumers so that
        one reads it: nothing else would, as what is published meanwhile is not routed to a
        cursor catching up."""
        if not cursor.catching_up or not wants_chunk(cursor):
            return
        wanting = self.books.wanting
        if cursor in wanting:
            return
        wanting.add(cursor)
        for att in self.attachments:
            if att.on_ready is not None:
                att.on_ready()

    def _ack_batch_prefix(self, cursor: Cursor, message_id: MessageId) -> bool:
        """Acknowledge the messages of a batch entry up to `message_id`'s index; True when the
        whole entry is then acknowledged. The entry may be with a consumer, queued for one or
        back in the backlog (after a redelivery request): wherever it is, the messages after
        that index stay owed, and the acknowledged ones are left out when it is next taken."""
        whole = message_id.whole
        if whole not in cursor.ids:
            return cursor.is_acked(whole)  # acknowledged already, or not routed here
        prefix = (1 << (message_id.batch_index + 1)) - 1
        bits = cursor.partial.get(whole, 0) | prefix
        entry = self._find(cursor, whole)
        if entry is not None and bits >= (1 << len(entry.message.batch)) - 1:
            return True
        cursor.partial[whole] = bits
        return False

    def _find(self, cursor: Cursor, message_id: MessageId) -> Entry | None:
        """The entry of `message_id` if a consumer holds it or it waits for one (not when it
        waits for a delayed redelivery: the caller then does without it)."""
        key = (cursor.topic.name, message_id)
        for att in self.attachments:
            entry = att.unacked.get(key)
            if entry is not None:
                return entry
            for queued in att.queue:
                if queued.topic == key[0] and queued.message_id == message_id:
                    return queued
        for entry in cursor.backlog:
            if entry.message_id == message_id:
                return entry
        return None

    def grant(self, att: Attachment, permits: int) -> None:
        """Let a credit-based consumer be sent `permits` more messages."""
        if att.credit is not None and permits > 0:
            att.credit += permits
            self.pump()

    def nack(self, att: Attachment, deliveries: Iterable[Delivery]) -> list[tuple[Cursor, Entry]]:
        """Take messages back from a consumer, counting a redelivery; the caller puts them back
        now or after a delay (`return_front`). A batch message takes its whole entry back."""
        back: list[tuple[Cursor, Entry]] = []
        for delivery in deliveries:
            entry = att.unacked.pop((delivery.topic, delivery.message_id.whole), None)
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
        cursor.since = self.books.clock() / 1000
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
        cursor.backlog_bytes = 0
        cursor.returned = 0
        self.books.changed.discard(cursor)
        for att in self.attachments:
            att.withdraw(name)
            for key in [key for key in att.unacked if key[0] == name]:
                del att.unacked[key]
        self.pump()
