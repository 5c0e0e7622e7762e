"""Which topics a selection means, and the names a row shows for a topic.

Pulsar splits a partitioned topic `t` into topics `t-partition-<n>`; the data source reads each
of those like a topic of its own and shows rows under the name of `t` with the partition number.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from mop.spark.options import Selection
from mop.topic_names import mqtt_to_pulsar, pulsar_to_mqtt
from mop.topics import matches

__all__ = ["TopicNames", "listing_namespaces", "matching", "named_topics", "topic_names"]

_PARTITION: Final = re.compile(r"^(?P<parent>.+)-partition-(?P<index>\d+)$")


@dataclass(frozen=True, slots=True)
class TopicNames:
    """How rows read from one Pulsar topic (or partition) name it."""

    mqtt: str  # the MQTT name (the Pulsar name when MQTT cannot name the topic)
    pulsar: str  # the Pulsar name of the topic, without a partition suffix
    partition: int  # the partition number, -1 for a topic that is not partitioned


def topic_names(topic: str, *, tenant: str = "public", namespace: str = "default") -> TopicNames:
    match = _PARTITION.match(topic)
    parent, partition = (match["parent"], int(match["index"])) if match else (topic, -1)
    return TopicNames(pulsar_to_mqtt(parent, tenant=tenant, namespace=namespace), parent, partition)


def listing_namespaces(selection: Selection, *, tenant: str, namespace: str) -> list[str]:
    """The namespaces ("tenant/namespace") to list to resolve the selection's filters and
    pattern; MQTT topics live in the configured namespace."""
    found = set()
    if selection.filters:
        found.add(f"{tenant}/{namespace}")
    if selection.pattern is not None:
        rest = selection.pattern.partition("://")[2]
        pattern_tenant, pattern_namespace, _ = rest.split("/", 2)
        found.add(f"{pattern_tenant}/{pattern_namespace}")
    return sorted(found)


def named_topics(
    selection: Selection, *, tenant: str = "public", namespace: str = "default"
) -> list[str]:
    """The Pulsar names of the topics the selection names exactly, sorted."""
    return sorted({mqtt_to_pulsar(n, tenant=tenant, namespace=namespace) for n in selection.names})


def matching(
    selection: Selection,
    listed: Iterable[str],
    *,
    tenant: str = "public",
    namespace: str = "default",
) -> list[str]:
    """The listed topics (partitions named one by one) that match one of the selection's MQTT
    filters or its pattern, sorted."""
    regex = re.compile(selection.pattern) if selection.pattern is not None else None
    chosen = set()
    for topic in listed:
        names = topic_names(topic, tenant=tenant, namespace=namespace)
        # Like Pulsar's regex subscriptions, a pattern matches the whole name without partition.
        by_pattern = regex is not None and regex.fullmatch(names.pulsar) is not None
        # A topic MQTT cannot name (its MQTT name is its Pulsar name) matches no MQTT filter.
        by_filter = names.mqtt != names.pulsar and any(
            matches(topic_filter, names.mqtt) for topic_filter in selection.filters
        )
        if by_pattern or by_filter:
            chosen.add(topic)
    return sorted(chosen)
