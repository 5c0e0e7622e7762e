"""Partitioned topics on a node, with pulsar-client (sync and asyncio): declared in settings or
created through the admin REST API at Pulsar's paths, durable across restarts; producers with
each routing mode and consumers of every subscription type span the partitions; the last
message id is known per partition and to readers of the partitioned topic; a regex consumer
finds the partitions."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pulsar
import pytest
from pulsar.asyncio import Client as AsyncClient

from mop.settings import PulsarSettings, Settings
from mop.testing.node import RunningNode, node_settings
from tests.e2e.admin.topics_support import admin_url
from tests.e2e.clients import Client
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    pulsar_client,
    pulsar_node,
    pulsar_settings,
    send_round_robin,
    service_url,
    topic_for,
)

pytestmark = pytest.mark.e2e

DECLARED = "persistent://public/default/declared"
ADMIN = "/admin/v2/persistent/public/default"


def partitioned_settings(settings: Settings | None = None) -> Settings:
    settings = settings or pulsar_settings()
    return dataclasses.replace(
        settings, pulsar=PulsarSettings(port=0, partitioned_topics={"declared": 3})
    )


@pytest.fixture(scope="module")
def node() -> Iterator[RunningNode]:
    with pulsar_node(partitioned_settings()) as running:
        yield running


@pytest.fixture
def http(node: RunningNode) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=admin_url(node), timeout=10) as client:
        yield client


@pytest.fixture
def partitioned(request: pytest.FixtureRequest, http: httpx.Client) -> str:
    """A partitioned topic of 3 partitions of the test's own, made through the admin API."""
    topic = topic_for(request.node.name)
    answer = http.put(f"{ADMIN}/{topic.rpartition('/')[2]}/partitions", json=3)
    assert answer.status_code == 204, answer.text
    return topic


def partitions(topic: str, count: int = 3) -> list[str]:
    return [f"{topic}-partition-{i}" for i in range(count)]


def receive_all(consumer: Any, count: int) -> list[Any]:
    received = []
    for _ in range(count):
        message = consumer.receive(timeout_millis=TIMEOUT_MS)
        consumer.acknowledge(message)
        received.append(message)
    return received


def test_a_declared_topic_has_its_partitions_and_an_unknown_one_has_none(
    client: pulsar.Client,
) -> None:
    assert client.get_topic_partitions(DECLARED) == partitions(DECLARED)
    unknown = "persistent://public/default/never-declared"
    assert client.get_topic_partitions(unknown) == [unknown]
    # A partition is a topic of its own, not partitioned itself.
    assert client.get_topic_partitions(f"{DECLARED}-partition-1") == [f"{DECLARED}-partition-1"]


def test_round_robin_spreads_over_every_partition_and_a_shared_consumer_gets_all(
    client: pulsar.Client, partitioned: str
) -> None:
    consumer = client.subscribe(partitioned, "all", consumer_type=pulsar.ConsumerType.Shared)
    send_round_robin(client, partitioned, "m", 9)
    received = receive_all(consumer, 9)
    assert sorted(m.data() for m in received) == [f"m{n}".encode() for n in range(9)]
    by_partition: dict[str, int] = {}
    for message in received:
        by_partition[message.topic_name()] = by_partition.get(message.topic_name(), 0) + 1
    assert by_partition == dict.fromkeys(partitions(partitioned), 3)


def test_single_partition_and_custom_routing_choose_the_partition(
    client: pulsar.Client, partitioned: str
) -> None:
    consumer = client.subscribe(partitioned, "routes", consumer_type=pulsar.ConsumerType.Shared)
    single = client.create_producer(
        partitioned, message_routing_mode=pulsar.PartitionsRoutingMode.UseSinglePartition
    )
    for n in range(4):
        single.send(f"s{n}".encode())
    assert len({m.topic_name() for m in receive_all(consumer, 4)}) == 1

    def by_key(message: Any, count: int) -> int:
        return int(message.partition_key()) % count

    custom = client.create_producer(
        partitioned,
        message_routing_mode=pulsar.PartitionsRoutingMode.CustomPartition,
        message_router=by_key,
    )
    for key in ("0", "1", "2", "4", "5"):
        custom.send(key.encode(), partition_key=key)
    for message in receive_all(consumer, 5):
        assert message.topic_name() == f"{partitioned}-partition-{int(message.data()) % 3}"


