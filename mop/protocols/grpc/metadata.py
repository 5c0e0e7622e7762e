"""The call metadata that opens a PulsarGrpcService call, read into typed requests.

The keys are documented in the header of `mop_grpc.proto`. A missing or invalid value ends the
call with INVALID_ARGUMENT and a message naming the key and the values it takes; keys this
service does not know (a client's user agent, say) are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from mop.messaging import ProducerAccess, StartPosition, SubscriptionKind
from mop.protocols.grpc.status import GrpcError, StatusCode

AUTHORIZATION: Final = "authorization"
TOPIC: Final = "pulsar-topic"
PRODUCER_NAME: Final = "pulsar-producer-name"
PRODUCER_ACCESS_MODE: Final = "pulsar-producer-access-mode"
SUBSCRIPTION: Final = "pulsar-subscription"
SUBSCRIPTION_TYPE: Final = "pulsar-subscription-type"
INITIAL_POSITION: Final = "pulsar-initial-position"
CONSUMER_NAME: Final = "pulsar-consumer-name"
RECEIVER_QUEUE_SIZE: Final = "pulsar-receiver-queue-size"

# The keys whose value this service reads: each may come once.
_KEYS: Final = frozenset(
    {
        AUTHORIZATION,
        TOPIC,
        PRODUCER_NAME,
        PRODUCER_ACCESS_MODE,
        SUBSCRIPTION,
        SUBSCRIPTION_TYPE,
        INITIAL_POSITION,
        CONSUMER_NAME,
        RECEIVER_QUEUE_SIZE,
    }
)
DEFAULT_RECEIVER_QUEUE: Final = 1000
MAX_RECEIVER_QUEUE: Final = 10_000
# Longest name (topic, subscription, producer, consumer) taken from metadata, in characters.
_MAX_NAME: Final = 1024

_E = TypeVar("_E", ProducerAccess, SubscriptionKind, StartPosition)


@dataclass(frozen=True, slots=True)
class ProducerOpen:
    """What the metadata of a produce or send call asks for."""

    # The topic as the client named it (full or short; see `mapping.canonical_topic`).
    topic: str
    # None: the node names the producer (and does not keep its sequence ids across restarts).
    producer_name: str | None = None
    access: ProducerAccess = ProducerAccess.SHARED


@dataclass(frozen=True, slots=True)
class ConsumerOpen:
    """What the metadata of a consume call asks for."""

    topic: str
    subscription: str
    kind: SubscriptionKind = SubscriptionKind.EXCLUSIVE
    start: StartPosition = StartPosition.LATEST
    consumer_name: str = ""
    receiver_queue_size: int = DEFAULT_RECEIVER_QUEUE


def metadata_map(metadata: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The values of the keys this service reads (INVALID_ARGUMENT for one sent twice)."""
    values: dict[str, str] = {}
    for key, value in metadata:
        if key not in _KEYS:
            continue
        if key in values:
            raise _invalid(f"metadata {key!r} is given more than once")
        values[key] = value
    return values


def producer_open(metadata: tuple[tuple[str, str], ...]) -> ProducerOpen:
    values = metadata_map(metadata)
    name = _name(values, PRODUCER_NAME, required=False) or None
    return ProducerOpen(
        topic=_name(values, TOPIC, required=True),
        producer_name=name,
        access=_choice(values, PRODUCER_ACCESS_MODE, ProducerAccess, ProducerAccess.SHARED),
    )


def consumer_open(metadata: tuple[tuple[str, str], ...]) -> ConsumerOpen:
    values = metadata_map(metadata)
    return ConsumerOpen(
        topic=_name(values, TOPIC, required=True),
        subscription=_name(values, SUBSCRIPTION, required=True),
        kind=_choice(values, SUBSCRIPTION_TYPE, SubscriptionKind, SubscriptionKind.EXCLUSIVE),
        start=_choice(values, INITIAL_POSITION, StartPosition, StartPosition.LATEST),
        consumer_name=_name(values, CONSUMER_NAME, required=False),
        receiver_queue_size=_queue_size(values),
    )


def authorization(metadata: tuple[tuple[str, str], ...]) -> str | None:
    """The `authorization` value, None when there is none."""
    return metadata_map(metadata).get(AUTHORIZATION)


def _name(values: Mapping[str, str], key: str, *, required: bool) -> str:
    value = values.get(key, "")
    if not value:
        if required:
            raise _invalid(f"metadata {key!r} is required")
        return ""
    if len(value) > _MAX_NAME:
        raise _invalid(f"metadata {key!r} is longer than {_MAX_NAME} characters")
    if any(ord(char) < 0x20 for char in value):
        raise _invalid(f"metadata {key!r} contains control characters")
    return value


def _choice(values: Mapping[str, str], key: str, kind: type[_E], default: _E) -> _E:
    value = values.get(key)
    if value is None:
        return default
    try:
        return kind(value.strip().lower())
    except ValueError:
        allowed = ", ".join(repr(member.value) for member in kind)
        raise _invalid(f"metadata {key!r} is {value[:80]!r}; it takes {allowed}") from None


def _queue_size(values: Mapping[str, str]) -> int:
    value = values.get(RECEIVER_QUEUE_SIZE)
    if value is None:
        return DEFAULT_RECEIVER_QUEUE
    text = value.strip()
    size = int(text) if text.isdigit() and len(text) <= 6 else 0
    if not 1 <= size <= MAX_RECEIVER_QUEUE:
        raise _invalid(
            f"metadata {RECEIVER_QUEUE_SIZE!r} is {value[:80]!r}; it takes a whole number"
            f" from 1 to {MAX_RECEIVER_QUEUE}"
        )
    return size


def _invalid(message: str) -> GrpcError:
    return GrpcError(StatusCode.INVALID_ARGUMENT, message)


__all__ = [
    "AUTHORIZATION",
    "CONSUMER_NAME",
    "DEFAULT_RECEIVER_QUEUE",
    "INITIAL_POSITION",
    "MAX_RECEIVER_QUEUE",
    "PRODUCER_ACCESS_MODE",
    "PRODUCER_NAME",
    "RECEIVER_QUEUE_SIZE",
    "SUBSCRIPTION",
    "SUBSCRIPTION_TYPE",
    "TOPIC",
    "ConsumerOpen",
    "ProducerOpen",
    "authorization",
    "consumer_open",
    "metadata_map",
    "producer_open",
]
