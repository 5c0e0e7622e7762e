"""Partitioned topics across a mop broker cluster of two and a separated proxy in front of it:
the member that owns a name keeps its metadata and the other asks it, so pulsar-client may ask
either; the partitions spread over both members; the proxy declares its settings' topics on
the brokers, asks them for a topic's metadata (PARTITIONED_METADATA, through its own Pulsar
client) and serves the admin routes by asking the brokers' admin, deleting every partition
wherever it is."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pulsar
import pytest

from mop.membership import Membership
from mop.protocols.pulsar.commands import (
    GetOrCreateSchema,
    GetOrCreateSchemaResponse,
    GetSchema,
    GetSchemaResponse,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Schema,
    SchemaType,
)
from mop.settings import PulsarSettings
from mop.testing.node import RunningNode, as_proxy, node_settings, running_node
from tests.e2e.admin.topics_support import admin_url
from tests.e2e.cluster.support import two_brokers
from tests.e2e.pulsar.test_broker_cluster import (
    Cluster,
    ask,
    local_topics,
    raw_connected,
)
from tests.e2e.pulsar_support import TIMEOUT_MS, send_round_robin

pytestmark = pytest.mark.e2e

NAMESPACE = "public/default"
ADMIN = f"/admin/v2/persistent/{NAMESPACE}"
ADMIN_LISTENING = re.compile(r"admin listening on tcp (?P<host>\S+):(?P<port>\d+)")


@dataclass
class Pair:
    urls: list[str]
    admins: list[str]

    def port(self, index: int) -> int:
        return int(self.urls[index].rsplit(":", 1)[1])

    def spread(self, prefix: str, count: int = 4) -> str:
        """A name of which each member owns some partitions, and broker 1 the name itself."""
        membership = Membership(self.urls, self.urls[0])
        for n in range(1000):
            topic = f"persistent://{NAMESPACE}/{prefix}-{n}"
            owners = {membership.owner(f"{topic}-partition-{i}") for i in range(count)}
            if len(owners) == 2 and membership.owner(topic) == self.urls[1]:
                return topic
        raise AssertionError("no spread name found")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("partitioned")
    urls, admins, brokers = two_brokers(root, admins_of_each_other=True)
    try:
        for broker in brokers:
            broker.start()
        yield Pair(urls, admins)
    finally:
        for broker in brokers:
            broker.close()


@pytest.fixture(scope="module")
def proxy(pair: Pair) -> Iterator[RunningNode]:
    """A proxy declaring `declared` of 3 partitions."""
    settings = as_proxy(node_settings(), ",".join(pair.urls), namespace="default")
    settings = dataclasses.replace(
        settings,
        pulsar=PulsarSettings(port=0, partitioned_topics={"declared": 3}),
        cluster=dataclasses.replace(settings.cluster, admin_url=",".join(pair.admins)),
    )
    with running_node(settings) as node:
        yield node


@pytest.fixture
def http(proxy: RunningNode) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=admin_url(proxy), timeout=30) as client:
        yield client


def metadata(port: int, topic: str) -> int | None:
    raw = raw_connected(port)
    try:
        answer = ask(raw, PartitionedMetadata(topic=topic, request_id=7))
    finally:
        raw.close()
    assert isinstance(answer, PartitionedMetadataResponse), answer
    return answer.partitions


def client_of(url: str) -> pulsar.Client:
    return pulsar.Client(
        url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def partition_of_broker_0(pair: Pair, topic: str, count: int = 4) -> str:
    """A partition of `topic` that broker 0 holds (`Pair.spread` names have one)."""
    membership = Membership(pair.urls, pair.urls[0])
    return next(
        f"{topic}-partition-{i}"
        for i in range(count)
        if membership.owner(f"{topic}-partition-{i}") == pair.urls[0]
    )


def test_either_member_answers_and_the_partitions_spread(pair: Pair) -> None:
    topic = pair.spread("spread")
    with httpx.Client(timeout=10) as http:
        local = topic.rpartition("/")[2]
        refused = http.put(f"{pair.admins[0]}{ADMIN}/{local}/partitions", json=4)
        assert refused.status_code == 421, refused.text  # broker 1 owns the name
        assert http.put(f"{pair.admins[1]}{ADMIN}/{local}/partitions", json=4).status_code == 204
    assert metadata(pair.port(0), topic) == 4  # asked of the owner
    assert metadata(pair.port(1), topic) == 4
    producing, consuming = client_of(pair.urls[0]), client_of(pair.urls[1])
    try:
        consumer = consuming.subscribe(topic, "spread", consumer_type=pulsar.ConsumerType.Shared)
        send_round_robin(producing, topic, "s", 8)
        got = sorted(consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(8))
        assert got == [f"s{n}".encode() for n in range(8)]
    finally:
        producing.close()
        consuming.close()
    held = [local_topics_of(pair, index, topic) for index in (0, 1)]
    assert all(held) and not held[0] & held[1]
    assert held[0] | held[1] == {f"{topic}-partition-{i}" for i in range(4)}


def avro_record(*fields: dict[str, object]) -> Schema:
    definition = {"type": "record", "name": "Reading", "fields": list(fields)}
    return Schema(name="", schema_data=json.dumps(definition).encode(), type=SchemaType.AVRO)


def test_the_partitions_share_one_schema_kept_by_the_owner_of_the_name(pair: Pair) -> None:
    topic = pair.spread("schema-spread")  # broker 1 owns the name
    membership = Membership(pair.urls, pair.urls[0])
    partitions = [f"{topic}-partition-{i}" for i in range(4)]
    on_0 = next(p for p in partitions if membership.owner(p) == pair.urls[0])
    on_1 = next(p for p in partitions if membership.owner(p) == pair.urls[1])
    first = avro_record({"name": "sensor", "type": "string"})
    second = avro_record(
        {"name": "sensor", "type": "string"}, {"name": "unit", "type": "string", "default": ""}
    )
    refused = avro_record({"name": "sensor", "type": "int"})
    raw_0, raw_1 = raw_connected(pair.port(0)), raw_connected(pair.port(1))
    try:
        answer = ask(raw_0, GetOrCreateSchema(request_id=1, topic=on_0, schema=first))
        assert answer == GetOrCreateSchemaResponse(request_id=1, schema_version=bytes(8))
        # Broker 1 serves another partition: the same registry, so the next version.
        answer = ask(raw_1, GetOrCreateSchema(request_id=2, topic=on_1, schema=second))
        assert answer == GetOrCreateSchemaResponse(
            request_id=2, schema_version=(1).to_bytes(8, "big")
        )
        answer = ask(raw_0, GetOrCreateSchema(request_id=3, topic=on_0, schema=refused))
        assert isinstance(answer, GetOrCreateSchemaResponse) and answer.error_code is not None
        latest = ask(raw_0, GetSchema(request_id=4, topic=on_0))
        assert isinstance(latest, GetSchemaResponse) and latest.schema is not None
        assert latest.schema.schema_data == second.schema_data
        assert latest.schema_version == (1).to_bytes(8, "big")
    finally:
        raw_0.close()
        raw_1.close()


def test_deleting_at_the_owner_deletes_every_members_partitions(pair: Pair) -> None:
    topic = pair.spread("deleted-at-owner")
    owner = f"{pair.admins[1]}{ADMIN}/{topic.rpartition('/')[2]}/partitions"
    with httpx.Client(timeout=30) as http:
        assert http.put(owner, json=4).status_code == 204
        client = client_of(pair.urls[0])
        try:
            send_round_robin(client, topic, "o", 4)
            assert all(local_topics_of(pair, index, topic) for index in (0, 1))
            # A partition the other member holds has a consumer: nothing goes.
            consumer = client.subscribe(partition_of_broker_0(pair, topic), "holds-one")
            refused = http.delete(owner)
            assert refused.status_code == 412, refused.text
            assert http.get(owner).json() == {"partitions": 4}
            consumer.close()
        finally:
            client.close()
        assert http.delete(owner).status_code == 204
        assert http.get(owner).json() == {"partitions": 0}
    assert not any(local_topics_of(pair, index, topic) for index in (0, 1))


def local_topics_of(pair: Pair, index: int, topic: str) -> set[str]:
    """The partitions of `topic` that broker `index` holds itself."""
    cluster = Cluster([], pair.urls)
    return {name for name in local_topics(cluster, index) if name.startswith(f"{topic}-")}


def test_the_proxy_declares_and_answers_from_the_brokers(pair: Pair, proxy: RunningNode) -> None:
    topic = f"persistent://{NAMESPACE}/declared"
    # A proxy declares in the background (it starts whether or not its brokers are up).
    deadline = time.monotonic() + 10
    while metadata(pair.port(0), topic) != 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metadata(pair.port(0), topic) == 3
    assert metadata(pair.port(1), topic) == 3
    # The proxy asks its brokers (PARTITIONED_METADATA through its own Pulsar client).
    assert proxy.run(lambda: proxy.node.processor.partitioned.partitions(topic)) == 3
    with httpx.Client(base_url=admin_url(proxy), timeout=30) as http:
        assert http.get(f"{ADMIN}/declared/partitions").json() == {"partitions": 3}


def test_the_proxy_admin_api_creates_grows_lists_and_deletes_everywhere(
    pair: Pair, http: httpx.Client
) -> None:
    topic = pair.spread("through-proxy")
    path = f"{ADMIN}/{topic.rpartition('/')[2]}/partitions"
    assert http.put(path, json=2).status_code == 204
    assert http.put(path, json=2).status_code == 409
    assert http.post(path, json=1).status_code == 422
    assert http.post(path, json=4).status_code == 204
    assert http.get(path).json() == {"partitions": 4}
    assert topic in http.get(f"{ADMIN}/partitioned").json()
    client = client_of(pair.urls[0])
    try:
        send_round_robin(client, topic, "d", 4)
    finally:
        client.close()
    assert all(local_topics_of(pair, index, topic) for index in (0, 1))
    # A consumer on a partition the other member holds: the delete is refused before the
    # metadata or any partition goes.
    client = client_of(pair.urls[0])
    try:
        consumer = client.subscribe(partition_of_broker_0(pair, topic), "holds-one")
        refused = http.delete(path)
        assert refused.status_code == 412, refused.text
        assert http.get(path).json() == {"partitions": 4}
        assert local_topics_of(pair, 0, topic) | local_topics_of(pair, 1, topic) == {
            f"{topic}-partition-{i}" for i in range(4)
        }
        consumer.close()
    finally:
        client.close()
    assert http.delete(path).status_code == 204
    assert http.get(path).json() == {"partitions": 0}
    assert not any(local_topics_of(pair, index, topic) for index in (0, 1))
    assert http.delete(path).status_code == 404


def test_a_partitions_schema_is_shown_by_the_admin_of_the_names_owner(pair: Pair) -> None:
    topic = pair.spread("schema-admin")  # broker 1 owns the name
    on_0 = partition_of_broker_0(pair, topic)
    raw = raw_connected(pair.port(0))
    try:
        schema = avro_record({"name": "sensor", "type": "string"})
        answer = ask(raw, GetOrCreateSchema(request_id=1, topic=on_0, schema=schema))
        assert answer == GetOrCreateSchemaResponse(request_id=1, schema_version=bytes(8))
    finally:
        raw.close()
    path = f"/admin/v2/schemas/{NAMESPACE}/{on_0.rpartition('/')[2]}/schema"
    with httpx.Client(timeout=10) as http:
        assert http.get(f"{pair.admins[0]}{path}").status_code == 421
        shown = http.get(f"{pair.admins[1]}{path}")
        assert shown.status_code == 200, shown.text
        assert shown.json()["version"] == 0