@pytest.mark.parametrize(
    "kind",
    [
        pulsar.ConsumerType.Exclusive,
        pulsar.ConsumerType.Shared,
        pulsar.ConsumerType.Failover,
        pulsar.ConsumerType.KeyShared,
    ],
)
def test_every_subscription_type_spans_the_partitions(
    client: pulsar.Client, partitioned: str, kind: Any
) -> None:
    consumer = client.subscribe(partitioned, "kinds", consumer_type=kind)
    producer = client.create_producer(partitioned, batching_enabled=False)
    for n in range(12):
        producer.send(f"k{n}".encode(), partition_key=f"key-{n % 4}")
    received = receive_all(consumer, 12)
    assert sorted(m.data() for m in received) == sorted(f"k{n}".encode() for n in range(12))
    # The default routing keeps a key on one partition.
    partition_of_key: dict[str, set[str]] = {}
    for message in received:
        partition_of_key.setdefault(message.partition_key(), set()).add(message.topic_name())
    assert all(len(found) == 1 for found in partition_of_key.values())


def test_the_last_message_id_per_partition_and_for_readers_of_the_topic(
    client: pulsar.Client, partitioned: str
) -> None:
    reader = client.create_reader(partitioned, pulsar.MessageId.earliest)
    assert not reader.has_message_available()
    producer = client.create_producer(
        partitioned,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
        batching_enabled=False,
    )
    sent = {}
    for n in range(6):
        message_id = producer.send(f"r{n}".encode())
        sent[message_id.partition()] = message_id
    for index, name in enumerate(partitions(partitioned)):
        consumer = client.subscribe(name, "last")
        last = consumer.get_last_message_id()
        assert (last.ledger_id(), last.entry_id()) == (
            sent[index].ledger_id(),
            sent[index].entry_id(),
        )
        consumer.close()
    read = []
    while reader.has_message_available():
        read.append(reader.read_next(timeout_millis=TIMEOUT_MS).data())
    assert sorted(read) == [f"r{n}".encode() for n in range(6)]


def test_a_regex_consumer_finds_the_partitions(client: pulsar.Client, partitioned: str) -> None:
    # Subscribed before any producer: the partitions exist from the create on, as in Pulsar.
    consumer = client.subscribe(
        re.compile(re.escape(partitioned) + ".*"),
        "regex",
        initial_position=pulsar.InitialPosition.Earliest,
    )
    send_round_robin(client, partitioned, "x", 3)
    received = receive_all(consumer, 3)
    assert sorted(m.data() for m in received) == [b"x0", b"x1", b"x2"]
    assert {m.topic_name() for m in received} == set(partitions(partitioned))


def test_the_admin_api_creates_grows_lists_and_deletes(
    client: pulsar.Client, http: httpx.Client
) -> None:
    path = f"{ADMIN}/admin-made/partitions"
    topic = "persistent://public/default/admin-made"
    assert http.get(path).json() == {"partitions": 0}
    assert http.put(path, json=2).status_code == 204
    assert http.put(path, json=2).status_code == 409
    assert http.get(path).json() == {"partitions": 2}
    assert client.get_topic_partitions(topic) == partitions(topic, 2)
    assert http.post(path, json=1).status_code == 422  # never fewer
    assert http.post(path, json=4).status_code == 204
    assert client.get_topic_partitions(topic) == partitions(topic, 4)
    assert topic in http.get(f"{ADMIN}/partitioned").json()
    # The partitions exist at once, in the namespace's listing.
    assert set(partitions(topic, 4)) <= set(http.get(ADMIN).json())
    # A non-persistent partitioned topic is listed in its own domain only.
    ticks = "/admin/v2/non-persistent/public/default/ticks"
    assert http.put(f"{ticks}/partitions", json=2).status_code == 204
    assert "non-persistent://public/default/ticks" not in http.get(f"{ADMIN}/partitioned").json()
    assert http.get("/admin/v2/non-persistent/public/default/partitioned").json() == [
        "non-persistent://public/default/ticks"
    ]
    assert http.delete(f"{ticks}/partitions").status_code == 204
    # As in Pulsar: no partitioned topic's name contains "-partition-".
    for name in ("a-partition-1", "a-partition-x"):
        answer = http.put(f"{ADMIN}/{name}/partitions", json=2)
        assert answer.status_code == 412, (name, answer.text)
    for wrong, status in ((0, 406), (5000, 406), ("3", 400), (True, 400)):
        answer = http.put(f"{ADMIN}/other/partitions", json=wrong)
        assert answer.status_code == status, (wrong, answer.text)
        assert "reason" in answer.json()
    assert http.post(f"{ADMIN}/unknown/partitions", json=3).status_code == 404
    # An ordinary topic of that name is there already.
    client.create_producer("persistent://public/default/ordinary").send(b"o")
    assert http.put(f"{ADMIN}/ordinary/partitions", json=2).status_code == 409

    consumer = client.subscribe(topic, "busy")
    client.create_producer(topic).send(b"kept until deleted")
    assert http.delete(path).status_code == 412  # a partition has a consumer
    assert http.get(path).json() == {"partitions": 4}
    assert http.delete(path, params={"force": "true"}).status_code == 204
    assert http.get(path).json() == {"partitions": 0}
    assert http.delete(path).status_code == 404
    assert topic not in http.get(f"{ADMIN}/partitioned").json()
    consumer.close()


