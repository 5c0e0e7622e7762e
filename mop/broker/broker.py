"""The broker: topics, the registry of subscriptions with the trie of their selectors, publish
routing (with producer deduplication), delayed redelivery, cursor resets, trimming and recovery,
over a `Storage`. It imports no trio: callers supply the time for delays and do the waiting.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from mop.backlog_quota import BacklogQuota, BacklogQuotas, QuotaKind
from mop.broker.compaction import CompactedTopics
from mop.broker.cursor import Cursor, Entry
from mop.broker.delays import DelayQueue
from mop.broker.dispatch import Attachment
from mop.broker.errors import ConsumerBusy
from mop.broker.grace import UnsubscribedGrace
from mop.broker.history import history_cut
from mop.broker.positions import (
    id_before,
    last_message,
    mark_for_time,
    trim_point,
)
from mop.broker.producers import ProducerRegistry, SequenceBook, Sequenced
from mop.broker.quotas import QuotaGuard
from mop.broker.storage.api import CursorKey, CursorState, Storage, StorageError
from mop.broker.storage.ranges import IdRanges, IdRangeSet
from mop.broker.subscription import (
    READ_AHEAD,
    READ_AHEAD_BYTES,
    Bookkeeping,
    Subscription,
    over_spill_bound,
    wants_chunk,
)
from mop.broker.topic import NON_PERSISTENT, Topic, Topics, payload_size
from mop.clock import now_ms
from mop.log_limit import LimitedLog
from mop.message import RETAINED, Delivery, Message, MessageId
from mop.messaging import StartPosition, SubscriptionSpec, TopicBusy
from mop.retention import RetentionPolicies, RetentionPolicy
from mop.topic_names import is_exact_selector, namespace_of
from mop.topics import SubscriptionTrie, matches

__all__ = [
    "BROKER_TABLE_PREFIX",
    "BACKLOG_QUOTA_TABLE",
    "PRODUCERS_TABLE",
    "RETENTION_TABLE",
    "SUBSCRIPTIONS_TABLE",
    "TOPICS_TABLE",
    "Broker",
    "BrokerStats",
    "Published",
]

# Tables of the broker itself; their names start with BROKER_TABLE_PREFIX.
BROKER_TABLE_PREFIX = "$broker/"
# Durable subscriptions (type, selectors, members), for recovery.
SUBSCRIPTIONS_TABLE = "$broker/subscriptions"
# The last sequence id of each application-named producer: "{topic}\n{name}" -> decimal.
PRODUCERS_TABLE = "$broker/producers"
# Retention policies set at run time: "tenant/namespace" -> `RetentionPolicy.to_json()`.
RETENTION_TABLE = "$broker/retention"
# Backlog quotas set at run time: "tenant/namespace" -> `BacklogQuotas.saved()`.
BACKLOG_QUOTA_TABLE = "$broker/backlog_quotas"
# Persistent topics opened by a producer before they held a message: name -> b"". As in
# Pulsar, a topic exists from its first producer on (listed, found by pattern consumers and
# wildcard subscriptions), across restarts, until it is deleted.
TOPICS_TABLE = "$broker/topics"

_failures = LimitedLog(logging.getLogger(__name__))


class _Start(Enum):
    LATEST = "latest"  # from the next message published
    EARLIEST = "earliest"  # from the first stored message
    AT = "at"  # from a given message id
    RECOVER = "recover"  # from the saved cursor, or the first stored message without one


@dataclass(slots=True)  # not frozen: one is made per message, and frozen ones cost more to make
class Published:
    message_id: MessageId
    subscriptions: int  # how many subscriptions the message was routed to
    duplicate: bool = False  # not stored: the producer had sent this sequence id already


@dataclass(frozen=True, slots=True)
class BrokerStats:
    topics: int
    subscriptions: int
    consumers: int
    messages_stored: int  # entries in storage: a Pulsar batch is one
    messages_backlog: int  # waiting for a consumer (delayed ones included; batches unpacked)
    messages_unacked: int  # dispatched to a consumer and not yet acknowledged
    messages_dropped: int  # by the max_backlog rule, since start
    messages_expired: int  # dropped at dispatch because `expires_at` had passed, since start
    messages_unrouted: int = 0  # stored where no subscription took them, since start


class Broker:
    """Routes published messages to subscriptions and keeps their state in `storage`.

    Every method that changes cursors saves the durable ones through the storage before it
    returns (buffered: made durable by the storage's next sync). Async methods are the ones
    that wait for storage; nothing else blocks.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        tenant: str = "public",
        namespace: str = "default",
        clock: Callable[[], float] = now_ms,
        unsubscribed_grace: float = 0.0,
        retention: RetentionPolicies | None = None,
        retention_check: float = 10.0,
        backlog_quotas: BacklogQuotas | None = None,
    ) -> None:
        self.storage = storage
        self.tenant = tenant
        self.namespace = namespace
        self._books = Bookkeeping(clock)
        self._topics = Topics(tenant=tenant, namespace=namespace)
        self._subs: dict[str, Subscription] = {}
        self._trie: SubscriptionTrie[str, Subscription] = SubscriptionTrie()
        self._delayed = DelayQueue()
        self._trim_dirty: set[Topic] = set()
        # Messages stored where no subscription took them, tables' records apart
        # (`stats().messages_unrouted`).
        self.unrouted = 0
        # Topics with messages routed once the storage has written them, and how many calls.
        self._held: dict[Topic, int] = {}
        # Told when messages with a `deliver_at` were offered after their write, so that the
        # caller's clock for scheduled messages looks again (it was told at the publish, before
        # they were offered).
        self.on_scheduled: Callable[[], None] | None = None
        self._grace = UnsubscribedGrace(unsubscribed_grace)
        # Without policies nothing acknowledged is kept (Pulsar's own default).
        self.retention = retention if retention is not None else RetentionPolicies()
        self.retention.on_change = self._retention_changed
        # Topics that keep acknowledged history: looked at again on each append (a size
        # limit may now reach into it), and those under a time limit also when their oldest
        # kept message ages out (`_aging`, a heap of (wall-clock due, order, topic); an
        # entry is live while `_aging_due` holds its due), but no sooner than
        # `retention_check` seconds after their last look. No pass visits every topic.
        self._history: set[Topic] = set()
        self._retention_check = retention_check
        self._aging: list[tuple[float, int, Topic]] = []
        self._aging_due: dict[Topic, float] = {}
        self._aging_order = itertools.count()
        # Backlog quotas: checked on each trimming pass; producers of a topic over one may
        # be refused (`quota.refuse`).
        self.quota = QuotaGuard(storage, backlog_quotas)
        self.compacted = CompactedTopics(storage, tenant=tenant)
        self._seq = itertools.count()
        self.producers = ProducerRegistry()
        self.sequences = SequenceBook()

    # -- lookups ---------------------------------------------------------------------------

    def now(self) -> float:
        """The broker's wall clock, in seconds (the stats' times are on it)."""
        return self._books.clock() / 1000

    def topic(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def subscription(self, name: str) -> Subscription | None:
        return self._subs.get(name)

    # -- publish ---------------------------------------------------------------------------

    async def publish(
        self, topic: str, message: Message, *, sequence: Sequenced | None = None
    ) -> Published:
        """Store and route a message; waits for the storage sync when `message.qos` >= 1."""
        published = self.store(topic, message, sequence=sequence)
        if message.qos and not published.duplicate and not topic.startswith(NON_PERSISTENT):
            await self.storage.sync()
        return published

    def store(
        self, topic: str, message: Message, *, sequence: Sequenced | None = None
    ) -> Published:
        """Store and route a message without waiting for the storage sync: messages take their
        place in call order, and are durable once a later `storage.sync()` returns. A message
        of a non-persistent topic is not stored, and goes only to attached consumers. One whose
        sequence id its producer sent before is dropped (`duplicate`)."""
        if sequence is not None and self.sequences.is_duplicate(topic, sequence):
            return Published(MessageId(-1, -1), 0, duplicate=True)
        if self.quota.blocked:
            self.quota.refuse(topic)
        node = self._topics.get(topic)
        created = node is None
        if node is None:
            node = self._create_topic(topic)
        if node.persistent:
            try:
                message_id = self.storage.append(topic, (message,))[0]
            except BaseException:
                if created:
                    self._forget_if_unused(node)
                raise
            if topic in self.compacted:
                self.compacted.record(topic, message_id, message)
        else:
            message_id = node.next_transient_id()
        node.last_id = message_id
        if message.batch:
            node.messages_in += len(message.batch)
            node.bytes_in += payload_size(message)
            node.batched = True
        else:
            node.messages_in += 1
            node.bytes_in += len(message.payload)
        if sequence is not None:
            saved = self.sequences.record(topic, sequence)
            if saved is not None:
                self.storage.table_put(PRODUCERS_TABLE, *saved)
        count = len(node.cursors)
        if count:
            self._route(node, [Entry(topic, message_id, message)], hold=bool(message.qos))
            if node in self._history:
                self._trim_dirty.add(node)
        else:
            self._pass(node, [message_id], (message,), hold=bool(message.qos))
            self._trim_dirty.add(node)
            # A table's record is no message, and a retained message is kept.
            if topic not in self.compacted and RETAINED not in message.properties:
                self.unrouted += message.count
        return Published(message_id, count)

    def store_many(self, topic: str, messages: Sequence[Message]) -> tuple[list[MessageId], int]:
        """`store` for consecutive messages of one topic, without producer sequences: one
        storage append and one pass of routing for them all. Returns their ids and how many
        subscriptions each was routed to. All or nothing: an error stores none of them."""
        if not messages:
            return [], 0
        if self.quota.blocked:
            self.quota.refuse(topic)
        node = self._topics.get(topic)
        created = node is None
        if node is None:
            node = self._create_topic(topic)
        persistent = node.persistent
        if persistent:
            try:
                ids = self.storage.append(topic, messages)
            except BaseException:
                if created:
                    self._forget_if_unused(node)
                raise
            if topic in self.compacted:
                for message_id, message in zip(ids, messages, strict=True):
                    self.compacted.record(topic, message_id, message)
            node.last_id = ids[-1]
        else:
            ids = []
            for _ in messages:
                node.last_id = node.next_transient_id()
                ids.append(node.last_id)
        node.count_in(messages)
        count = len(node.cursors)
        if count:
            entries = [Entry(topic, i, m) for i, m in zip(ids, messages, strict=True)]
            self._route(node, entries, hold=any(m.qos for m in messages))
            if node in self._history:
                self._trim_dirty.add(node)
        else:
            self._pass(node, ids, messages, hold=any(m.qos for m in messages))
            self._trim_dirty.add(node)
            if topic not in self.compacted:
                self.unrouted += sum(m.count for m in messages if RETAINED not in m.properties)
        return ids, count

    def _route(self, node: Topic, entries: list[Entry], *, hold: bool) -> None:
        """Offer new messages of `node` to its subscriptions, or with `hold` (messages of
        QoS >= 1 of a persistent topic) once the storage has written them: a message whose
        write fails is refused, its publisher is told so and sends it again, so it must not
        have been delivered. QoS 0 messages go at once (at most once: if their write fails
        they may have been delivered and are not stored), unless messages of their topic are
        held, which they follow to keep the topic's order."""
        if not node.persistent:
            self._offer(node, entries)
        elif hold or node in self._held:
            self._held[node] = self._held.get(node, 0) + 1
            self.storage.when_written(functools.partial(self._release, node, entries))
        else:
            self._offer(node, entries)

    def _pass(
        self, node: Topic, ids: list[MessageId], messages: Sequence[Message], *, hold: bool
    ) -> None:
        """`_route` for messages of a topic no cursor follows: a cursor made before their write
        is done reads its stored backlog only up to them (`Topic.routed_id`), so they are
        routed, to it, once written."""
        if not (ids and node.persistent):
            return
        if hold or node in self._held:
            entries = [Entry(node.name, i, m) for i, m in zip(ids, messages, strict=True)]
            self._route(node, entries, hold=True)
        else:
            node.routed_id = ids[-1]

    def _unhold(self, node: Topic) -> None:
        held = self._held[node] - 1
        if held:
            self._held[node] = held
        else:
            del self._held[node]

    def _release(self, node: Topic, entries: list[Entry], written: bool) -> None:
        self._unhold(node)
        if written:
            self._offer(node, entries)
            if self.on_scheduled is not None and any(e.message.deliver_at for e in entries):
                self.on_scheduled()

    def _offer(self, node: Topic, entries: list[Entry]) -> None:
        node.routed_id = entries[-1].message_id
        persistent = node.persistent
        for cursor in node.cursors:
            if cursor.catching_up or not (persistent or cursor.sub.attachments):
                continue  # one catching up reads these from storage in turn
            # A cursor made since the messages were held starts after them. Their ids go up
            # (one topic's, in order): when the first is past the start, so are the rest.
            start = cursor.ids[-1] if cursor.ids else cursor.mark_delete
            offer = cursor.sub.offer
            if start is None or entries[0].message_id > start:
                for entry in entries:
                    offer(cursor, entry)
            else:
                for entry in entries:
                    if entry.message_id > start:
                        offer(cursor, entry)
            if (
                persistent
                and over_spill_bound(cursor)
                and not cursor.sub.max_backlog  # bounded by its own rule (MQTT sessions)
                and not cursor.loading
                and node.name not in self.compacted
            ):
                cursor.sub.spill(cursor)
        if self._books.changed:
            self._flush()

    # -- topics ----------------------------------------------------------------------------

    def topics(self, namespace: str) -> list[str]:
        """Every topic of `namespace` ("tenant/namespace"), persistent or not."""
        return self._topics.in_namespace(namespace)

    def open_topic(self, name: str) -> bool:
        """Make topic `name` exist from now on (a producer opened it); True when that was
        recorded in storage (the caller syncs it). A persistent topic that holds no message
        yet is recorded in TOPICS_TABLE, so that it stays until deleted; a non-persistent one
        lives while it has producers or subscriptions."""
        topic = self._topics.get(name)
        if topic is None:
            topic = self._create_topic(name)
        if not topic.persistent or topic.declared or topic.last_id is not None:
            return False
        topic.declared = True
        self.storage.table_put(TOPICS_TABLE, name, b"")
        return True

    def close_topic(self, name: str) -> None:
        """A producer of topic `name` is gone: an unused topic without messages goes."""
        topic = self._topics.get(name)
        if topic is not None:
            self._forget_if_unused(topic)

    def _create_topic(self, name: str) -> Topic:
        topic = self._topics.add(name, self.storage.last_id(name))
        topic.loaded_at = self.now()
        # A new topic joins every subscription whose selectors match it, from its first message
        # (only those that name it, for a topic no wildcard reaches).
        exact_only = not self._topics.wildcards_reach(name)
        for topic_filter, _, sub in self._trie.match(topic.mqtt):
            if exact_only and topic_filter != topic.mqtt:
                continue
            if name not in sub.cursors:
                sub.add_cursor(topic, topic.last_id, load=False)
        return topic

    def topic_users(self, name: str) -> tuple[int, int]:
        """How many consumers (attached to the subscriptions of topic `name`) and registered
        producers the topic has."""
        topic = self._topics.get(name)
        consumers = 0 if topic is None else sum(len(c.sub.attachments) for c in topic.cursors)
        return consumers, len(self.producers.producers(name))

    async def delete_topic(self, name: str, *, force: bool = False) -> bool:
        """Delete topic `name`: its stored messages, the positions of its subscriptions on it
        (their backlog of it goes, also from their consumers) and its producers' sequence ids.
        The subscriptions stay with their selectors: a message published to the name again
        creates a new topic, which joins the subscriptions that match it from that message.

        Raises TopicBusy while consumers or producers are connected, unless `force` (they
        stay connected: the producers' next messages create the topic again). A compacted
        topic (a table) cannot be deleted. False when there is no such topic."""
        topic = self._topics.get(name)
        if topic is None:
            return False
        if name in self.compacted:
            raise TopicBusy(f"{name} holds a table of the broker; it cannot be deleted")
        consumers, producers = self.topic_users(name)
        if (consumers or producers) and not force:
            raise TopicBusy(
                f"{name} has {consumers} consumer(s) and {producers} producer(s) connected"
            )
        for cursor in list(topic.cursors):
            sub = cursor.sub
            sub.drop_cursor(cursor)
            if sub.durable:
                self.storage.save_cursors({(name, sub.name): None})
        self._topics.discard(topic)
        self._trim_dirty.discard(topic)
        self._history.discard(topic)
        self._aging_due.pop(topic, None)
        self._grace.forget(topic)
        for key in self.sequences.forget(name):
            self.storage.table_put(PRODUCERS_TABLE, key, None)
        if topic.declared:
            self.storage.table_put(TOPICS_TABLE, name, None)
        if topic.persistent:
            self.storage.delete_topic(name)
            await self.storage.sync()
        return True

    def _forget_if_unused(self, topic: Topic) -> None:
        # Topics made by an exact subscribe that never saw a message need not outlive it
        # (so idle MQTT subscriptions leave nothing behind); a persistent producer's topic
        # stays. A non-persistent topic lives while it has producers or attached consumers:
        # it keeps nothing for the others, and comes back with its next producer or message,
        # joining the subscriptions that match it then.
        if self._topics.get(topic.name) is not topic or self.producers.producers(topic.name):
            return
        if topic.persistent:
            if topic.cursors or topic.last_id is not None or topic.declared:
                return
        elif any(cursor.sub.attachments for cursor in topic.cursors):
            return
        for cursor in list(topic.cursors):
            cursor.sub.drop_cursor(cursor)  # never saved: the topic is not persistent
        self._topics.discard(topic)
        self._trim_dirty.discard(topic)

    # -- subscriptions ---------------------------------------------------------------------

    async def subscribe(
        self,
        spec: SubscriptionSpec,
        *,
        capacity: int = 1000,
        on_ready: Callable[[], None] | None = None,
        on_active: Callable[[bool], None] | None = None,
    ) -> Attachment:
        """Attach a consumer to subscription `spec.name`, creating it or updating it to the
        spec's selectors and options. An existing subscription keeps its cursors (and so its
        backlog and the messages its last consumer left unacknowledged, which come first).

        New cursors start after the last message, at the first stored one (`spec.start`) or at
        `spec.start_at` (inclusive). See `Attachment` for `capacity` and the callbacks."""
        name, type, member = spec.name, spec.kind, spec.member
        durable, max_backlog = spec.durable, spec.max_backlog
        sub = self._subs.get(name)
        created = sub is None
        if sub is None:
            sub = Subscription(
                name, type, durable=durable, max_backlog=max_backlog, books=self._books
            )
            self._subs[name] = sub
        else:
            sub.admit(type, member)
            if sub.durable and not durable:
                self._forget_persisted(sub)
            elif durable and not sub.durable:
                self._books.changed.update(sub.cursors.values())  # saved by _flush below
            sub.durable = durable
            sub.max_backlog = max_backlog
        wanted = set(spec.selectors)
        start = _Start.EARLIEST if spec.start is StartPosition.EARLIEST else _Start.LATEST
        mark = None
        if spec.start_at is not None:
            start, mark = _Start.AT, id_before(spec.start_at)
        loads: list[tuple[Cursor, CursorState | None]] = []
        try:
            for selector in [s for s in sub.selectors if s not in wanted]:
                self._remove_selector(sub, selector)
            for selector in wanted:
                if selector not in sub.selectors:
                    self._add_selector(sub, selector, start, loads, at=mark)
        except BaseException:
            # A selector that names no valid topic: do not leave a half-made subscription.
            if created:
                self._drop_subscription(sub)
            raise
        sub.members.add(member)
        att = sub.attach(Attachment(sub, spec, next(self._seq), capacity, on_ready, on_active))
        self._persist(sub)
        self._flush()
        try:
            for cursor, state in loads:
                await self._load(cursor, state)
            if sub.durable:
                await self.storage.sync()
        except BaseException:
            self.close(att)
            raise
        return att

    async def add_selector(self, sub: Subscription, selector: str) -> None:
        """Add a selector; topics it matches join from their next message."""
        if selector in sub.selectors or self._subs.get(sub.name) is not sub:
            return
        self._add_selector(sub, selector, _Start.LATEST, [])
        await self._save(sub)

    async def remove_selector(self, sub: Subscription, selector: str) -> None:
        """Remove a selector; topics no remaining selector matches leave with their backlog."""
        if selector not in sub.selectors or self._subs.get(sub.name) is not sub:
            return
        self._remove_selector(sub, selector)
        await self._save(sub)

    async def _save(self, sub: Subscription) -> None:
        self._persist(sub)
        self._flush()
        if sub.durable:
            await self.storage.sync()

    def _add_selector(
        self,
        sub: Subscription,
        selector: str,
        start: _Start,
        loads: list[tuple[Cursor, CursorState | None]],
        saved: dict[CursorKey, CursorState] | None = None,
        *,
        at: MessageId | None = None,
    ) -> None:
        topic_filter = self._topics.filter_for(selector)
        sub.selectors[selector] = topic_filter
        self._trie.add(topic_filter, sub.name, sub)
        if is_exact_selector(selector):
            name = self._topics.name_for(selector)
            topic = self._topics.get(name)
            if topic is None:
                self._create_topic(name)  # attaches `sub` too, through the trie
                return
            topics = [topic]
        else:
            topics = self._topics.matching(topic_filter)
        for topic in topics:
            if topic.name in sub.cursors:
                continue
            if start is _Start.LATEST:
                sub.add_cursor(topic, topic.last_id, load=False)
                continue
            state = None
            if start is _Start.RECOVER and saved is not None:
                state = saved.pop((topic.name, sub.name), None)
            elif start is _Start.AT and at is not None:
                state = CursorState(at)
            mark = None if state is None else state.mark_delete
            loads.append((sub.add_cursor(topic, mark, load=True), state))

    def _remove_selector(self, sub: Subscription, selector: str) -> None:
        topic_filter = sub.selectors.pop(selector)
        remaining = set(sub.selectors.values())
        if topic_filter not in remaining:
            self._trie.remove(topic_filter, sub.name)
        for cursor in list(sub.cursors.values()):
            mqtt = cursor.topic.mqtt
            if matches(topic_filter, mqtt) and not any(matches(f, mqtt) for f in remaining):
                self._drop_cursor(cursor)

    def _drop_cursor(self, cursor: Cursor) -> None:
        sub = cursor.sub
        sub.drop_cursor(cursor)
        if sub.durable:
            self.storage.save_cursors({(cursor.topic.name, sub.name): None})
        self._trim_dirty.add(cursor.topic)
        self._forget_if_unused(cursor.topic)

    def _persist(self, sub: Subscription) -> None:
        if sub.durable:
            self.storage.table_put(SUBSCRIPTIONS_TABLE, sub.name, sub.record())

    def _forget_persisted(self, sub: Subscription) -> None:
        self.storage.table_put(SUBSCRIPTIONS_TABLE, sub.name, None)
        self.storage.save_cursors({(topic, sub.name): None for topic in sub.cursors})

    def _drop_subscription(self, sub: Subscription) -> None:
        for cursor in list(sub.cursors.values()):
            self._drop_cursor(cursor)
        for topic_filter in set(sub.selectors.values()):
            self._trie.remove(topic_filter, sub.name)
        sub.selectors.clear()
        del self._subs[sub.name]
        if sub.durable:
            self.storage.table_put(SUBSCRIPTIONS_TABLE, sub.name, None)

    # -- consumers -------------------------------------------------------------------------

    def take(self, att: Attachment, max_messages: int) -> list[Delivery]:
        """Up to `max_messages` messages dispatched to `att`; [] when none is queued."""
        if att.closed or not att.queue:
            return []
        taken = att.sub.take(att, max_messages)
        self._flush()
        return taken

    def ack(self, att: Attachment, deliveries: Iterable[Delivery]) -> None:
        if att.closed:
            return
        att.sub.ack(att, deliveries)
        self._flush()

    def nack(
        self, att: Attachment, deliveries: Iterable[Delivery], *, due: float | None = None
    ) -> None:
        """Hand messages back for redelivery: now, or at `due` on the clock that the caller
        also passes to `release_due`."""
        if att.closed:
            return
        back = att.sub.nack(att, deliveries)
        if due is None:
            self._return(back)
        else:
            for cursor, entry in back:
                self._delayed.push(due, cursor, entry)

    def ack_through(self, att: Attachment, topic: str, message_id: MessageId) -> None:
        """Cumulative acknowledgement of `topic` up to `message_id` for the subscription."""
        if att.closed:
            return
        att.sub.ack_through(topic, message_id)
        self._flush()

    def grant(self, att: Attachment, permits: int) -> None:
        """Let a credit-based consumer be sent `permits` more messages."""
        if not att.closed:
            att.sub.grant(att, permits)
            self._flush()

    def next_due(self) -> float | None:
        """When the earliest delayed redelivery is due, if there is one."""
        return self._delayed.next_due()

    def release_due(self, now: float) -> int:
        """Return delayed messages that are due to their subscriptions; how many were due."""
        back = self._delayed.pop_due(now)
        self._return(back)
        return len(back)

    def next_scheduled(self) -> float | None:
        """When the earliest message held back until its `deliver_at` is due (wall clock ms)."""
        return self._books.held.next_due()

    def release_scheduled(self) -> int:
        """Hand the held messages that are due to their subscriptions; how many were due."""
        back = self._books.held.pop_due(self._books.clock())
        self._return(back)
        return len(back)

    def _return(self, back: list[tuple[Cursor, Entry]]) -> None:
        grouped: dict[Cursor, list[Entry]] = {}
        for cursor, entry in back:
            # A message may have been acknowledged (cumulatively) while it waited.
            if cursor.attached and not cursor.is_acked(entry.message_id):
                grouped.setdefault(cursor, []).append(entry)
        subs = {cursor.sub for cursor in grouped}
        for cursor, entries in grouped.items():
            cursor.sub.return_front(cursor, entries)
        for sub in subs:
            sub.pump()
        self._flush()

    def close(self, att: Attachment) -> None:
        """Detach a consumer. A non-durable subscription goes with its last consumer."""
        if att.closed:
            return
        sub = att.sub
        sub.detach(att)
        if not sub.durable and self._subs.get(sub.name) is sub:
            if not any(other.member == att.member for other in sub.attachments):
                sub.members.discard(att.member)
            if not sub.attachments:
                self._drop_subscription(sub)
        self._forget_transient_of(sub)
        self._flush()

    async def unsubscribe(self, att: Attachment) -> None:
        """Detach a consumer and remove its member; the subscription goes with its last one."""
        sub = att.sub
        if not att.closed:
            sub.detach(att)
        if self._subs.get(sub.name) is not sub:
            return
        if not any(other.member == att.member for other in sub.attachments):
            sub.members.discard(att.member)
        self._forget_transient_of(sub)
        await self._after_member_change(sub)

    def _forget_transient_of(self, sub: Subscription) -> None:
        """Forget the non-persistent topics of `sub` that its last consumer leaves unused."""
        if not sub.attachments:
            for cursor in list(sub.cursors.values()):
                if not cursor.topic.persistent:
                    self._forget_if_unused(cursor.topic)

    async def delete_subscription(self, name: str, member: str = "") -> None:
        """Remove an offline member; the subscription goes with its last member."""
        sub = self._subs.get(name)
        if sub is None:
            return
        if any(att.member == member for att in sub.attachments):
            raise ConsumerBusy(f"member {member!r} of {name!r} has a consumer attached")
        sub.members.discard(member)
        await self._after_member_change(sub)

    async def _after_member_change(self, sub: Subscription) -> None:
        if not sub.members and not sub.attachments:
            self._drop_subscription(sub)
        else:
            self._persist(sub)
        self._flush()
        if sub.durable:
            await self.storage.sync()

    # -- positions -------------------------------------------------------------------------

    async def position(
        self, sub: Subscription, topic: str
    ) -> tuple[MessageId | None, MessageId | None]:
        """The last message of `topic` that can still be read (with the index of its last batch
        message, for a batch; None when every message is trimmed) and where the subscription's
        acknowledgements stand on it (its mark_delete)."""
        node = self._topics.get(topic)
        if topic in self.compacted:
            last = self.compacted.last(topic)  # what a reader from the earliest gets last
        else:
            last = None if node is None else await last_message(self.storage, node)
        cursor = sub.cursors.get(topic)
        return last, None if cursor is None else cursor.mark_delete

    async def reset(
        self,
        sub: Subscription,
        topic: str,
        *,
        message_id: MessageId | None = None,
        publish_time: int | None = None,
    ) -> None:
        """Move the subscription on `topic` back or forward: to `message_id` (inclusive), or to
        the first message published at or after `publish_time` (ms), or with neither to the
        first stored message. Acknowledgements after that point are forgotten, and messages
        its consumers hold are taken back without counting a redelivery."""
        cursor = sub.cursors.get(topic)
        if cursor is None or self._subs.get(sub.name) is not sub:
            return
        if publish_time is not None:
            mark = await mark_for_time(self.storage, topic, publish_time, cursor.topic.last_id)
        else:
            mark = None if message_id is None else id_before(message_id)
        cursor = sub.cursors.get(topic)
        if cursor is None:
            return
        node = cursor.topic
        sub.drop_cursor(cursor)
        fresh = sub.add_cursor(node, mark, load=True)
        self._flush()
        await self._load(fresh, CursorState(mark))
        if sub.durable:
            await self.storage.sync()

    # -- cursors, trimming, recovery -------------------------------------------------------

    def _flush(self) -> None:
        """Save the durable cursors that changed; note their topics for trimming."""
        changed = self._books.changed
        if not changed:
            return
        updates: dict[CursorKey, CursorState | None] = {}
        for cursor in changed:
            self._trim_dirty.add(cursor.topic)
            if (
                cursor.sub.durable
                and cursor.attached
                and not cursor.loading
                and (cursor.topic.persistent)
            ):
                updates[(cursor.topic.name, cursor.sub.name)] = cursor.state()
        changed.clear()
        if updates:
            self.storage.save_cursors(updates)

    def trim_acknowledged(self, now: float = 0.0) -> int:
        """Drop stored messages that every subscription of their topic has acknowledged (all
        of them, on a topic without subscriptions) once their namespace's retention policy
        lets them go (`mop.retention`), and not before their `unsubscribed_grace` has passed
        at `now` (monotonic seconds) where it applies: on a topic without subscriptions and
        on a topic trimming first saw less than the grace ago. Returns how many topics were
        trimmed."""
        self._enforce_quotas()
        dirty, self._trim_dirty = self._trim_dirty, set()
        trimmed = 0
        grace = self._grace
        wall = self.now()
        aging, aging_due = self._aging, self._aging_due
        while aging and aging[0][0] <= wall:
            due, _, topic = heapq.heappop(aging)
            if aging_due.get(topic) == due:
                del aging_due[topic]
                dirty.add(topic)
        for topic in dirty:
            if self._topics.get(topic.name) is not topic or not topic.persistent:
                grace.forget(topic)
                continue
            acknowledged = trim_point(topic)
            if topic.cursors:
                through = grace.limit_held(topic, acknowledged, now)
            else:
                through = grace.limit(topic, acknowledged, now)
            if grace.waiting(topic):
                self._trim_dirty.add(topic)
            policy = self.retention.for_topic(topic.name)
            through = history_cut(self.storage, topic.name, through, policy, wall)
            kept_after = topic.trimmed if through is None else through
            if topic.trimmed is not None and kept_after is not None:
                kept_after = max(kept_after, topic.trimmed)
            if acknowledged is not None and (kept_after is None or kept_after < acknowledged):
                # Acknowledged history stays for now (or its grace runs).
                self._history.add(topic)
                if policy.time_seconds > 0:
                    self._age_later(topic, policy.time_seconds, wall)
            else:
                self._history.discard(topic)
            if through is not None and (topic.trimmed is None or through > topic.trimmed):
                self.storage.trim(topic.name, through)
                topic.trimmed = through
                trimmed += 1
        return trimmed

    def _age_later(self, topic: Topic, seconds: int, wall: float) -> None:
        """Look at `topic` again once its oldest kept message is `seconds` old."""
        oldest = self.storage.oldest_append_time(topic.name)
        if oldest is None:
            return
        # Retention lets go of what was appended before `now - seconds` (whole seconds).
        due = max(float(oldest + seconds + 1), wall + self._retention_check)
        known = self._aging_due.get(topic)
        if known is not None and known <= due:
            return  # an earlier look is due anyway, and plans the next one
        self._aging_due[topic] = due
        heapq.heappush(self._aging, (due, next(self._aging_order), topic))

    def _enforce_quotas(self) -> None:
        """Check the backlog quotas; skip the backlog that `consumer_backlog_eviction`
        quotas let go, for every subscription behind it."""
        check = self.quota.check(self._topics.values(), self.now())
        for topic, cut in check.evict:
            for cursor in list(topic.cursors):
                if not cursor.sub.durable:
                    continue  # readers are no backlog (`mop.broker.quotas`)
                if cursor.mark_delete is None or cursor.mark_delete < cut:
                    cursor.sub.ack_through(topic.name, cut)
        if check.evict:
            self._flush()

    async def set_backlog_quota(
        self, namespace: str, kind: QuotaKind, quota: BacklogQuota | None
    ) -> None:
        """Override one backlog quota of `namespace` (None: back to the configured one),
        durably: the override outlives restarts. It is saved first (as `set_retention` does),
        and applies at the next trimming pass."""
        quotas = self.quota.quotas
        self.storage.table_put(BACKLOG_QUOTA_TABLE, namespace, quotas.saved(namespace, kind, quota))
        await self.storage.sync()
        quotas.override(namespace, kind, quota)

    def _retention_changed(self, namespace: str) -> None:
        self._trim_dirty.update(
            t for t in self._topics.values() if namespace_of(t.name) == namespace
        )

    async def set_retention(self, namespace: str, policy: RetentionPolicy | None) -> None:
        """Override the retention policy of `namespace` ("tenant/namespace"; None: back to the
        configured one), durably: the override outlives restarts."""
        self.storage.table_put(
            RETENTION_TABLE, namespace, None if policy is None else policy.to_json()
        )
        await self.storage.sync()
        self.retention.override(namespace, policy)

    async def _load(self, cursor: Cursor, state: CursorState | None) -> None:
        """Read a cursor's backlog from storage: the stored messages after its mark_delete
        that it has not acknowledged. A compacted topic's come at once; any other topic's a
        chunk at a time (`read_ahead`), the first one now, so that a cursor holds a bounded
        part of a long backlog in memory, however long it is."""
        topic = cursor.topic
        after = None if state is None else state.mark_delete
        acked = IdRanges() if state is None else state.acked
        if topic.name in self.compacted:
            await self._load_compacted(cursor, after, acked)
            return
        # What it acknowledged of the part not read yet is kept, and saved, all along.
        cursor.acked = IdRangeSet(acked)
        cursor.read_after = after
        cursor.catching_up = True
        try:
            await self._read_chunks(cursor)
        except BaseException as exc:
            if cursor.attached and cursor.loading:
                # Left catching up where it was (its backlog is still owed): the next
                # `read_ahead` of its subscription reads again.
                cursor.sub.read_chunk(cursor, [], [], caught_up=False)
                self._books.wanting.add(cursor)
                self._flush()
            if not isinstance(exc, StorageError):
                raise
            _failures.warning(
                "backlog read",
                "reading the stored backlog of %s failed, to be read again: %s",
                cursor,
                exc,
            )

    async def _load_compacted(
        self, cursor: Cursor, after: MessageId | None, acked: IdRanges
    ) -> None:
        topic = cursor.topic
        upto = topic.last_id
        try:
            ids, entries = self.compacted.backlog(topic.name, after, cursor.ids, acked)
        except BaseException:
            if cursor.attached and cursor.loading:
                # Leave the cursor usable, as if it had started after `upto`.
                if upto is not None and (cursor.mark_delete is None or cursor.mark_delete < upto):
                    cursor.mark_delete = upto
                cursor.sub.finish_load(cursor, [], [], IdRanges())
                self._flush()
            raise
        if not topic.batched and any(entry.message.batch for entry in entries):
            topic.batched = True
        if cursor.attached:
            cursor.sub.finish_load(cursor, ids, entries, acked)
            cursor.sub.pump()
            self._flush()

    @property
    def wants_reading(self) -> bool:
        """Whether `read_ahead` has chunks to read."""
        return bool(self._books.wanting)

    def wants_reading_for(self, att: Attachment) -> bool:
        """Whether `read_ahead(att)` has chunks to read."""
        sub = att.sub
        return any(cursor.sub is sub for cursor in self._books.wanting)

    async def read_ahead(self, att: Attachment | None = None) -> None:
        """Read the next chunk of each cursor that catches up with its stored backlog and has
        less than half a chunk left (`Bookkeeping.wanting`); with `att`, of the cursors of its
        subscription only. Consumers call it before they take messages, for their own
        subscription: one does not wait on, or fail with, another subscription's reads. The
        error of a read is raised; the cursor reads again at the next call."""
        wanting = self._books.wanting
        sub = None if att is None else att.sub
        while wanting:
            if sub is None:
                cursor = wanting.pop()
            else:
                found = next((c for c in wanting if c.sub is sub), None)
                if found is None:
                    return
                cursor = found
                wanting.discard(cursor)
            if cursor.attached and cursor.catching_up and not cursor.reading:
                await self._read_chunks(cursor)

    async def _read_chunks(self, cursor: Cursor) -> None:
        """Read chunks until the cursor holds half a chunk or more, or has caught up (a run
        of acknowledged messages is read past at once)."""
        while cursor.attached and cursor.catching_up and wants_chunk(cursor) and not cursor.reading:
            await self._read_chunk(cursor)

    async def _read_chunk(self, cursor: Cursor) -> None:
        topic = cursor.topic
        cursor.reading = True
        before = topic.routed_id
        try:
            page = await self.storage.read(
                topic.name, cursor.read_after, READ_AHEAD, READ_AHEAD_BYTES
            )
        except BaseException:
            cursor.reading = False
            if cursor.attached and not cursor.loading:
                self._books.wanting.add(cursor)  # to be read again
            raise
        cursor.reading = False
        if not cursor.attached:
            return
        ids: list[MessageId] = []
        entries: list[Entry] = []
        acked = cursor.acked
        # A cumulative acknowledgement while it read may have moved the cursor past part of
        # the page (`ack_through` moves `read_after` and `mark_delete` on): that part is
        # acknowledged, and neither goes back.
        skip = _later(cursor.read_after, cursor.mark_delete)
        # The page may go past what routing has passed (messages whose write is not done):
        # those are left for routing to deliver once written.
        last = topic.routed_id
        beyond = False
        for message_id, message in page:
            if skip is not None and message_id <= skip:
                continue
            if last is None or message_id > last:
                beyond = True
                break
            ids.append(message_id)
            if message_id not in acked:
                entries.append(Entry(topic.name, message_id, message))
        if ids:
            cursor.read_after = ids[-1]
        # Caught up when it read through the id routing has passed, or found nothing after
        # what it read while nothing was routed (what is left is trimmed); no await from here
        # on, so what is routed after this is routed to it.
        caught_up = (
            last is None
            or beyond
            or (cursor.read_after is not None and cursor.read_after >= last)
            or (not page and last == before)
        )
        if not topic.batched and any(entry.message.batch for entry in entries):
            topic.batched = True
        cursor.sub.read_chunk(cursor, ids, entries, caught_up)
        cursor.sub.pump()
        self._flush()

    async def recover(self) -> None:
        """Rebuild topics, durable subscriptions and their backlogs from storage. Call once,
        on a new broker, before anything else. Redelivery counts start again from 0."""
        saved = self.storage.load_cursors()
        self.retention.restore(self.storage.table_items(RETENTION_TABLE))
        self.quota.quotas.restore(self.storage.table_items(BACKLOG_QUOTA_TABLE))
        self.compacted.restore()
        for name in self.storage.topics():
            if name not in self._topics:
                self._create_topic(name)
        for name, _ in self.storage.table_items(TOPICS_TABLE):
            (self._topics.get(name) or self._create_topic(name)).declared = True
        loads: list[tuple[Cursor, CursorState | None]] = []
        for name, raw in self.storage.table_items(SUBSCRIPTIONS_TABLE):
            sub, selectors = Subscription.from_record(name, raw, self._books)
            self._subs[name] = sub
            for selector in selectors:
                self._add_selector(sub, selector, _Start.RECOVER, loads, saved)
        self.sequences.restore(self.storage.table_items(PRODUCERS_TABLE))
        # What is left belongs to subscriptions or topics that are gone.
        if saved:
            self.storage.save_cursors(dict.fromkeys(saved))
        for cursor, state in loads:
            await self._load(cursor, state)
        self._trim_dirty.update(self._topics.values())
        self._flush()

    # -- publishers that wait for subscribers ---------------------------------------------

    def wait_for_subscribers(self, waits_for: Callable[[Subscription, str], bool]) -> None:
        """`waits_for(subscription, producer)`: whether the publisher (the message's
        `producer`) of a message that has to queue for the subscription's consumers (their
        receive queues are full) will wait for them, in which case its `max_backlog` rule
        drops nothing. Asked while publishers are noted (`note_behind`), once per
        subscription and publish."""
        self._books.waits_for = waits_for

    def note_behind(self) -> None:
        """Start collecting the subscriptions that the messages routed from now on had to
        queue for (`take_behind`)."""
        self._books.noting = True

    def take_behind(self) -> list[Subscription]:
        """The subscriptions collected since `note_behind` that the publisher waits for;
        collecting stops."""
        books = self._books
        books.noting = False
        behind = books.behind
        if not behind:
            return []
        waited = [sub for sub, waits in behind.items() if waits]
        behind.clear()
        return waited

    # -- stats -----------------------------------------------------------------------------

    def on_dropped(self, callback: Callable[[str, str, int], None] | None) -> None:
        """Call `callback(subscription, reason, count)` for each message a subscription drops
        (the `max_backlog` rule), as well as counting it in `stats().messages_dropped`."""
        self._books.on_dropped = callback

    def stats(self) -> BrokerStats:
        """The broker's counts now: a walk over its subscriptions (and, on topics that had
        batches, over their backlogs' entries, to count a batch's messages)."""
        subs = self._subs.values()
        backlog = sum(_backlog(c) for sub in subs for c in sub.cursors.values())
        attachments = [att for sub in subs for att in sub.attachments]
        return BrokerStats(
            topics=len(self._topics),
            subscriptions=len(self._subs),
            consumers=len(attachments),
            messages_stored=self.storage.stats().messages,
            messages_backlog=backlog + self._delayed.messages() + self._books.held.messages(),
            messages_unacked=sum(len(att.queue) + len(att.unacked) for att in attachments),
            messages_dropped=self._books.dropped,
            messages_expired=self._books.expired,
            messages_unrouted=self.unrouted,
        )

    def largest_backlogs(self, limit: int) -> list[tuple[str, str, int]]:
        """The `limit` largest backlogs (messages waiting for a consumer) as (subscription,
        topic, messages), largest first: a walk over every cursor, for the metrics."""
        if limit <= 0:
            return []
        backlogs = (
            (_backlog(cursor), name, topic)
            for name, sub in self._subs.items()
            for topic, cursor in sub.cursors.items()
            if cursor.backlog
        )
        return [(name, topic, size) for size, name, topic in heapq.nlargest(limit, backlogs)]


def _backlog(cursor: Cursor) -> int:
    """The messages waiting in `cursor`'s backlog: a batch counts its messages. Only a topic
    that had batches walks its entries; otherwise one entry is one message."""
    if cursor.topic.batched:
        return sum(entry.message.count for entry in cursor.backlog)
    return len(cursor.backlog)


def _later(first: MessageId | None, second: MessageId | None) -> MessageId | None:
    """The later of two ids, either of which may be missing."""
    if first is None:
        return second
    if second is None:
        return first
    return max(first, second)
