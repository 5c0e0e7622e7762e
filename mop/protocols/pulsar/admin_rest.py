"""The part of Apache Pulsar's admin REST API (v2) that mop speaks, both ways: the paths of a
namespace's topics and of one topic, and a topic's stats as Pulsar's TopicStats JSON (its field
names: msgRateIn, msgInCounter, storageSize, publishers, subscriptions with msgBacklog, type and
consumers...). A mop broker answers with `stats_document`; a separated proxy reads Pulsar's or a
mop broker's answer with `stats_from_document`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from mop.backlog_quota import BacklogQuota, QuotaKind, QuotaPolicy
from mop.messaging import SubscriptionKind
from mop.processor.backend import ConsumerStats, SubscriptionStats, TopicStats, Traffic
from mop.protocols.pulsar.mapping import pulsar_subscription
from mop.retention import INFINITE, RetentionPolicy
from mop.topic_names import PulsarTopicName

__all__ = [
    "ADMIN_PREFIX",
    "DOMAINS",
    "backlog_quota_from_document",
    "backlog_quota_map",
    "StatsFormatError",
    "namespace_path",
    "retention_document",
    "retention_from_document",
    "stats_document",
    "stats_from_document",
    "topic_path",
]

ADMIN_PREFIX: Final = "/admin/v2"
DOMAINS: Final = ("persistent", "non-persistent")

# Pulsar's names of the subscription types (SubType in its JSON).
_KIND_NAMES: Final = {
    SubscriptionKind.EXCLUSIVE: "Exclusive",
    SubscriptionKind.SHARED: "Shared",
    SubscriptionKind.FAILOVER: "Failover",
    SubscriptionKind.KEY_SHARED: "Key_Shared",
}
_KINDS_BY_NAME: Final = {name.lower(): kind for kind, name in _KIND_NAMES.items()}


def namespace_path(domain: str, namespace: str) -> str:
    """`/admin/v2/{domain}/{tenant}/{namespace}`: the topics of a namespace ("tenant/ns")."""
    return f"{ADMIN_PREFIX}/{domain}/{namespace}"


def topic_path(topic: str) -> str:
    """`/admin/v2/{domain}/{tenant}/{namespace}/{topic}` for a full topic name; the local name
    is percent-encoded once more, as Pulsar's own admin client does (an MQTT topic `a/b` is
    the local name `a%2Fb`, which travels as `a%252Fb`). TopicError for a name that is not a
    full Pulsar name."""
    name = PulsarTopicName.parse(topic)
    local = quote(name.local_name, safe="")
    return f"{ADMIN_PREFIX}/{name.domain}/{name.tenant}/{name.namespace}/{local}"


# -- retention policies (Pulsar's RetentionPolicies JSON: minutes and MiB) ----------------------

_MINUTE: Final = 60
_MEGABYTE: Final = 1024 * 1024


def _in_units(value: int, unit: int) -> int:
    """`value` in whole `unit`s, rounded up (-1 and 0 stay as they are)."""
    return value if value <= 0 else -(-value // unit)


def _whole(value: Any) -> int | None:
    """`value` as an integer when JSON says one (`88` or `88.0`), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def retention_document(policy: RetentionPolicy) -> dict[str, int]:
    return {
        "retentionTimeInMinutes": _in_units(policy.time_seconds, _MINUTE),
        "retentionSizeInMB": _in_units(policy.size_bytes, _MEGABYTE),
    }


def retention_from_document(document: Any) -> RetentionPolicy:
    """The policy a Pulsar RetentionPolicies JSON object sets; ValueError when it is not one."""
    if not isinstance(document, dict):
        raise ValueError("the body must be a JSON object")
    values = []
    for name, unit in (("retentionTimeInMinutes", _MINUTE), ("retentionSizeInMB", _MEGABYTE)):
        value = _whole(document.get(name))
        if value is None or value < INFINITE:
            raise ValueError(f"{name} must be an integer: -1 (no limit), 0 (none) or more")
        values.append(value if value <= 0 else value * unit)
    if (values[0] == 0) != (values[1] == 0):
        # Pulsar's own check: 0 in one limit would keep nothing whatever the other says.
        raise ValueError(
            "Invalid retention policy: Setting a single time or size limit to 0 is invalid when"
            " one of the limits has a non-zero value. Use the value of -1 instead of 0 to ignore"
            " a specific limit. To disable retention both limits must be set to 0."
        )
    return RetentionPolicy(values[0], values[1])


# -- backlog quotas (Pulsar's BacklogQuota JSON: limitSize in bytes, limitTime in seconds) ------


def backlog_quota_map(quotas: Mapping[QuotaKind, BacklogQuota]) -> dict[str, dict[str, Any]]:
    """Pulsar's `backlogQuotaMap`: each quota in force by its backlogQuotaType."""
    document: dict[str, dict[str, Any]] = {}
    for kind, quota in quotas.items():
        size = quota.limit if kind is QuotaKind.SIZE else -1
        document[kind.value] = {
            "limit": size,
            "limitSize": size,
            "limitTime": quota.limit if kind is QuotaKind.AGE else -1,
            "policy": quota.policy.value,
        }
    return document


