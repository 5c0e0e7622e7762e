"""Enforcement of backlog quotas (`mop.backlog_quota`): which topics exceed a quota, which of
them block producers and how far the slowest subscriptions are skipped for the others.

A topic's backlog runs from its slowest subscription's position (trim point) to its end; a
quota is exceeded when a message after that position is older than the age limit, or outside
the newest `limit` bytes of the topic (then the backlog holds more than `limit` bytes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from mop.backlog_quota import BacklogQuota, BacklogQuotas, QuotaKind, QuotaPolicy
from mop.broker.errors import BrokerError
from mop.broker.positions import trim_point
from mop.broker.storage.api import Storage
from mop.broker.topic import Topic
from mop.message import MessageId
from mop.retention import namespace_of

__all__ = ["BacklogQuotaExceeded", "QuotaCheck", "QuotaGuard"]


class BacklogQuotaExceeded(BrokerError):
    """A producer may not publish to a topic over its backlog quota (`producer_exception`)."""

    reason = "backlog_quota_exceeded"


class BacklogQuotaHold(BrokerError):
    """A topic over its backlog quota holds its producers (`producer_request_hold`): the
    publish may be tried again once the topic has room."""

    reason = "quota_exceeded"


@dataclass(slots=True)
class QuotaCheck:
    """What one check found: topics that block producers, and backlogs to skip."""

    blocked: dict[str, QuotaPolicy] = field(default_factory=dict)
    evict: list[tuple[Topic, MessageId]] = field(default_factory=list)


def quota_cut(
    storage: Storage, topic: str, kind: QuotaKind, quota: BacklogQuota, now: float
) -> MessageId | None:
    """The last id of `topic` that the quota lets no backlog hold (None: none)."""
    if kind is QuotaKind.SIZE:
        return storage.retention_cut(topic, appended_before=None, keep_bytes=quota.limit)
    return storage.retention_cut(topic, appended_before=int(now) - quota.limit, keep_bytes=None)


class QuotaGuard:
    """The backlog quotas in force and the topics that exceed them now."""

    def __init__(self, storage: Storage, quotas: BacklogQuotas | None = None) -> None:
        self.storage = storage
        self.quotas = quotas if quotas is not None else BacklogQuotas()
        self.blocked: dict[str, QuotaPolicy] = {}
        # Told when a topic that blocked its producers has room again.
        self.on_room: Callable[[], None] | None = None

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
            acknowledged = trim_point(topic)
            for kind, quota in quotas.items():
                cut = quota_cut(self.storage, topic.name, kind, quota, now)
                if cut is None or (acknowledged is not None and acknowledged >= cut):
                    continue
                if quota.policy is QuotaPolicy.CONSUMER_BACKLOG_EVICTION:
                    found.evict.append((topic, cut))
                elif found.blocked.get(topic.name) is not QuotaPolicy.PRODUCER_EXCEPTION:
                    found.blocked[topic.name] = quota.policy
        freed = self.blocked.keys() - found.blocked.keys()
        self.blocked = found.blocked
        if freed and self.on_room is not None:
            self.on_room()
        return found
