"""Enforcement of backlog quotas (`mop.backlog_quota`): which topics exceed a quota, which of
them block producers and how far the slowest subscriptions are skipped for the others.

A topic's backlog runs from its slowest durable subscription's position to its end; a quota
is exceeded when a message after that position is older than the age limit, or outside the
newest `limit` bytes of the topic (then the backlog holds more than `limit` bytes). As in
Pulsar, non-durable subscriptions (readers, the Spark source) are no backlog: a reader that
starts at the earliest kept message neither blocks producers nor is skipped by eviction.
Eviction for a size quota skips down to `EVICTION_TARGET` of the limit, as Pulsar does, so
that one more message does not evict again at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mop.backlog_quota import BacklogQuotas, QuotaKind, QuotaPolicy
from mop.broker.errors import BrokerError
from mop.broker.storage.api import Storage
from mop.broker.topic import Topic
from mop.message import MessageId
from mop.topic_names import namespace_of

__all__ = ["EVICTION_TARGET", "BacklogQuotaExceeded", "QuotaCheck", "QuotaGuard", "backlog_start"]

# The share of a size quota's limit that eviction leaves in the backlog.
EVICTION_TARGET = 0.9


class BacklogQuotaExceeded(BrokerError):
    """A producer may not publish to a topic over its backlog quota (`producer_exception`)."""

    reason = "backlog_quota_exceeded"


class BacklogQuotaHold(BrokerError):
    """A topic over its backlog quota holds its producers (`producer_request_hold`): the
    publish is refused with a retriable error (Pulsar's ProducerBlockedQuotaExceededError,
    which clients retry until their send timeout; MQTT's Quota exceeded), never waited for
    in the broker, so a held topic blocks nothing else."""

    reason = "quota_exceeded"


@dataclass(slots=True)
class QuotaCheck:
    """What one check found: topics that block producers, and backlogs to skip."""

    blocked: dict[str, QuotaPolicy] = field(default_factory=dict)
    evict: list[tuple[Topic, MessageId]] = field(default_factory=list)


def backlog_start(topic: Topic) -> tuple[bool, MessageId | None]:
    """Whether `topic` has a backlog under quotas (some durable subscription), and the
    position it starts after: the lowest mark_delete of its durable subscriptions (None: one
    of them acknowledged nothing, the whole topic is backlog)."""
    lowest: MessageId | None = None
    durable = False
    for cursor in topic.cursors:
        if not cursor.sub.durable:
            continue
        mark = cursor.mark_delete
        if mark is None:
            return True, None
        if not durable or (lowest is not None and mark < lowest):
            lowest = mark
        durable = True
    return durable, lowest


def quota_cut(
    storage: Storage, topic: str, kind: QuotaKind, limit: int, now: float
) -> MessageId | None:
    """The last id of `topic` that a quota of `kind` with `limit` lets no backlog hold (None:
    none)."""
    if kind is QuotaKind.SIZE:
        return storage.retention_cut(topic, appended_before=None, keep_bytes=limit)
    return storage.retention_cut(topic, appended_before=int(now) - limit, keep_bytes=None)


class QuotaGuard:
    """The backlog quotas in force and the topics that exceed them now."""

    def __init__(self, storage: Storage, quotas: BacklogQuotas | None = None) -> None:
        self.storage = storage
        self.quotas = quotas if quotas is not None else BacklogQuotas()
        self.blocked: dict[str, QuotaPolicy] = {}

    def refuse(self, topic: str) -> None:
        """Raise if producers may not publish to `topic` now."""
        policy = self.blocked.get(topic)
        if policy is QuotaPolicy.PRODUCER_EXCEPTION:
            raise BacklogQuotaExceeded(f"{topic} is over its backlog quota")
        if policy is QuotaPolicy.PRODUCER_REQUEST_HOLD:
            raise BacklogQuotaHold(f"{topic} is over its backlog quota; try again later")

    def check(self, topics: Iterable[Topic], now: float) -> QuotaCheck:
        """Look at every subscribed topic under a quota at `now` (wall clock, s); remember
        which ones block producers, and return what to evict."""
        found = QuotaCheck()
        if not self.quotas.any and not self.blocked:
            return found
        for topic in topics:
            if not topic.persistent or not topic.cursors:
                continue
            quotas = self.quotas.for_namespace(namespace_of(topic.name))
            if not quotas:
                continue
            durable, acknowledged = backlog_start(topic)
            if not durable:
                continue
            for kind, quota in quotas.items():
                cut = quota_cut(self.storage, topic.name, kind, quota.limit, now)
                if cut is None or (acknowledged is not None and acknowledged >= cut):
                    continue
                if quota.policy is QuotaPolicy.CONSUMER_BACKLOG_EVICTION:
                    if kind is QuotaKind.SIZE:
                        target = int(quota.limit * EVICTION_TARGET)
                        cut = quota_cut(self.storage, topic.name, kind, target, now) or cut
                    found.evict.append((topic, cut))
                elif found.blocked.get(topic.name) is not QuotaPolicy.PRODUCER_EXCEPTION:
                    found.blocked[topic.name] = quota.policy
        self.blocked = found.blocked
        return found
