"""Backlog quotas as Pulsar defines them: per namespace, how much unacknowledged backlog a topic
may hold (`destination_storage`: bytes from its slowest subscription's position to its end) and
how old its oldest unacknowledged message may get (`message_age`: seconds), and what happens
once a limit is exceeded. Pure: the broker enforces them, the admin API changes them.

- `producer_request_hold`: sends and new producers are refused with the retriable
  ProducerBlockedQuotaExceededError, which Pulsar clients retry until their send timeout
  fails them. MQTT has no "retry later": its publishes to the topic are refused as with
  `producer_exception` (MQTT 5 PUBACK 0x97), in both modes. Nothing waits in the broker, so
  a held topic never stops a client's other topics or packets (PUBACKs, PINGREQs).
- `producer_exception`: producers are refused (ProducerBlockedQuotaExceededException at create
  and on send; MQTT 5 PUBACK 0x97 Quota exceeded; MQTT 3.1.1 QoS 1/2 publishers are
  disconnected, as for any refused message).
- `consumer_backlog_eviction`: the oldest backlog of the slowest subscriptions is acknowledged
  for them (skipped) so that the quota holds; producers are never refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol

from mop.topic_names import SYSTEM_NAMESPACE

__all__ = [
    "BacklogQuota",
    "BacklogQuotaControl",
    "BacklogQuotas",
    "QuotaKind",
    "QuotaPolicy",
]


class QuotaKind(StrEnum):
    """Pulsar's `backlogQuotaType`."""

    SIZE = "destination_storage"
    AGE = "message_age"


class QuotaPolicy(StrEnum):
    """Pulsar's `RetentionPolicy` of a backlog quota (its JSON `policy`)."""

    PRODUCER_REQUEST_HOLD = "producer_request_hold"
    PRODUCER_EXCEPTION = "producer_exception"
    CONSUMER_BACKLOG_EVICTION = "consumer_backlog_eviction"


@dataclass(frozen=True, slots=True)
class BacklogQuota:
    """A limit (bytes for SIZE, seconds for AGE; -1: none) and what exceeding it does."""

    limit: int
    policy: QuotaPolicy = QuotaPolicy.PRODUCER_REQUEST_HOLD

    def __post_init__(self) -> None:
        if self.limit < -1:
            raise ValueError("a backlog quota's limit must be -1 (none), 0 or more")

    @property
    def active(self) -> bool:
        return self.limit >= 0


_NO_QUOTAS: Final[Mapping[QuotaKind, BacklogQuota]] = {}


class BacklogQuotas:
    """The quotas of each namespace: run-time overrides (admin API, per kind) over the
    defaults of the settings. The system namespace has none: its tables must always take
    writes."""

    def __init__(self, defaults: Mapping[QuotaKind, BacklogQuota] | None = None) -> None:
        self.defaults = {kind: q for kind, q in (defaults or {}).items() if q.active}
        self.overrides: dict[str, dict[QuotaKind, BacklogQuota]] = {}
        # Told the namespace whose quotas changed.
        self.on_change: Callable[[str], None] | None = None

    def for_namespace(self, namespace: str) -> Mapping[QuotaKind, BacklogQuota]:
        if namespace.partition("/")[2] == SYSTEM_NAMESPACE:
            return _NO_QUOTAS
        override = self.overrides.get(namespace)
        if override is None:
            return self.defaults
        merged = {**self.defaults, **override}
        return {kind: quota for kind, quota in merged.items() if quota.active}

    @property
    def any(self) -> bool:
        """Whether some namespace may have a quota (else the broker skips its checks)."""
        return bool(self.defaults) or any(
            q.active for quotas in self.overrides.values() for q in quotas.values()
        )

    def _overridden(
        self, namespace: str, kind: QuotaKind, quota: BacklogQuota | None
    ) -> dict[QuotaKind, BacklogQuota]:
        """`namespace`'s overrides once one of `kind` is set to `quota` (None: removed)."""
        quotas = dict(self.overrides.get(namespace, {}))
        if quota is None:
            quotas.pop(kind, None)
        else:
            quotas[kind] = quota
        return quotas

    def override(self, namespace: str, kind: QuotaKind, quota: BacklogQuota | None) -> None:
        """Set (None: remove, back to the default) the run-time quota of one kind."""
        quotas = self._overridden(namespace, kind, quota)
        if quotas:
            self.overrides[namespace] = quotas
        else:
            self.overrides.pop(namespace, None)
        if self.on_change is not None:
            self.on_change(namespace)

    def saved(
        self, namespace: str, kind: QuotaKind | None = None, quota: BacklogQuota | None = None
    ) -> bytes | None:
        """The record that keeps `namespace`'s overrides (None: it has none); with `kind`,
        the record they would have once `override(namespace, kind, quota)` is done, so that
        a caller can make the change durable before it applies."""
        quotas = (
            self.overrides.get(namespace)
            if kind is None
            else self._overridden(namespace, kind, quota)
        )
        if not quotas:
            return None
        document = {k.value: [q.limit, q.policy.value] for k, q in quotas.items()}
        return json.dumps(document).encode()

    def restore(self, saved: Iterable[tuple[str, bytes]]) -> None:
        """Load overrides saved by an earlier process (a bad record is skipped)."""
        for namespace, raw in saved:
            try:
                document: Any = json.loads(raw)
                self.overrides[namespace] = {
                    QuotaKind(kind): BacklogQuota(int(limit), QuotaPolicy(policy))
                    for kind, (limit, policy) in document.items()
                }
            except (ValueError, TypeError, AttributeError):
                continue


class BacklogQuotaControl(Protocol):
    """What the admin API may do with the backlog quotas of a broker node."""

    async def backlog_quotas(self, namespace: str) -> Mapping[QuotaKind, BacklogQuota]:
        """The quotas in force for `namespace`."""
        ...

    async def set_backlog_quota(
        self, namespace: str, kind: QuotaKind, quota: BacklogQuota | None
    ) -> None:
        """Override one quota of `namespace` (None: back to the settings), durably."""
        ...
