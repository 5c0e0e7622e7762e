"""ClusterBackend (separated mode) against a real mop broker process: publish and subscribe,
wildcards and topics created later, durable resume, shared subscriptions, acknowledgements,
tables and client takeover across two backends (as two proxies would be)."""

from __future__ import annotations

import pytest
import trio

from mop.backends.cluster import ClusterBackend
from mop.message import Delivery, Message
from mop.processor.backend import BackendError, Consumer, StartPosition, SubscriptionKind
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.cluster.support import DEADLINE, expect_nothing, payloads, receive, spec


async def test_publish_and_receive_on_an_exact_topic(backend: ClusterBackend, prefix: str) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/a")
    consumer = await backend.subscribe(spec(f"{prefix}-s", f"{prefix}/a"))
    message = Message(
        b"hello",
        properties=(("z", "1"), ("a", "2"), ("z", "3")),
        key="k1",
        producer="client-1",
        qos=1,
        event_time=42,
    )
    result = await backend.publish(topic, message)
    (delivery,) = await receive(consumer, 1)
    assert delivery.topic == topic
    assert delivery.message_id == result.message_id
    got = delivery.message
    assert (got.payload, got.properties, got.key, got.producer, got.event_time) == (
        b"hello",
        message.properties,
        "k1",
        "client-1",
        42,
    )
    consumer.ack([delivery])
    await consumer.close()


async def test_qos0_publishes_arrive_in_order(backend: ClusterBackend, prefix: str) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/q0")
    consumer = await backend.subscribe(spec(f"{prefix}-s", topic))
    for index in range(20):
        await backend.publish(topic, Message(b"%d" % index, qos=0))
    got = await receive(consumer, 20)
    assert payloads(got) == [b"%d" % i for i in range(20)]
    assert {d.message.qos for d in got} == {0}


async def test_wildcards_pick_up_topics_created_later(backend: ClusterBackend, prefix: str) -> None:
    consumer = await backend.subscribe(spec(f"{prefix}-s", f"{prefix}/+/x", f"{prefix}/b/#"))
    # Topics that do not exist yet: the first messages are published before the pattern
    # consumer's next poll can have found them, and none is lost.
    sent = []
    for name in ("a/x", "b", "b/c/d", "$c/x", "(a|b)/x", "a b/x", "\u00e9/x"):
        payload = name.encode()
        await backend.publish(mqtt_to_pulsar(f"{prefix}/{name}"), Message(payload))
        sent.append(payload)
    for name in ("a/y", "a/x/z", "c"):  # matched by no selector
        await backend.publish(mqtt_to_pulsar(f"{prefix}/{name}"), Message(b"no"))
    got = await receive(consumer, len(sent))
    assert sorted(payloads(got)) == sorted(sent)
    await expect_nothing(consumer)


async def test_a_new_subscription_skips_what_was_published_before(
    backend: ClusterBackend, prefix: str
) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/old")
    keeper = await backend.subscribe(spec(f"{prefix}-keeper", topic))  # keeps the data
    await backend.publish(topic, Message(b"before"))
    # Publish times are in milliseconds: a message of the very millisecond a subscription
    # starts is delivered (better twice than lost), so "before" is a millisecond earlier.
    await trio.sleep(0.002)
    consumer = await backend.subscribe(spec(f"{prefix}-late", f"{prefix}/#"))
    await backend.publish(topic, Message(b"after"))
    assert payloads(await receive(consumer, 1)) == [b"after"]
    await expect_nothing(consumer)
    earliest = await backend.subscribe(
        spec(f"{prefix}-earliest", f"{prefix}/#", start=StartPosition.EARLIEST)
    )
    assert payloads(await receive(earliest, 2)) == [b"before", b"after"]
    await keeper.close()


async def test_durable_subscription_resumes_on_another_backend(
    backend: ClusterBackend, peer: ClusterBackend, prefix: str
) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/d")
    first = await backend.subscribe(spec(f"{prefix}-s", f"{prefix}/+"))
    await backend.publish(topic, Message(b"1"))
    delivered = await receive(first, 1)
    first.ack(delivered)
    await backend.publish(topic, Message(b"2"))
    await first.close()  # "2" was not acknowledged (and maybe not even delivered)
    await backend.publish(topic, Message(b"3"))  # while no consumer is attached
    resumed = await peer.subscribe(spec(f"{prefix}-s", f"{prefix}/+"))
    assert payloads(await receive(resumed, 2)) == [b"2", b"3"]
    await resumed.unsubscribe()
    again = await peer.subscribe(spec(f"{prefix}-s", f"{prefix}/+"))
    await expect_nothing(again)  # unsubscribed: the backlog went with it


