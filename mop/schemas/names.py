"""The name a topic's schemas are kept under, and the namespace whose rules apply to them."""

from __future__ import annotations

import re
from typing import Final

__all__ = ["namespace_of", "schema_name"]

_PARTITION: Final = re.compile(r"-partition-\d+$")


def schema_name(topic: str) -> str:
    """`tenant/namespace/local` of a full topic name, without its domain or a partition suffix:
    the partitions of a topic, and its persistent and non-persistent forms, share one schema
    (as in Pulsar)."""
    _, sep, rest = topic.partition("://")
    path = rest if sep else topic
    return _PARTITION.sub("", path)


def namespace_of(topic: str) -> str:
    """`tenant/namespace` of a full topic name."""
    tenant, namespace, _ = schema_name(topic).split("/", 2)
    return f"{tenant}/{namespace}"
