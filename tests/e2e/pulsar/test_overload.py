"""Overload protection for Pulsar clients: connections over a listener's rate get ERROR
TooManyRequests, a producer over its message rate is slowed without losing a message (and
without losing its connection, however long it is held back), and over the memory high-water
mark SENDs get TooManyRequests (pulsar-client sends them again) until memory is below the
low-water mark."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from mop.protocols.pulsar.commands import (
    Connect,
    Connected,
    Error,
    Lookup,
    Producer,
    ProducerSuccess,
    Send,
    SendError,
    SendReceipt,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import FrameDecoder, NeedData, encode_command, make_payload
from mop.protocols.pulsar.metadata import MessageMetadata
from mop.protocols.pulsar.serving.server import PulsarServer, Timers
from mop.settings import LimitsSettings
from mop.testing.node import RunningNode
from tests.e2e.overload_support import set_memory, stats
from tests.e2e.pulsar_support import (
    RawPulsar,
    pulsar_client,
    pulsar_node,
    pulsar_port,
    pulsar_settings,
    receive_all,
    topic_for,
)

pytestmark = pytest.mark.e2e

HIGH = 1e15
LOW = 1e14


@pytest.fixture(scope="module")
def node() -> Iterator[RunningNode]:
    """A node with a message rate per client and memory marks no machine reaches (the tests
    give its guard the samples that count)."""
    limits = LimitsSettings(
        client_message_rate=100.0,
        memory_high_watermark=HIGH,
        memory_low_watermark=LOW,
        memory_check_interval=3600.0,
    )
    with pulsar_node(dataclasses.replace(pulsar_settings(), limits=limits)) as running:
        yield running


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    return topic_for(request.node.name)


def test_connections_over_the_rate_get_too_many_requests() -> None:
    limits = LimitsSettings(connection_rate=0.001, connection_burst=1)
    settings = dataclasses.replace(pulsar_settings(), limits=limits)
    with pulsar_node(settings) as node:
        first = RawPulsar(pulsar_port(node))
        second = RawPulsar(pulsar_port(node))
        try:
            assert isinstance(first.connect(), Connected)
            refused = second.connect()
            assert isinstance(refused, Error), refused
            assert refused.error is ServerError.TooManyRequests
            assert "connection rate" in refused.message
            assert second.recv_until_closed() == []
        finally:
            first.close()
            second.close()
        assert stats(node).connections_refused_rate == 1
        assert node.node.processor.stats.protocol("pulsar").refused == {"rate_limited": 1}


def test_a_refused_connection_that_sent_more_ends_cleanly() -> None:
    """A client refused for the connection rate that sent more than its CONNECT (a pipelining
    client) reads the ERROR, then the end of the stream: not a reset, which could have taken
    the ERROR away."""
    limits = LimitsSettings(connection_rate=0.001, connection_burst=1)
    settings = dataclasses.replace(pulsar_settings(), limits=limits)
    with pulsar_node(settings) as node:
        first = RawPulsar(pulsar_port(node))
        try:
            assert isinstance(first.connect(), Connected)
            with socket.create_connection(("127.0.0.1", pulsar_port(node)), timeout=10) as sock:
                connect = encode_command(Connect(client_version="raw-test", protocol_version=20))
                lookups = b"".join(
                    encode_command(Lookup(topic=f"t{i}", request_id=i)) for i in range(20_000)
                )
                sock.sendall(connect + lookups)
                received = b""
                while data := sock.recv(65536):  # ConnectionResetError before the fix
                    received += data
            decoder = FrameDecoder(max_frame_size=1 << 20)
            decoder.feed(received)
            refused = decoder.next_frame()
            assert isinstance(refused, Error) and refused.error is ServerError.TooManyRequests
            assert isinstance(decoder.next_frame(), NeedData)
        finally:
            first.close()


def test_a_fast_producer_is_slowed_to_its_rate_and_loses_nothing(
    node: RunningNode, topic: str
) -> None:
    count = 300  # at 100 a second, the first 100 at once: 2 s at least
    with pulsar_client(node) as client:
        consumer = client.subscribe(topic, "slowed")
        producer = client.create_producer(
            topic, batching_enabled=False, block_if_queue_full=True, send_timeout_millis=60_000
        )
        results: list[Any] = []
        done = threading.Event()

        def sent(result: Any, _message_id: Any) -> None:
            results.append(result)
            if len(results) == count:
                done.set()

        before = stats(node).throttled_reads
        started = time.monotonic()
        for index in range(count):
            producer.send_async(index.to_bytes(4, "big"), sent)
        assert done.wait(60), f"{len(results)} of {count} sends answered"
        elapsed = time.monotonic() - started
        assert set(results) == {pulsar.Result.Ok}
        received = receive_all(consumer, count, timeout_ms=30_000)
        assert sorted(int.from_bytes(m.data(), "big") for m in received) == list(range(count))
        assert elapsed > 2.0 * 0.75, f"{count} messages in {elapsed:.2f}s"
        assert stats(node).throttled_reads > before


def test_a_producer_held_back_longer_than_the_keepalive_keeps_its_connection(topic: str) -> None:
    """A batch of 10 messages at 2 a second holds its producer back for 4 s, 8 keepalive
    intervals of this node: the connection stays (it is not silent, it is not read from), so
    the next batch waits for the rate instead of going out at once on a new connection."""
    limits = LimitsSettings(client_message_rate=2.0)
    with pulsar_node(dataclasses.replace(pulsar_settings(), limits=limits)) as node:
        server: PulsarServer = node.node.protocols["pulsar"].server  # type: ignore[attr-defined]

        def short_keepalive() -> None:
            server.timers = Timers(keepalive_interval=0.5)

        node.call(short_keepalive)
        with pulsar_client(node) as client:
            consumer = client.subscribe(topic, "held")
            producer = client.create_producer(
                topic,
                batching_enabled=True,
                batching_max_messages=10,
                batching_max_publish_delay_ms=10_000,
                send_timeout_millis=60_000,
            )
            connections = node.call(lambda: set(server.connections))
            answered: list[tuple[int, float]] = []
            done = threading.Event()

            def sent(batch: int) -> Any:
                def callback(result: Any, _message_id: Any) -> None:
                    assert result == pulsar.Result.Ok, result
                    answered.append((batch, time.monotonic()))
                    if len(answered) == 20:
                        done.set()

                return callback

            started = time.monotonic()
            for batch in range(2):
                for index in range(10):
                    producer.send_async(bytes([batch, index]), sent(batch))
            assert done.wait(30), f"{len(answered)} of 20 sends answered"
            second = min(at for batch, at in answered if batch == 1) - started
            # Still the connection that sent the first batch.
            assert node.call(lambda: set(server.connections)) == connections
            # The first batch cost 4 s of the budget: 10 messages, 2 of them in the burst.
            assert second > 4.0 * 0.75, f"the second batch was taken after {second:.2f}s"
            received = receive_all(consumer, 20)
            assert sorted(m.data() for m in received) == sorted(
                bytes([b, i]) for b in range(2) for i in range(10)
            )


def test_connecting_again_does_not_refill_a_producers_budget(topic: str) -> None:
    """A client that used its budget and more, then connects again (from the same address,
    as the same user), carries on with what it left: its next messages wait for the rate,
    instead of going out at once in a fresh burst. (A batch is taken as soon as it is read;
    the read after it waits for the rate.)"""
    limits = LimitsSettings(client_message_rate=20.0)
    with pulsar_node(dataclasses.replace(pulsar_settings(), limits=limits)) as node:

        def send_batches(client: pulsar.Client, *counts: int) -> float:
            """Seconds until the last of batches of `counts` messages, sent one after the
            other, is taken."""
            producer = client.create_producer(
                topic,
                batching_enabled=True,
                batching_max_messages=max(counts),
                batching_max_publish_delay_ms=10_000,
                send_timeout_millis=60_000,
            )
            answered: list[Any] = []
            started = time.monotonic()
            for count in counts:
                for index in range(count):
                    producer.send_async(index.to_bytes(2, "big"), lambda r, _: answered.append(r))
                producer.flush()
            assert answered == [pulsar.Result.Ok] * sum(counts)
            return time.monotonic() - started

        with pulsar_client(node) as client:
            # 60 at 20 a second, 20 of them in the burst: 2 s owed, waited for by the read
            # after it (closing the producer).
            send_batches(client, 60)
        with pulsar_client(node) as again:
            # Nothing is saved up when it connects again: the 20 of the first batch owe
            # 1 s, which the second waits.
            elapsed = send_batches(again, 20, 1)
        assert elapsed > 1.0 * 0.75, f"two batches in {elapsed:.2f}s after connecting again"


def test_over_the_memory_mark_sends_get_too_many_requests(node: RunningNode, topic: str) -> None:
    raw = RawPulsar(pulsar_port(node))
    try:
        assert isinstance(raw.connect(), Connected)
        raw.send(Producer(topic=topic, producer_id=1, request_id=1))
        assert isinstance(raw.recv(), ProducerSuccess)
        set_memory(node, 2 * HIGH)
        try:
            metadata = MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1)
            payload = make_payload(metadata, b"x")
            raw.send(Send(producer_id=1, sequence_id=0, payload=payload))
            refused = raw.recv()
            assert isinstance(refused, SendError), refused
            assert refused.error is ServerError.TooManyRequests
            assert refused.sequence_id == 0
        finally:
            set_memory(node, LOW / 2)
    finally:
        raw.close()


def test_pulsar_client_sends_again_once_memory_is_below_the_low_mark(
    node: RunningNode, topic: str
) -> None:
    with pulsar_client(node) as client:
        consumer = client.subscribe(topic, "memory")
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"before")
        before = stats(node).publishes_refused
        set_memory(node, 2 * HIGH)
        answered = threading.Event()
        results: list[Any] = []

        def sent(result: Any, _message_id: Any) -> None:
            results.append(result)
            answered.set()

        try:
            producer.send_async(b"during", sent)
            # Refused (and sent again by the client, after it connects again) until the
            # node is below its low-water mark.
            deadline = time.monotonic() + 10
            while stats(node).publishes_refused < before + 2:
                assert time.monotonic() < deadline, "the send was not refused again"
                time.sleep(0.05)
            assert not answered.is_set()
        finally:
            set_memory(node, LOW / 2)
        assert answered.wait(30)
        assert results == [pulsar.Result.Ok]
        producer.send(b"after")
        received = receive_all(consumer, 3)
        assert [m.data() for m in received] == [b"before", b"during", b"after"]


def test_sends_after_a_refused_one_are_refused_too(node: RunningNode, topic: str) -> None:
    """A client that gets SEND_ERROR drops the connection and sends every pending message
    again, in order. A later SEND of the same pipeline stored meanwhile (memory went below the
    low mark between the two) would make the broker's deduplication drop the resent first one."""

    def send(raw: RawPulsar, sequence_id: int, body: bytes) -> None:
        metadata = MessageMetadata(
            producer_name="overload-order", sequence_id=sequence_id, publish_time=1
        )
        payload = make_payload(metadata, body)
        raw.send(Send(producer_id=1, sequence_id=sequence_id, payload=payload))

    def open_producer() -> RawPulsar:
        raw = RawPulsar(pulsar_port(node))
        assert isinstance(raw.connect(), Connected)
        raw.send(Producer(topic=topic, producer_id=1, request_id=1, producer_name="overload-order"))
        assert isinstance(raw.recv(), ProducerSuccess)
        return raw

    with pulsar_client(node) as client:
        consumer = client.subscribe(topic, "order")
        raw = open_producer()
        try:
            set_memory(node, 2 * HIGH)
            try:
                send(raw, 0, b"zero")
                refused = raw.recv()
                assert isinstance(refused, SendError) and refused.sequence_id == 0
            finally:
                set_memory(node, LOW / 2)
            # Sent before the client learnt of the refusal.
            send(raw, 1, b"one")
            answer = raw.recv()
            assert isinstance(answer, SendError), answer
            assert answer.sequence_id == 1
        finally:
            raw.close()
        # What pulsar-client does next: connect again, send both again.
        again = open_producer()
        try:
            send(again, 0, b"zero")
            send(again, 1, b"one")
            assert isinstance(again.recv(), SendReceipt)
            assert isinstance(again.recv(), SendReceipt)
        finally:
            again.close()
        received = receive_all(consumer, 2)
        assert [m.data() for m in received] == [b"zero", b"one"]
