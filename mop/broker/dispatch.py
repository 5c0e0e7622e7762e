"""Consumers attached to a subscription and, per subscription type, the rule that picks the
consumer for each message (first, round robin, or by key with rendezvous hashing). No I/O.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from mop.broker.cursor import Entry
from mop.message import MessageId
from mop.messaging import SubscriptionKind, SubscriptionSpec

if TYPE_CHECKING:
    from mop.broker.subscription import Subscription

__all__ = ["PICKERS", "Attachment", "Picker"]

_MASK64 = (1 << 64) - 1


class Attachment:
    """A consumer attached to a subscription. `queue` holds messages dispatched to it and not
    yet taken, `unacked` those taken and not yet acknowledged; together they are bounded by
    `capacity` (the receiver queue). `on_ready` is called when `queue` stops being empty, and
    when the subscription has a chunk of its stored backlog to read (see `Broker.read_ahead`).

    Options: with `credit` the consumer is also sent no more messages than it granted (a batch
    entry uses one per message); `whole_batches` consumers take a batch as one delivery;
    `rank` orders the consumers of a failover subscription (the first is active) and
    `on_active` is called when this one becomes or stops being the active one; with
    `ack_qos0` a message of qos 0 is acknowledged when the consumer takes it (at most once).
    `receiving` is the consumer's to set while it waits for messages to take (a consumer that
    does not, with messages queued, is busy with those it took: its client is slow).
    """

    __slots__ = (
        "ack_qos0",
        "active",
        "capacity",
        "closed",
        "credit",
        "ident",
        "member",
        "on_active",
        "on_ready",
        "queue",
        "rank",
        "receiving",
        "seed",
        "seq",
        "sub",
        "unacked",
        "whole_batches",
    )

    def __init__(
        self,
        sub: Subscription,
        spec: SubscriptionSpec,
        seq: int,
        capacity: int,
        on_ready: Callable[[], None] | None,
        on_active: Callable[[bool], None] | None = None,
    ) -> None:
        self.sub = sub
        self.member = member = spec.member
        self.seq = seq
        self.ident = member or f"#{seq}"
        self.seed = zlib.crc32(self.ident.encode("utf-8", "surrogatepass"))
        self.capacity = capacity
        self.credit = 0 if spec.permits else None
        self.whole_batches = spec.whole_batches
        self.rank = (spec.priority, spec.consumer_name)
        self.on_ready = on_ready
        self.on_active = on_active
        self.ack_qos0 = spec.auto_ack_qos0
        self.active = False
        self.receiving = False
        self.queue: deque[Entry] = deque()
        self.unacked: dict[tuple[str, MessageId], Entry] = {}
        self.closed = False

    def __repr__(self) -> str:
        return f"Attachment({self.sub.name!r}, {self.ident!r})"

    @property
    def space(self) -> int:
        room = self.capacity - len(self.queue) - len(self.unacked)
        credit = self.credit
        return room if credit is None or credit > room else credit

    def push(self, entry: Entry) -> None:
        queue = self.queue
        queue.append(entry)
        if self.credit is not None:
            self.credit -= entry.message.count
        if len(queue) == 1 and self.on_ready is not None:
            self.on_ready()

    def withdraw(self, topic: str, through: MessageId | None = None) -> None:
        """Remove queued messages of `topic` (up to `through`), giving back their credit."""
        queue = self.queue

        def goes(entry: Entry) -> bool:
            return entry.topic == topic and (through is None or entry.message_id <= through)

        if not any(goes(entry) for entry in queue):
            return
        kept: deque[Entry] = deque()
        for entry in queue:
            if goes(entry):
                if self.credit is not None:
                    self.credit += entry.message.count
            else:
                kept.append(entry)
        self.queue = kept


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


PICKERS: dict[SubscriptionKind, Picker] = {
    SubscriptionKind.EXCLUSIVE: _pick_first,
    SubscriptionKind.FAILOVER: _pick_first,
    SubscriptionKind.SHARED: _pick_round_robin,
    SubscriptionKind.KEY_SHARED: _pick_by_key,
}