async def test_shared_subscription_across_backends(
    backend: ClusterBackend, peer: ClusterBackend, prefix: str
) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/s")
    kind = SubscriptionKind.SHARED
    one = await backend.subscribe(spec(f"{prefix}-g", topic, kind=kind, member="m1"))
    two = await peer.subscribe(spec(f"{prefix}-g", topic, kind=kind, member="m2"))
    sent = [b"%d" % i for i in range(40)]
    for payload in sent:
        await backend.publish(topic, Message(payload))
    got: list[list[Delivery]] = [[], []]
    with trio.move_on_after(DEADLINE):
        while len(got[0]) + len(got[1]) < len(sent):
            async with trio.open_nursery() as nursery:

                async def pump(index: int, consumer: Consumer) -> None:
                    with trio.move_on_after(0.2):
                        got[index].extend(await consumer.receive(100))

                nursery.start_soon(pump, 0, one)
                nursery.start_soon(pump, 1, two)
    # Each message goes to exactly one member (how they are spread depends on when each
    # member's first flow permits reach the broker).
    assert sorted(payloads(got[0] + got[1])) == sorted(sent)
    one.ack(got[0])
    two.ack(got[1])


async def test_nack_redelivers_and_ack_does_not(backend: ClusterBackend, prefix: str) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/n")
    consumer = await backend.subscribe(spec(f"{prefix}-s", topic))
    await backend.publish(topic, Message(b"a"))
    await backend.publish(topic, Message(b"b"))
    first, second = await receive(consumer, 2)
    consumer.ack([first])
    consumer.nack([second])
    (again,) = await receive(consumer, 1)
    assert again.message.payload == b"b"
    assert again.redelivery_count >= 1
    consumer.nack([again], delay=0.5)
    (late,) = await receive(consumer, 1)
    assert late.message.payload == b"b"
    consumer.ack([late])
    await consumer.close()
    reopened = await backend.subscribe(spec(f"{prefix}-s", topic))
    await expect_nothing(reopened)


async def test_selectors_come_and_go(backend: ClusterBackend, prefix: str) -> None:
    consumer = await backend.subscribe(spec(f"{prefix}-s", f"{prefix}/a"))
    await consumer.add_selector(f"{prefix}/b/+")
    await backend.publish(mqtt_to_pulsar(f"{prefix}/a"), Message(b"a1"))
    await backend.publish(mqtt_to_pulsar(f"{prefix}/b/1"), Message(b"b1"))
    assert sorted(payloads(await receive(consumer, 2))) == [b"a1", b"b1"]
    await consumer.remove_selector(f"{prefix}/b/+")
    await backend.publish(mqtt_to_pulsar(f"{prefix}/b/1"), Message(b"b2"))
    await backend.publish(mqtt_to_pulsar(f"{prefix}/a"), Message(b"a2"))
    assert payloads(await receive(consumer, 1)) == [b"a2"]
    await expect_nothing(consumer)
    assert consumer.spec.selectors == frozenset([f"{prefix}/a"])


async def test_tables_are_shared_between_backends(
    backend: ClusterBackend, peer: ClusterBackend, prefix: str
) -> None:
    name = f"{prefix}-table"
    mine = backend.table(name)
    await mine.put("k1", b"v1")
    await mine.put("k2", b"v2")
    await mine.put("k1", None)
    assert mine.get("k1") is None and mine.get("k2") == b"v2"  # read-your-writes
    theirs = peer.table(name)
    with trio.fail_after(DEADLINE):
        await theirs.loaded.wait()
        await theirs.catch_up()
    assert dict(theirs.items()) == {"k2": b"v2"}
    changes: list[tuple[str, bytes | None]] = []
    mine.watch(lambda key, value: changes.append((key, value)))
    await theirs.put("k3", b"v3")
    await theirs.put("k2", None)
    with trio.fail_after(DEADLINE):
        await mine.catch_up()
    assert dict(mine.items()) == {"k3": b"v3"}
    assert changes == [("k3", b"v3"), ("k2", None)]  # another proxy's writes, in order


