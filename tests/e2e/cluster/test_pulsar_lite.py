"""Separated mode in front of a Pulsar-protocol broker that is not mop: pulsar-lite (a Rust
broker from PyPI, part of the test extra). The proxy is not tied to mop brokers.

What works is tested at two levels, `ClusterBackend` and `mop run` proxy processes with paho
clients (whose messages a pulsar-client on pulsar-lite sees too). What pulsar-lite 0.2 lacks must
fail clearly and in bounded time: it does not answer GetTopicsOfNamespace, so wildcard
subscriptions (whose topics are found by listing the namespace) and topic listings end in an
error, and an MQTT client gets a SUBACK failure code on a connection that goes on working.
deploy/separated/README.md lists what works and what does not.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from pathlib import Path

import pulsar
import pytest
import trio

from mop.backends.cluster import ClusterBackend, ClusterLease
from mop.message import Message
from mop.processor.backend import BackendError, SubscriptionKind
from mop.testing.cluster import open_cluster_backend
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.clients import Client, props
from tests.e2e.cluster.support import (
    DEADLINE,
    SESSION_TAKEN_OVER,
    OpenBackend,
    payloads,
    proxy_process,
    receive,
    spec,
)
from tests.e2e.nodeproc import NodeProcess
from tests.e2e.pulsar_support import LiteBroker

pytestmark = pytest.mark.e2e

# The proxies' operation timeout: what pulsar-lite does not answer fails after this long.
OPERATION_TIMEOUT = 4.0
UNSPECIFIED_ERROR = 0x80


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiteBroker]:
    broker = LiteBroker(tmp_path_factory.mktemp("pulsar-lite"))
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


# ---- ClusterBackend ------------------------------------------------------------------------


def _table_timeout(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_table_timeout(sub) for sub in exc.exceptions)
    return isinstance(exc, BackendError) and "opening table" in str(exc) and "Timeout" in str(exc)


@asynccontextmanager
async def lite_backend(lite: LiteBroker) -> AsyncIterator[ClusterBackend]:
    """A backend on pulsar-lite, whose start is tried twice: where Apache Pulsar answers a
    refused command with an error, pulsar-lite drops the connection, and now and then (2 of
    some 70 starts in full test runs) a start then waits out the operation timeout while it
    opens a table. A proxy exits with that error and its service manager starts it again."""
    for attempt in (1, 2):
        stack = AsyncExitStack()
        try:
            opened = open_cluster_backend(lite.service_url, operation_timeout=OPERATION_TIMEOUT)
            started = await stack.enter_async_context(opened)
        except Exception as exc:
            await stack.aclose()
            if attempt == 2 or not _table_timeout(exc):
                raise
            continue
        async with stack:
            yield started
        return


@pytest.fixture
def open_backend(lite: LiteBroker) -> OpenBackend:
    """The backends (`backend` and `peer`) connect to pulsar-lite."""
    return lambda: lite_backend(lite)


async def test_publish_and_receive(backend: ClusterBackend, prefix: str) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/a")
    consumer = await backend.subscribe(spec(f"{prefix}-s", f"{prefix}/a"))
    message = Message(
        b"hello", properties=(("z", "1"), ("a", "2")), key="k1", producer="c1", qos=1, event_time=42
    )
    result = await backend.publish(topic, message)
    with trio.fail_after(DEADLINE):
        (delivery,) = await consumer.receive(1)
    assert (delivery.topic, delivery.message_id) == (topic, result.message_id)
    got = delivery.message
    assert (got.payload, got.properties, got.key, got.producer, got.event_time) == (
        b"hello",
        message.properties,
        "k1",
        "c1",
        42,
    )
    for index in range(20):
        await backend.publish(topic, Message(b"%d" % index, qos=index % 2))
    assert payloads(await receive(consumer, 20, ack=True)) == [b"%d" % i for i in range(20)]
    await consumer.close()


async def test_a_durable_subscription_resumes_on_another_backend(
    backend: ClusterBackend, peer: ClusterBackend, prefix: str
) -> None:
    durable = spec(f"{prefix}-d", f"{prefix}/d", durable=True)
    consumer = await backend.subscribe(durable)
    await consumer.close()
    await backend.publish(mqtt_to_pulsar(f"{prefix}/d"), Message(b"while away", qos=1))
    resumed = await peer.subscribe(durable)
    assert payloads(await receive(resumed, 1, ack=True)) == [b"while away"]
    await resumed.close()


async def test_a_shared_subscription_splits_the_messages(
    backend: ClusterBackend, prefix: str
) -> None:
    # Both members on one backend: pulsar-lite tells a subscription's consumers apart by their
    # consumer id alone, so members on two proxies (two connections) may collide.
    shared = spec(f"{prefix}-g", f"{prefix}/s", kind=SubscriptionKind.SHARED, member="m1")
    first = await backend.subscribe(shared)
    second = await backend.subscribe(dataclasses.replace(shared, member="m2"))
    for index in range(20):
        await backend.publish(mqtt_to_pulsar(f"{prefix}/s"), Message(b"%d" % index, qos=1))
    got: list[bytes] = []
    with trio.move_on_after(DEADLINE):
        while len(got) < 20:
            for consumer in (first, second):
                with trio.move_on_after(0.1):
                    deliveries = await consumer.receive(20)
                    consumer.ack(deliveries)
                    got.extend(d.message.payload for d in deliveries)
    assert sorted(got) == sorted(b"%d" % i for i in range(20))
    await first.close()
    await second.close()


async def test_a_table_on_a_new_topic_loads_and_is_shared(
    backend: ClusterBackend, peer: ClusterBackend, prefix: str
) -> None:
    # pulsar-lite answers an empty topic's GetLastMessageId with an error: the table writes a
    # keyless marker instead of failing to load, and the marker is no key of the table.
    table = backend.table(f"{prefix}-t")
    other = peer.table(f"{prefix}-t")
    with trio.fail_after(DEADLINE):
        await table.loaded.wait()
        await other.loaded.wait()
    assert list(table.items()) == list(other.items()) == []
    await table.put("k", b"v1")
    with trio.fail_after(DEADLINE):
        await other.catch_up()
    assert other.get("k") == b"v1"
    await table.put("k", None)
    with trio.fail_after(DEADLINE):
        await other.catch_up()
    assert other.get("k") is None
    assert list(other.items()) == []


async def test_a_client_id_taken_through_another_backend_fences_the_holder(
    backend: ClusterBackend, peer: ClusterBackend, prefix: str
) -> None:
    first = await backend.open_client(f"{prefix}-c")
    assert first.holding
    async with trio.open_nursery() as nursery:
        taken: list[ClusterLease] = []

        async def take() -> None:
            taken.append(await peer.open_client(f"{prefix}-c"))

        nursery.start_soon(take)
        with trio.fail_after(DEADLINE):
            await first.wait_fenced()
        await first.release()  # what the processor does with a fenced connection
    (second,) = taken
    with trio.fail_after(DEADLINE):
        while not second.holding:  # noqa: ASYNC110 - a lease has no event for it
            await trio.sleep(0.05)
    assert not second.fenced
    await second.release()


async def test_lookup_names_the_broker(backend: ClusterBackend, lite: LiteBroker) -> None:
    assert await backend.lookup(mqtt_to_pulsar("any/topic")) == lite.service_url


async def test_partitioned_metadata_is_the_brokers_answer(
    backend: ClusterBackend, prefix: str
) -> None:
    # Forwarded as PARTITIONED_METADATA: a topic nobody partitioned has none.
    assert await backend.partitioned.partitions(mqtt_to_pulsar(f"{prefix}/plain")) == 0


async def test_topic_listing_fails_clearly(backend: ClusterBackend) -> None:
    started = time.monotonic()
    with pytest.raises(BackendError, match="GetTopicsOfNamespace") as caught:
        await backend.topics("public/default")
    assert caught.value.reason == "unavailable"
    assert time.monotonic() - started < OPERATION_TIMEOUT + DEADLINE


async def test_a_wildcard_subscription_fails_clearly(backend: ClusterBackend, prefix: str) -> None:
    started = time.monotonic()
    with pytest.raises(BackendError, match="GetTopicsOfNamespace") as caught:
        await backend.subscribe(spec(f"{prefix}-w", f"{prefix}/#"))
    assert caught.value.reason == "unavailable", caught.value
    assert time.monotonic() - started < OPERATION_TIMEOUT + DEADLINE
    # The backend goes on working.
    consumer = await backend.subscribe(spec(f"{prefix}-e", f"{prefix}/e"))
    await backend.publish(mqtt_to_pulsar(f"{prefix}/e"), Message(b"after", qos=1))
    assert payloads(await receive(consumer, 1, ack=True)) == [b"after"]


# ---- an MQTT proxy process -----------------------------------------------------------------


def lite_proxy(lite: LiteBroker, data_dir: Path) -> NodeProcess:
    """`mop run` in separated mode (MQTT only) in front of pulsar-lite."""
    return proxy_process(
        data_dir, lite.service_url, MOP_CLUSTER__OPERATION_TIMEOUT=str(OPERATION_TIMEOUT)
    )


@contextmanager
def running_proxy(lite: LiteBroker, data_dir: Path) -> Iterator[NodeProcess]:
    """A started `lite_proxy`, which must stop with status 0."""
    with lite_proxy(lite, data_dir).serving() as process:
        yield process


@pytest.fixture(scope="module")
def proxy(lite: LiteBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_proxy(lite, tmp_path_factory.mktemp("proxy") / "data") as process:
        yield process


@pytest.fixture
def pulsar_client(lite: LiteBroker) -> Iterator[pulsar.Client]:
    """A pulsar-client on pulsar-lite itself, next to the proxy."""
    client = pulsar.Client(
        lite.service_url,
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        yield client
    finally:
        client.close()


def test_qos0_and_qos1_through_the_proxy(proxy: NodeProcess, prefix: str) -> None:
    sub = Client(proxy.port, f"{prefix}-sub")
    assert sub.subscribe(f"{prefix}/a", qos=1) == [1]
    pub = Client(proxy.port, f"{prefix}-pub")
    for qos in (0, 1, 2):
        assert pub.publish(f"{prefix}/a", f"m{qos}", qos=qos) in (0, 0x10)
    got = sub.expect(3)
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        (f"{prefix}/a", b"m0", 0),
        (f"{prefix}/a", b"m1", 1),
        (f"{prefix}/a", b"m2", 1),
    ]
    sub.expect_none()


def test_pulsar_lite_holds_what_mqtt_clients_publish(
    proxy: NodeProcess, pulsar_client: pulsar.Client, prefix: str
) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/direct")
    consumer = pulsar_client.subscribe(topic, f"{prefix}-direct")
    pub = Client(proxy.port, f"{prefix}-pub")
    pub.publish(f"{prefix}/direct", b"from mqtt", qos=1)
    message = consumer.receive(timeout_millis=int(DEADLINE * 1000))
    assert message.data() == b"from mqtt"
    assert message.topic_name() == topic
    consumer.acknowledge(message)


def test_mqtt_clients_receive_what_a_pulsar_client_publishes(
    proxy: NodeProcess, pulsar_client: pulsar.Client, prefix: str
) -> None:
    sub = Client(proxy.port, f"{prefix}-sub")
    sub.subscribe(f"{prefix}/in", qos=1)
    producer = pulsar_client.create_producer(mqtt_to_pulsar(f"{prefix}/in"))
    producer.send(b"from pulsar")
    (message,) = sub.expect(1)
    assert (message.topic, message.payload) == (f"{prefix}/in", b"from pulsar")
    producer.close()


def test_a_retained_message_reaches_a_later_subscriber(proxy: NodeProcess, prefix: str) -> None:
    pub = Client(proxy.port, f"{prefix}-pub")
    pub.publish(f"{prefix}/r", b"kept", qos=1, retain=True)
    late = Client(proxy.port, f"{prefix}-late")
    late.subscribe(f"{prefix}/r", qos=1)
    (retained,) = late.expect(1)
    assert (retained.topic, retained.payload, retained.retain) == (f"{prefix}/r", b"kept", True)


def test_a_persistent_session_keeps_messages_while_offline(proxy: NodeProcess, prefix: str) -> None:
    sub = Client(proxy.port, f"{prefix}-sub", version=4, clean=False)
    sub.subscribe(f"{prefix}/s", qos=1)
    sub.disconnect()
    Client(proxy.port, f"{prefix}-pub").publish(f"{prefix}/s", b"while away", qos=1)
    back = Client(proxy.port, f"{prefix}-sub", version=4, clean=False)
    assert back.connack is not None and back.connack.session_present
    (message,) = back.expect(1)
    assert (message.payload, message.qos) == (b"while away", 1)


def test_a_second_connection_takes_the_client_id_over(proxy: NodeProcess, prefix: str) -> None:
    first = Client(proxy.port, f"{prefix}-c")
    second = Client(proxy.port, f"{prefix}-c")
    assert second.connack is not None and second.connack.reason_code == 0
    assert first.disconnects.get(timeout=DEADLINE) == SESSION_TAKEN_OVER


def test_shared_subscribers_on_one_proxy_get_each_message_once(
    proxy: NodeProcess, prefix: str
) -> None:
    members = [Client(proxy.port, f"{prefix}-m{index}") for index in range(2)]
    for member in members:
        assert member.subscribe(f"$share/g/{prefix}/s", qos=1) == [1]
    pub = Client(proxy.port, f"{prefix}-pub")
    for index in range(20):
        pub.publish(f"{prefix}/s", f"{index}", qos=1)
    got: list[bytes] = []
    deadline = time.monotonic() + DEADLINE
    while len(got) < 20 and time.monotonic() < deadline:
        for member in members:
            while not member.messages.empty():
                got.append(member.messages.get_nowait().payload)
        time.sleep(0.05)
    assert sorted(got) == sorted(f"{i}".encode() for i in range(20))


def test_mqtt5_properties_reach_a_pulsar_client(
    proxy: NodeProcess, pulsar_client: pulsar.Client, prefix: str
) -> None:
    consumer = pulsar_client.subscribe(mqtt_to_pulsar(f"{prefix}/p"), f"{prefix}-direct")
    pub = Client(proxy.port, f"{prefix}-pub")
    sub = Client(proxy.port, f"{prefix}-sub")
    sub.subscribe(f"{prefix}/p", qos=1)
    pub.publish(
        f"{prefix}/p", b"{}", qos=1, properties=props(UserProperty=[("k", "v")], ContentType="json")
    )
    (received,) = sub.expect(1)
    assert received.properties.UserProperty == [("k", "v")]
    assert received.properties.ContentType == "json"
    message = consumer.receive(timeout_millis=int(DEADLINE * 1000))
    assert message.data() == b"{}"
    assert message.properties().get("k") == "v"
    consumer.acknowledge(message)


@pytest.fixture(scope="module")
def second_proxy(
    lite: LiteBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    with running_proxy(lite, tmp_path_factory.mktemp("proxy-2") / "data") as process:
        yield process


def receive_at_least_once(client: Client, wanted: set[bytes]) -> list[bytes]:
    """The payloads `client` receives until it has each of `wanted`. pulsar-lite drops a
    proxy's whole connection when it refuses a command (a session's subscription still held
    by the proxy the session left, say), and the QoS 1 messages in flight on that connection
    come again: at least once, as QoS 1 allows."""
    got: list[bytes] = []
    deadline = time.monotonic() + DEADLINE
    while not wanted <= set(got):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"still missing {wanted - set(got)} after {got}"
        try:
            got.append(client.messages.get(timeout=remaining).payload)
        except queue.Empty:
            continue
    return got


def test_two_proxies_share_messages_retained_messages_and_sessions(
    proxy: NodeProcess, second_proxy: NodeProcess, prefix: str
) -> None:
    sub = Client(second_proxy.port, f"{prefix}-sub", version=4, clean=False)
    sub.subscribe(f"{prefix}/t", qos=1)
    pub = Client(proxy.port, f"{prefix}-pub")
    sent = [f"{index}".encode() for index in range(10)]
    for payload in sent:
        pub.publish(f"{prefix}/t", payload, qos=1)
    got = receive_at_least_once(sub, set(sent))
    assert list(dict.fromkeys(got)) == sent  # in order, the first time each comes
    pub.publish(f"{prefix}/r", b"kept", qos=1, retain=True)
    late = Client(second_proxy.port, f"{prefix}-late")
    late.subscribe(f"{prefix}/r", qos=1)
    assert [(m.payload, m.retain) for m in late.expect(1)] == [(b"kept", True)]
    # The session resumes through the other proxy, with what was published meanwhile.
    sub.disconnect()
    pub.publish(f"{prefix}/t", b"while away", qos=1)
    back = Client(proxy.port, f"{prefix}-sub", version=4, clean=False)
    assert back.connack is not None and back.connack.session_present
    assert set(receive_at_least_once(back, {b"while away"})) <= {*sent, b"while away"}


def test_a_client_id_taken_over_through_another_proxy(
    proxy: NodeProcess, second_proxy: NodeProcess, prefix: str
) -> None:
    first = Client(proxy.port, f"{prefix}-c")
    second = Client(second_proxy.port, f"{prefix}-c")
    assert second.connack is not None and second.connack.reason_code == 0
    assert first.disconnects.get(timeout=DEADLINE) == SESSION_TAKEN_OVER
    second.subscribe(f"{prefix}/after", qos=1)
    Client(proxy.port, f"{prefix}-pub").publish(f"{prefix}/after", b"to the new holder", qos=1)
    assert [m.payload for m in second.expect(1)] == [b"to the new holder"]


def test_shared_members_on_two_proxies_are_served_or_refused_clearly(
    proxy: NodeProcess, second_proxy: NodeProcess, prefix: str
) -> None:
    # pulsar-lite tells a subscription's consumers apart by consumer id alone: the second
    # member's consumer may carry the id the first one's has on the other connection. Then it
    # is refused with a failure code, in bounded time, and the first member goes on alone.
    first = Client(proxy.port, f"{prefix}-m1")
    second = Client(second_proxy.port, f"{prefix}-m2")
    assert first.subscribe(f"$share/g/{prefix}/s", qos=1) == [1]
    started = time.monotonic()
    (code,) = second.subscribe(f"$share/g/{prefix}/s", qos=1)
    assert code in (1, UNSPECIFIED_ERROR)
    assert time.monotonic() - started < DEADLINE
    pub = Client(proxy.port, f"{prefix}-pub")
    sent = {f"{index}".encode() for index in range(10)}
    for payload in sorted(sent):
        pub.publish(f"{prefix}/s", payload, qos=1)
    got: dict[Client, list[bytes]] = {first: [], second: []}
    deadline = time.monotonic() + DEADLINE
    while not sent <= {*got[first], *got[second]} and time.monotonic() < deadline:
        for member, arrived in got.items():
            while not member.messages.empty():
                arrived.append(member.messages.get_nowait().payload)
        time.sleep(0.05)
    assert {*got[first], *got[second]} == sent
    if code == UNSPECIFIED_ERROR:
        assert got[second] == []
    assert second.disconnects.empty()


@pytest.mark.parametrize("version", [5, 4])
def test_a_wildcard_subscription_is_refused_with_a_reason_code(
    proxy: NodeProcess, prefix: str, version: int
) -> None:
    sub = Client(proxy.port, f"{prefix}-sub", version=version)
    assert sub.subscribe(f"{prefix}/exact", qos=1) == [1]
    started = time.monotonic()
    assert sub.subscribe(f"{prefix}/+", qos=1) == [UNSPECIFIED_ERROR]
    assert time.monotonic() - started < DEADLINE
    # The connection and its earlier subscription go on working.
    Client(proxy.port, f"{prefix}-pub").publish(f"{prefix}/exact", b"still here", qos=1)
    (message,) = sub.expect(1)
    assert message.payload == b"still here"
    assert sub.disconnects.empty()


def test_retained_messages_outlive_the_proxy(lite: LiteBroker, tmp_path: Path, prefix: str) -> None:
    first = lite_proxy(lite, tmp_path / "first")
    first.start()
    try:
        Client(first.port, f"{prefix}-pub").publish(f"{prefix}/r", b"kept", qos=1, retain=True)
    finally:
        assert first.stop() == 0, first.log()
        first.close()
    second = lite_proxy(lite, tmp_path / "second")
    second.start()
    try:
        late = Client(second.port, f"{prefix}-late")
        late.subscribe(f"{prefix}/r", qos=1)
        (retained,) = late.expect(1)
        assert (retained.payload, retained.retain) == (b"kept", True)
    finally:
        assert second.stop() == 0, second.log()
        second.close()
