"""A Pulsar consumer that stops reading while messages are published to its subscription does
not make a merged node hold them in memory: past a bound, the subscription reads them back from
storage when the consumer reads again, and it gets every one, in order, once.

Merged only, on a node process of its own whose resident memory the test watches (a separated
broker node runs the same broker).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator

import pulsar
import pytest

from tests.e2e.nodeproc import PULSAR_LISTENING, NodeProcess

pytestmark = pytest.mark.e2e

MiB = 1 << 20
KiB = 1 << 10
# The node keeps the last 32 MiB of its log in memory for reads: filled before the baseline,
# so that what is published replaces what it holds instead of adding to it.
WARMUP = 48 * MiB
PUBLISHED = 64 * MiB
# What the stalled consumer may cost the node: its subscription's in-memory backlog (16 MiB at
# most before it spills), its receiver queue (8 messages) and the allocator's noise. Far below
# PUBLISHED: holding it all cannot pass.
STALL_BOUND = 32 * MiB


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    process = NodeProcess(
        tmp_path_factory.mktemp("stalled") / "node",
        listening=PULSAR_LISTENING,
        MOP_PROTOCOLS='["pulsar"]',
    )
    with process.serving():
        yield process


def _messages(total: int, tag: str) -> list[bytes]:
    """Distinct messages of 4 to 16 KiB, `total` bytes in all, each starting with its number."""
    rng = random.Random(tag)
    messages: list[bytes] = []
    size = 0
    while size < total:
        message = f"{tag}-{len(messages):08d}-".encode().ljust(rng.randint(4 * KiB, 16 * KiB), b".")
        messages.append(message)
        size += len(message)
    return messages


def _publish(client: pulsar.Client, topic: str, messages: list[bytes]) -> None:
    producer = client.create_producer(
        topic,
        batching_enabled=False,
        max_pending_messages=1000,
        block_if_queue_full=True,
        send_timeout_millis=120_000,
    )
    failures: list[pulsar.Result] = []
    for message in messages:
        producer.send_async(
            message,
            lambda result, _id: failures.append(result) if result != pulsar.Result.Ok else None,
        )
    producer.flush()
    producer.close()
    assert not failures, failures[:3]


def _receive_all(consumer: pulsar.Consumer, count: int) -> list[bytes]:
    got: list[bytes] = []
    for _ in range(count):
        message = consumer.receive(timeout_millis=30_000)
        got.append(message.data())
        consumer.acknowledge(message)
    return got


def test_a_consumer_that_stops_reading_does_not_make_the_node_hold_what_is_published(
    node: NodeProcess,
) -> None:
    client = pulsar.Client(
        node.service_url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        # Warm up: the same sizes published to a topic nobody follows, so that the storage's
        # read cache and the connection's buffers have grown to their working size (a consumer
        # here would leave the allocator with free memory that hides the growth measured).
        _publish(
            client,
            f"persistent://public/default/warm-{uuid.uuid4().hex[:8]}",
            _messages(WARMUP, "w"),
        )
        topic = f"persistent://public/default/stall-{uuid.uuid4().hex[:8]}"
        consumer = client.subscribe(topic, "stalled", receiver_queue_size=8)
        published = _messages(PUBLISHED, "p")
        time.sleep(0.5)
        before = node.rss()
        _publish(client, topic, published)  # nobody reads meanwhile
        time.sleep(1.0)
        grown = node.rss() - before
        assert grown < STALL_BOUND, (
            f"the node grew {grown / MiB:.1f} MiB while {PUBLISHED / MiB:.0f} MiB were published"
            " for a consumer that does not read"
        )

        # Reading again: every message, in order, none lost, none twice.
        got = _receive_all(consumer, len(published))
        assert got == published
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        client.close()