def test_the_metadata_survives_a_restart(tmp_path: Any) -> None:
    settings = partitioned_settings(
        dataclasses.replace(pulsar_settings(), data_dir=str(tmp_path / "data"))
    )
    topic = "persistent://public/default/kept"
    with (
        pulsar_node(settings) as first,
        httpx.Client(base_url=admin_url(first), timeout=10) as http,
    ):
        assert http.put(f"{ADMIN}/kept/partitions", json=5).status_code == 204
    with pulsar_node(settings) as second, pulsar_client(second) as client:
        assert client.get_topic_partitions(topic) == partitions(topic, 5)
        assert client.get_topic_partitions(DECLARED) == partitions(DECLARED)


def test_a_settings_count_grows_a_topic_and_never_shrinks_it(tmp_path: Any) -> None:
    base = dataclasses.replace(pulsar_settings(), data_dir=str(tmp_path / "data"))

    def declaring(count: int) -> Settings:
        return dataclasses.replace(
            base, pulsar=PulsarSettings(port=0, partitioned_topics={"grows": count})
        )

    topic = "persistent://public/default/grows"
    for count, expected in ((2, 2), (4, 4), (3, 4)):
        with pulsar_node(declaring(count)) as running, pulsar_client(running) as client:
            assert len(client.get_topic_partitions(topic)) == expected


def test_a_bad_declared_name_stops_the_node() -> None:
    settings = dataclasses.replace(
        node_settings(),
        protocols=("pulsar",),
        pulsar=PulsarSettings(port=0, partitioned_topics={"persistent://other/ns/t": 2}),
    )
    with pytest.raises(RuntimeError, match=r"pulsar\.partitioned_topics"), pulsar_node(settings):
        pass


def test_the_asyncio_client_produces_and_consumes_across_partitions(
    node: RunningNode, partitioned: str
) -> None:
    async def scenario() -> tuple[list[bytes], set[str]]:
        client = AsyncClient(service_url(node))
        try:
            consumer = await client.subscribe(
                partitioned, "async", consumer_type=pulsar.ConsumerType.Shared
            )
            producer = await client.create_producer(
                partitioned,
                message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                batching_enabled=False,
            )
            for n in range(6):
                await producer.send(f"a{n}".encode())
            got, topics = [], set()
            for _ in range(6):
                message = await consumer.receive()
                await consumer.acknowledge(message)
                got.append(message.data())
                topics.add(message.topic_name())
            return sorted(got), topics
        finally:
            await client.close()

    got, topics = asyncio.run(scenario())
    assert got == [f"a{n}".encode() for n in range(6)]
    assert topics == set(partitions(partitioned))


def test_mqtt_clients_see_the_partitions_as_the_topics_they_are(
    node: RunningNode, client: pulsar.Client, partitioned: str
) -> None:
    # MQTT topics are never partitioned: an MQTT client names each partition.
    names = [name.rpartition("/")[2] for name in partitions(partitioned)]
    subscriber = Client(node.mqtt_port, "partition-reader")
    for name in names:
        assert subscriber.subscribe(name, qos=1) == [1]
    send_round_robin(client, partitioned, "p", 3)
    received = subscriber.expect(3)
    assert sorted(m.topic for m in received) == names
    # A publish to one partition reaches the Pulsar consumers of the partitioned topic.
    consumer = client.subscribe(partitioned, "from-mqtt")
    Client(node.mqtt_port, "partition-writer").publish(names[1], b"to one partition", qos=1)
    message = consumer.receive(timeout_millis=TIMEOUT_MS)
    assert (message.data(), message.topic_name()) == (
        b"to one partition",
        partitions(partitioned)[1],
    )
