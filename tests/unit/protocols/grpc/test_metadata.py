"""Call metadata -> typed open-requests, and the errors that name the key and its values."""

from __future__ import annotations

import pytest

from mop.messaging import ProducerAccess, StartPosition, SubscriptionKind
from mop.protocols.grpc.metadata import (
    ConsumerOpen,
    ProducerOpen,
    authorization,
    consumer_open,
    producer_open,
)
from mop.protocols.grpc.status import GrpcError, StatusCode


def refusal(parse: object, metadata: tuple[tuple[str, str], ...]) -> str:
    with pytest.raises(GrpcError) as caught:
        parse(metadata)  # type: ignore[operator]
    assert caught.value.code is StatusCode.INVALID_ARGUMENT
    return caught.value.message


def test_a_producer_takes_defaults_for_what_is_not_given() -> None:
    assert producer_open((("pulsar-topic", "t"), ("user-agent", "grpc-python"))) == ProducerOpen(
        "t", None, ProducerAccess.SHARED
    )


def test_a_producer_reads_its_name_and_access_mode() -> None:
    metadata = (
        ("pulsar-topic", "persistent://public/default/t"),
        ("pulsar-producer-name", "p1"),
        ("pulsar-producer-access-mode", "Exclusive_With_Fencing"),
    )
    assert producer_open(metadata) == ProducerOpen(
        "persistent://public/default/t", "p1", ProducerAccess.EXCLUSIVE_WITH_FENCING
    )


def test_a_consumer_reads_every_key() -> None:
    metadata = (
        ("pulsar-topic", "t"),
        ("pulsar-subscription", "s"),
        ("pulsar-subscription-type", "key_shared"),
        ("pulsar-initial-position", "earliest"),
        ("pulsar-consumer-name", "c"),
        ("pulsar-receiver-queue-size", "10000"),
    )
    assert consumer_open(metadata) == ConsumerOpen(
        "t", "s", SubscriptionKind.KEY_SHARED, StartPosition.EARLIEST, "c", 10_000
    )
    defaults = consumer_open((("pulsar-topic", "t"), ("pulsar-subscription", "s")))
    assert (defaults.kind, defaults.start, defaults.receiver_queue_size) == (
        SubscriptionKind.EXCLUSIVE,
        StartPosition.LATEST,
        1000,
    )


def test_required_keys_are_named_when_missing() -> None:
    assert "'pulsar-topic' is required" in refusal(producer_open, ())
    assert "'pulsar-topic' is required" in refusal(producer_open, (("pulsar-topic", ""),))
    assert "'pulsar-subscription' is required" in refusal(consumer_open, (("pulsar-topic", "t"),))


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("pulsar-subscription-type", "round_robin", "'exclusive', 'shared', 'failover'"),
        ("pulsar-initial-position", "middle", "'latest', 'earliest'"),
        ("pulsar-receiver-queue-size", "0", "from 1 to 10000"),
        ("pulsar-receiver-queue-size", "10001", "from 1 to 10000"),
        ("pulsar-receiver-queue-size", "-5", "from 1 to 10000"),
        ("pulsar-receiver-queue-size", "lots", "from 1 to 10000"),
    ],
)
def test_invalid_values_name_the_key_and_what_it_takes(key: str, value: str, allowed: str) -> None:
    metadata = (("pulsar-topic", "t"), ("pulsar-subscription", "s"), (key, value))
    message = refusal(consumer_open, metadata)
    assert key in message and repr(value) in message and allowed in message


def test_an_invalid_access_mode_lists_the_modes() -> None:
    message = refusal(producer_open, (("pulsar-topic", "t"), ("pulsar-producer-access-mode", "x")))
    assert "'wait_for_exclusive'" in message and "'exclusive_with_fencing'" in message


def test_a_key_given_twice_is_refused() -> None:
    message = refusal(producer_open, (("pulsar-topic", "a"), ("pulsar-topic", "b")))
    assert "'pulsar-topic' is given more than once" in message


def test_names_with_control_characters_or_too_long_are_refused() -> None:
    assert "control" in refusal(producer_open, (("pulsar-topic", "a\nb"),))
    assert "longer" in refusal(producer_open, (("pulsar-topic", "t" * 1025),))


def test_the_authorization_value_is_read_as_sent() -> None:
    assert authorization((("authorization", "Bearer x"),)) == "Bearer x"
    assert authorization(()) is None