def backlog_quota_from_document(kind: QuotaKind, document: Any) -> BacklogQuota:
    """The quota of `kind` a Pulsar BacklogQuota JSON object sets (`limitSize`, or the older
    `limit`, for destination_storage; `limitTime` for message_age; `policy`; a limit left out
    is -1, none); ValueError when it is not one."""
    if not isinstance(document, dict):
        raise ValueError("the body must be a JSON object")
    limits: dict[str, int] = {}
    for name in ("limitSize", "limit", "limitTime"):
        if name in document:
            value = _whole(document[name])
            if value is None or value < INFINITE:
                raise ValueError(f"{name} must be an integer: -1 (no limit), 0 or more")
            limits[name] = value
    # A limit left out is Pulsar's default, -1: no limit.
    if kind is QuotaKind.SIZE:
        limit = limits.get("limitSize", limits.get("limit", INFINITE))
    else:
        limit = limits.get("limitTime", INFINITE)
    policy = document.get("policy", QuotaPolicy.PRODUCER_REQUEST_HOLD.value)
    try:
        return BacklogQuota(limit, QuotaPolicy(policy))
    except ValueError:
        choices = ", ".join(p.value for p in QuotaPolicy)
        raise ValueError(f"policy must be one of {choices}") from None


# -- mop's stats -> Pulsar's JSON ---------------------------------------------------------------


def stats_document(stats: TopicStats) -> dict[str, Any]:
    """`stats` as Pulsar's TopicStats JSON (the fields mop has), each subscription under the
    name Pulsar clients know it by."""
    return {
        **_traffic_in(stats.inbound),
        **_traffic_out(stats.outbound),
        "averageMsgSize": _average(stats.inbound),
        "storageSize": stats.storage_size,
        "backlogSize": 0,
        "publishers": [{"producerName": name} for name in stats.producers],
        "subscriptions": {
            pulsar_subscription(stats.topic, sub.name): _subscription_document(sub)
            for sub in stats.subscriptions
        },
        "replication": {},
    }


def _traffic_in(traffic: Traffic) -> dict[str, Any]:
    return {
        "msgRateIn": traffic.message_rate,
        "msgThroughputIn": traffic.byte_rate,
        "msgInCounter": traffic.messages,
        "bytesInCounter": traffic.bytes,
    }


def _traffic_out(traffic: Traffic) -> dict[str, Any]:
    return {
        "msgRateOut": traffic.message_rate,
        "msgThroughputOut": traffic.byte_rate,
        "msgOutCounter": traffic.messages,
        "bytesOutCounter": traffic.bytes,
    }


def _average(traffic: Traffic) -> float:
    return traffic.bytes / traffic.messages if traffic.messages else 0.0


def _subscription_document(sub: SubscriptionStats) -> dict[str, Any]:
    return {
        **_traffic_out(sub.outbound),
        "msgBacklog": sub.backlog,
        "type": None if sub.kind is None else _KIND_NAMES[sub.kind],
        "unackedMessages": sum(consumer.unacked for consumer in sub.consumers),
        "consumers": [
            {
                "consumerName": consumer.name,
                "unackedMessages": consumer.unacked,
                "availablePermits": 0 if consumer.permits is None else consumer.permits,
            }
            for consumer in sub.consumers
        ],
        "isDurable": sub.durable,
    }


# -- Pulsar's JSON -> mop's stats ---------------------------------------------------------------


class StatsFormatError(ValueError):
    """The document is not a TopicStats."""


def stats_from_document(topic: str, document: Any) -> TopicStats:
    """A TopicStats JSON document (Apache Pulsar's, or a mop broker's) of `topic` in mop's
    words; fields it lacks count as zero. StatsFormatError when it is no TopicStats."""
    if not isinstance(document, Mapping):
        raise StatsFormatError("topic stats must be a JSON object")
    subscriptions = document.get("subscriptions") or {}
    publishers = document.get("publishers") or []
    if not isinstance(subscriptions, Mapping) or not isinstance(publishers, list):
        raise StatsFormatError("subscriptions must be an object and publishers a list")
    return TopicStats(
        topic=topic,
        inbound=_traffic(document, "In"),
        outbound=_traffic(document, "Out"),
        storage_size=_int(document, "storageSize"),
        producers=tuple(
            str(publisher.get("producerName") or "")
            for publisher in publishers
            if isinstance(publisher, Mapping)
        ),
        subscriptions=tuple(
            _subscription(str(name), sub)
            for name, sub in subscriptions.items()
            if isinstance(sub, Mapping)
        ),
    )


def _subscription(name: str, document: Mapping[str, Any]) -> SubscriptionStats:
    consumers = document.get("consumers") or []
    if not isinstance(consumers, list):
        raise StatsFormatError(f"consumers of subscription {name!r} must be a list")
    kind_name = document.get("type")
    return SubscriptionStats(
        name=name,
        kind=_KINDS_BY_NAME.get(kind_name.lower()) if isinstance(kind_name, str) else None,
        backlog=_int(document, "msgBacklog"),
        consumers=tuple(
            ConsumerStats(
                name=str(consumer.get("consumerName") or ""),
                unacked=_int(consumer, "unackedMessages"),
                permits=_int(consumer, "availablePermits"),
            )
            for consumer in consumers
            if isinstance(consumer, Mapping)
        ),
        outbound=_traffic(document, "Out"),
        durable=document.get("isDurable") is not False,
    )


def _traffic(document: Mapping[str, Any], way: str) -> Traffic:
    return Traffic(
        messages=_int(document, f"msg{way}Counter"),
        bytes=_int(document, f"bytes{way}Counter"),
        message_rate=_float(document, f"msgRate{way}"),
        byte_rate=_float(document, f"msgThroughput{way}"),
    )


def _int(document: Mapping[str, Any], name: str) -> int:
    value = document.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StatsFormatError(f"{name} must be a number, not {value!r:.40}")
    return int(value)


def _float(document: Mapping[str, Any], name: str) -> float:
    value = document.get(name)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise StatsFormatError(f"{name} must be a number, not {value!r:.40}")
    return float(value)
