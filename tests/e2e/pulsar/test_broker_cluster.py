"""A mop broker cluster of three broker processes with static membership: topics spread over
the members by rendezvous hashing, lookups redirect to the owner, a non-owner refuses producers
and consumers with ServiceNotReady, and namespace listings cover every member."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from mop.membership import Membership
from mop.node import StartupError, open_node
from mop.protocols.pulsar.commands import (
    Connect,
    Connected,
    Error,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    LookupResponse,
    LookupType,
    PartitionedMetadata,
    PartitionedMetadataResponse,
    Producer,
    Subscribe,
    SubType,
    TopicsMode,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import Frame
from mop.protocols.pulsar.serving.peers import PEER_CLIENT_VERSION
from mop.settings import ClusterSettings
from tests.e2e.nodeproc import NodeProcess, broker_process
from tests.e2e.pulsar_support import TIMEOUT_MS, RawPulsar, pulsar_settings

pytestmark = pytest.mark.e2e

NAMESPACE = "public/default"


def spread_topics(urls: list[str], per_member: int = 4) -> list[str]:
    """Topic names of which every member owns `per_member`: which member owns a name depends on
    the members' URLs, and their ports are picked afresh each run, so a fixed list of names could
    leave a member with none. The brokers' lookups are still checked against this choice."""
    ownership = Membership(urls, urls[0])
    picked: dict[str, list[str]] = {url: [] for url in ownership.members}
    for n in range(10_000):
        topic = f"persistent://{NAMESPACE}/spread-{n}"
        mine = picked[ownership.owner(topic)]
        if len(mine) < per_member:
            mine.append(topic)
        if all(len(topics) == per_member for topics in picked.values()):
            return sorted(topic for topics in picked.values() for topic in topics)
    raise AssertionError("no spread of topic names found")  # 1 in 10^1000: a hashing bug


def free_ports(count: int) -> list[int]:
    """Loopback ports free right now (static membership needs them before the brokers start)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclasses.dataclass
class Cluster:
    brokers: list[NodeProcess]
    urls: list[str]

    def port(self, index: int) -> int:
        return int(self.urls[index].rsplit(":", 1)[1])


def start_broker(data_dir: Path, url: str, urls: list[str]) -> NodeProcess:
    broker = broker_process(
        data_dir,
        MOP_PULSAR__PORT=url.rsplit(":", 1)[1],
        MOP_CLUSTER__BROKERS=json.dumps(urls),
        MOP_CLUSTER__ADVERTISED_URL=url,
    )
    broker.start()
    return broker


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    urls = [f"pulsar://127.0.0.1:{port}" for port in free_ports(3)]
    brokers: list[NodeProcess] = []
    try:
        for index, url in enumerate(urls):
            brokers.append(start_broker(root / f"broker-{index}", url, urls))
        yield Cluster(brokers, urls)
    finally:
        for broker in brokers:
            broker.close()


def client_of(url: str) -> pulsar.Client:
    return pulsar.Client(
        url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def raw_connected(port: int, client_version: str = "raw-test") -> RawPulsar:
    raw = RawPulsar(port)
    raw.send(Connect(client_version=client_version, protocol_version=20))
    assert isinstance(raw.recv(), Connected)
    return raw


def ask(raw: RawPulsar, command: Lookup | PartitionedMetadata | GetTopicsOfNamespace) -> Frame:
    raw.send(command)
    answer = raw.recv()
    assert answer is not None
    return answer


def owners(cluster: Cluster, topics: list[str]) -> dict[str, str]:
    """Each topic's owner, by asking broker 0 (a redirect names the owner, Connect is itself)."""
    raw = raw_connected(cluster.port(0))
    found = {}
    try:
        for rid, topic in enumerate(topics):
            answer = ask(raw, Lookup(topic=topic, request_id=rid))
            assert isinstance(answer, LookupResponse), answer
            if answer.response is LookupType.Redirect:
                assert answer.authoritative
                assert answer.broker_service_url != cluster.urls[0]
            else:
                assert answer.response is LookupType.Connect
            assert answer.broker_service_url is not None
            found[topic] = answer.broker_service_url
    finally:
        raw.close()
    return found


def local_topics(
    cluster: Cluster, index: int, mode: TopicsMode = TopicsMode.PERSISTENT
) -> set[str]:
    """What broker `index` itself holds: a peer's listing is not forwarded."""
    raw = raw_connected(cluster.port(index), client_version=PEER_CLIENT_VERSION)
    try:
        answer = ask(raw, GetTopicsOfNamespace(request_id=1, namespace=NAMESPACE, mode=mode))
        assert isinstance(answer, GetTopicsOfNamespaceResponse), answer
        return set(answer.topics)
    finally:
        raw.close()


def test_topics_spread_and_any_member_reaches_the_owner(cluster: Cluster) -> None:
    topics = spread_topics(cluster.urls)
    owner_of = owners(cluster, topics)
    assert set(owner_of.values()) == set(cluster.urls)  # the brokers agree: all 3 own some
    # Produce every topic through broker 0 and consume it through broker 1: both follow the
    # redirects to the owner.
    producing, consuming = client_of(cluster.urls[0]), client_of(cluster.urls[1])
    try:
        earliest = pulsar.InitialPosition.Earliest
        consumers = {
            topic: consuming.subscribe(topic, "spread", initial_position=earliest)
            for topic in topics
        }
        for topic in topics:
            producer = producing.create_producer(topic)
            producer.send(f"to {topic}".encode())
            producer.close()
        for topic, consumer in consumers.items():
            message = consumer.receive(timeout_millis=TIMEOUT_MS)
            assert message.data() == f"to {topic}".encode()
            consumer.acknowledge(message)
    finally:
        producing.close()
        consuming.close()
    # Each topic is stored by its owner, and by nobody else.
    for index, url in enumerate(cluster.urls):
        held = local_topics(cluster, index) & set(topics)
        assert held == {topic for topic, owner in owner_of.items() if owner == url}


