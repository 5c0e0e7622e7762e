"""`Message` <-> the fields of a Pulsar message, for separated mode.

A Pulsar message carries payload, properties (a map), partition key, event time and deliver-at
time; mop's other fields travel as reserved properties and are taken off again on receipt:

- `mop.qos` (when not 1), `mop.expires_at` (ms since the epoch, when set) and `mop.producer`
  (the client that published, e.g. an MQTT client id; Pulsar names its own producers,
  so a message without it shows the Pulsar producer's name).
- `mop.properties`: the client keeps properties in a sorted map, which loses their order and
  all but one value of a repeated name. When the list is not already sorted by unique names
  (and free of reserved names), it also travels whole, as JSON, and wins on receipt; the map
  then shows Pulsar consumers the last value of each name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from mop.message import ENCRYPTED, QOS_PROPERTY, Message, qos_of

__all__ = [
    "EXPIRES_AT",
    "PRODUCER",
    "PROPERTIES",
    "QOS",
    "RESERVED_PREFIX",
    "Outgoing",
    "incoming",
    "outgoing",
]

RESERVED_PREFIX = "mop."
QOS = QOS_PROPERTY
EXPIRES_AT = "mop.expires_at"
PRODUCER = "mop.producer"
PROPERTIES = "mop.properties"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """What a Pulsar producer sends."""

    payload: bytes
    properties: tuple[tuple[str, str], ...]  # in the order they are sent
    partition_key: str | None
    event_time: int
    deliver_at: int


def _map_is_exact(pairs: tuple[tuple[str, str], ...]) -> bool:
    """Whether a sorted map gives back exactly these pairs, in order."""
    previous = None
    for name, _ in pairs:
        if name.startswith(RESERVED_PREFIX) or (previous is not None and name <= previous):
            return False
        previous = name
    return True


# Messages of one client look alike: the same properties, QoS and producer, message after
# message. What they map to is kept (up to this many mappings, then forgotten all at once), so
# the mapping is worked out once per kind of message, not once per message.
_CACHE_SIZE: Final = 4096
_outgoing_cache: dict[
    tuple[tuple[tuple[str, str], ...], int, str], tuple[tuple[str, str], ...]
] = {}
_incoming_cache: dict[tuple[tuple[str, str], ...], _Fields] = {}


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value


def _outgoing_properties(message: Message) -> tuple[tuple[str, str], ...]:
    pairs = message.properties
    # A user property under a reserved name travels only inside `mop.properties`: as a map
    # entry it would be read back as ours (a user's "mop.qos" as the message's QoS).
    properties = {name: value for name, value in pairs if not name.startswith(RESERVED_PREFIX)}
    if not _map_is_exact(pairs):
        properties[PROPERTIES] = json.dumps([list(pair) for pair in pairs], separators=(",", ":"))
    if message.qos != 1:
        properties[QOS] = str(message.qos)
    if message.expires_at:
        properties[EXPIRES_AT] = str(message.expires_at)
    properties[PRODUCER] = message.producer
    return tuple(properties.items())


def outgoing(message: Message) -> Outgoing:
    """The Pulsar form of a message (a batch entry cannot be sent: send its members)."""
    if message.batch:
        raise ValueError("a batch entry cannot be published through a proxy")
    if message.expires_at:
        properties = _outgoing_properties(message)  # one of a kind: not worth keeping
    else:
        key = (message.properties, message.qos, message.producer)
        cached = _outgoing_cache.get(key)
        if cached is None:
            cached = _outgoing_properties(message)
            _remember(_outgoing_cache, key, cached)
        properties = cached
    return Outgoing(
        payload=message.payload,
        properties=properties,
        partition_key=message.key,
        event_time=message.event_time,
        deliver_at=message.deliver_at,
    )


def _int(value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        return default


def _pairs(properties: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    whole = properties.get(PROPERTIES)
    if whole is not None:
        try:
            decoded = json.loads(whole)
            return tuple((str(name), str(value)) for name, value in decoded)
        except (ValueError, TypeError):
            pass  # not ours after all: fall back to the map
    return tuple(
        (name, value)
        for name, value in sorted(properties.items())
        if not name.startswith(RESERVED_PREFIX)
    )


# (user properties, qos, expires_at, producer or None) that a message's properties carry.
_Fields = tuple[tuple[tuple[str, str], ...], int, int, str | None]


def _fields(pairs: tuple[tuple[str, str], ...]) -> _Fields:
    # As a map, the way a Pulsar message's properties are read: the last value of a name wins.
    properties = dict(pairs)
    # Only the metadata says whether a message is encrypted (`incoming` marks it): the JSON of
    # all properties that proxies send can be written by any Pulsar producer.
    user = tuple(pair for pair in _pairs(properties) if pair[0] != ENCRYPTED[0])
    return (
        user,
        qos_of(pairs),
        max(0, _int(properties.get(EXPIRES_AT), 0)),
        properties.get(PRODUCER),
    )


def incoming(
    payload: bytes,
    properties: tuple[tuple[str, str], ...],
    *,
    partition_key: str | None,
    publish_time: int,
    event_time: int,
    producer_name: str,
    encrypted: bool = False,
) -> Message:
    """The message a Pulsar message carries (also one a plain Pulsar client sent), from its
    properties in the order they came; an `encrypted` one is marked `ENCRYPTED`."""
    fields = _incoming_cache.get(properties)
    if fields is None:
        fields = _fields(properties)
        if not fields[2]:  # with an expiry time, one of a kind: not worth keeping
            _remember(_incoming_cache, properties, fields)
    pairs, qos, expires_at, producer = fields
    if encrypted:
        pairs = (*pairs, ENCRYPTED)
    return Message(
        payload=payload,
        properties=pairs,
        key=partition_key or None,
        producer=producer_name if producer is None else producer,
        publish_time=publish_time,
        event_time=event_time,
        qos=qos,
        expires_at=expires_at,
    )