async def test_catching_up_with_a_table_that_stopped_reading_returns_at_once(
    backend: ClusterBackend, prefix: str
) -> None:
    # As at shutdown: connections that end after the tables stopped reading still ask for
    # their state; nothing more can arrive, so the answer is what the table has.
    table = backend.table(f"{prefix}-stopped")
    with trio.fail_after(DEADLINE):
        await table.put("k", b"v")
    await table.aclose()
    with trio.fail_after(1):  # well under the operation timeout it would wait for otherwise
        await table.catch_up()
    assert table.get("k") == b"v"


async def test_a_table_still_loading_refuses_reads(backend: ClusterBackend, prefix: str) -> None:
    table = backend.table(f"{prefix}-lazy")
    if not table.loaded.is_set():
        with pytest.raises(BackendError):
            table.get("x")
    with trio.fail_after(DEADLINE):
        await table.put("x", b"1")
    assert table.get("x") == b"1"


async def test_takeover_across_backends(
    backend: ClusterBackend, peer: ClusterBackend, prefix: str
) -> None:
    client_id = f"{prefix} client/é"
    first = await backend.open_client(client_id)
    assert first.holding and not first.fenced
    released = trio.Event()

    async def holder_lets_go_when_fenced() -> None:
        await first.wait_fenced()
        await first.release()
        released.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder_lets_go_when_fenced)
        with trio.fail_after(DEADLINE):
            second = await peer.open_client(client_id)
    assert released.is_set()
    assert second.holding and not second.fenced
    await second.release()


async def test_takeover_within_one_backend(backend: ClusterBackend, prefix: str) -> None:
    first = await backend.open_client(f"{prefix}-c")

    async def let_go() -> None:
        await first.wait_fenced()
        await first.release()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(let_go)
        with trio.fail_after(DEADLINE):
            second = await backend.open_client(f"{prefix}-c")
    assert first.fenced and second.holding
    await second.release()


async def test_topics_and_lookup(backend: ClusterBackend, prefix: str) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/listed")
    await backend.publish(topic, Message(b"x"))
    assert topic in await backend.topics("public/default")
    assert (await backend.lookup(topic)).startswith("pulsar://127.0.0.1:")


async def test_what_separated_mode_cannot_do(backend: ClusterBackend, prefix: str) -> None:
    consumer = await backend.subscribe(spec(f"{prefix}-s", f"{prefix}/+"))
    with pytest.raises(BackendError):
        await consumer.seek(mqtt_to_pulsar(f"{prefix}/a"))
    with pytest.raises(BackendError):
        await consumer.position(mqtt_to_pulsar(f"{prefix}/a"))
    with pytest.raises(BackendError):
        await backend.subscribe(spec(f"{prefix}-w", f"{prefix}/a", whole_batches=True))
    await consumer.close()


async def test_deleting_an_offline_subscription(
    backend: ClusterBackend, peer: ClusterBackend, prefix: str
) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/x")
    keeper = await backend.subscribe(spec(f"{prefix}-keeper", topic))  # keeps the topic's data
    session = await backend.subscribe(spec(f"{prefix}-session", f"{prefix}/+"))
    await backend.publish(topic, Message(b"queued"))
    await session.close()
    # Another proxy ends the expired session: no consumer is attached anywhere.
    await peer.delete_subscription(f"{prefix}-session")
    fresh = await backend.subscribe(spec(f"{prefix}-session", f"{prefix}/+"))
    await backend.publish(topic, Message(b"after"))
    assert payloads(await receive(fresh, 1)) == [b"after"]  # "queued" went with the session
    await expect_nothing(fresh)
    await keeper.close()


async def test_a_non_durable_subscription_goes_with_its_consumer(
    backend: ClusterBackend, prefix: str
) -> None:
    topic = mqtt_to_pulsar(f"{prefix}/x")
    keeper = await backend.subscribe(spec(f"{prefix}-keeper", topic))
    passing = await backend.subscribe(spec(f"{prefix}-s", topic, durable=False))
    await passing.close()
    await backend.publish(topic, Message(b"while closed"))
    again = await backend.subscribe(spec(f"{prefix}-s", topic))
    await backend.publish(topic, Message(b"later"))
    # A durable subscription would have kept "while closed" for this name.
    assert payloads(await receive(again, 1)) == [b"later"]
    await expect_nothing(again)
    await keeper.close()