def test_a_non_owner_refuses_producers_and_consumers_with_service_not_ready(
    cluster: Cluster,
) -> None:
    topic = f"persistent://{NAMESPACE}/not-here"
    owner = owners(cluster, [topic])[topic]
    other = next(i for i, url in enumerate(cluster.urls) if url != owner)
    raw = raw_connected(cluster.port(other))
    try:
        # Partitioned metadata is answered for any topic.
        answer = ask(raw, PartitionedMetadata(topic=topic, request_id=1))
        assert isinstance(answer, PartitionedMetadataResponse) and answer.partitions == 0
        answer = ask(raw, Producer(topic=topic, producer_id=0, request_id=2))
        assert isinstance(answer, Error), answer
        assert (answer.request_id, answer.error) == (2, ServerError.ServiceNotReady)
        answer = ask(
            raw,
            Subscribe(
                topic=topic, subscription="s", sub_type=SubType.Shared, consumer_id=0, request_id=3
            ),
        )
        assert isinstance(answer, Error), answer
        assert (answer.request_id, answer.error) == (3, ServerError.ServiceNotReady)
        # An authoritative lookup (the end of a redirect) is never redirected again.
        answer = ask(raw, Lookup(topic=topic, request_id=4, authoritative=True))
        assert isinstance(answer, LookupResponse) and answer.response is LookupType.Connect
    finally:
        raw.close()


def test_a_regex_subscription_sees_the_topics_of_every_member(cluster: Cluster) -> None:
    topics = [f"persistent://{NAMESPACE}/rx-{n}" for n in range(8)]
    assert len(set(owners(cluster, topics).values())) > 1
    client = client_of(cluster.urls[2])
    try:
        # Published before anyone subscribes: the grace keeps it for the pattern consumer.
        for topic in topics:
            producer = client.create_producer(topic)
            producer.send(topic.encode())
            producer.close()
        # (pulsar-client's Python API ignores pattern_auto_discovery_period, so this checks
        # the listing a pattern consumer starts from, not its later polls.)
        consumer = client.subscribe(
            re.compile(f"persistent://{NAMESPACE}/rx-.*"),
            "rx",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        got = {consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in topics}
        assert got == {topic.encode() for topic in topics}
    finally:
        client.close()


def test_a_member_that_is_down_is_left_out_of_listings(tmp_path: Path, cluster: Cluster) -> None:
    # Two members of their own, so that the shared cluster keeps all of its brokers.
    urls = [f"pulsar://127.0.0.1:{port}" for port in free_ports(2)]
    first = start_broker(tmp_path / "first", urls[0], urls)
    second = start_broker(tmp_path / "second", urls[1], urls)
    try:
        owned = owners(Cluster([], urls), spread_topics(urls))
        topic = next(t for t, owner in owned.items() if owner == urls[1])
        client = client_of(urls[0])
        try:
            client.create_producer(topic).send(b"x")
        finally:
            client.close()
        raw = raw_connected(int(urls[0].rsplit(":", 1)[1]))
        try:
            answer = ask(raw, GetTopicsOfNamespace(request_id=1, namespace=NAMESPACE))
            assert isinstance(answer, GetTopicsOfNamespaceResponse)
            assert topic in answer.topics  # the peer's topic, through the peer link
            second.stop()
            for rid in (2, 3):
                started = time.monotonic()
                answer = ask(raw, GetTopicsOfNamespace(request_id=rid, namespace=NAMESPACE))
                assert isinstance(answer, GetTopicsOfNamespaceResponse)
                assert topic not in answer.topics
                print(f"listing without the peer took {time.monotonic() - started:.3f} s")
        finally:
            raw.close()
        assert len(first.find(re.compile("cluster peer .* is unreachable"))) == 1
    finally:
        first.close()
        second.close()


async def test_mqtt_is_refused_on_a_member_of_a_multi_member_cluster() -> None:
    settings = dataclasses.replace(
        pulsar_settings(),
        cluster=ClusterSettings(
            brokers=("pulsar://127.0.0.1:6650", "pulsar://127.0.0.1:6651"),
            advertised_url="pulsar://127.0.0.1:6650",
        ),
    )
    with pytest.raises(StartupError, match="put MQTT on separated proxies"):
        async with open_node(settings):
            pass


async def test_the_advertised_url_must_be_a_member() -> None:
    settings = dataclasses.replace(
        pulsar_settings(),
        protocols=("pulsar",),
        cluster=ClusterSettings(
            brokers=("pulsar://127.0.0.1:6650", "pulsar://127.0.0.1:6651"),
            advertised_url="pulsar://127.0.0.1:6652",
        ),
    )
    with pytest.raises(StartupError, match=r"is not one of cluster\.brokers"):
        async with open_node(settings):
            pass
