"""PulsarGrpcService end to end with grpcio, the reference gRPC client, in both modes (a merged
node; a separated proxy in front of a mop broker): round trips, acks and redelivery, the
topics shared with Pulsar clients, and authentication."""

from __future__ import annotations

import dataclasses
import queue
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import jwt
import pytest

from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.pulsar_service import CONSUME, PRODUCE, SEND
from mop.security.passwords import update_password_file
from mop.settings import AuthSettings, ClusterSettings, JwtSettings, PulsarSettings, Settings
from mop.testing.node import RunningNode
from mop.testing.node import running_node as start_node
from tests.e2e.conftest import Topology
from tests.e2e.grpc.server_support import grpc_node_settings
from tests.e2e.nodeproc import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

SECRET = "grpc-service-test-secret-32-bytes!"
ADMIN_LISTENING = re.compile(r"admin listening on tcp (?P<host>\S+):(?P<port>\d+)")
# Every call of these tests ends well before this (seconds).
DEADLINE = 20


def deployed(topology: Topology, **overrides: Any) -> Settings:
    """A node serving gRPC in the test's mode (a proxy in front of the module's broker, in
    separated mode)."""
    base = dataclasses.replace(grpc_node_settings(), **overrides)
    return dataclasses.replace(topology.settings(base), protocols=base.protocols)


@pytest.fixture
def node(topology: Topology) -> Iterator[RunningNode]:
    with start_node(deployed(topology)) as running:
        yield running


def open_channel(node: RunningNode) -> grpc.Channel:
    _, port = node.node.address("grpc")
    return grpc.insecure_channel(f"127.0.0.1:{port}")


@pytest.fixture
def channel(node: RunningNode) -> Iterator[grpc.Channel]:
    with open_channel(node) as opened:
        yield opened


@pytest.fixture
def topic() -> str:
    return f"grpc-{uuid.uuid4().hex[:10]}"


class Requests:
    """A request stream the test writes to as it goes; `close` half-closes it."""

    _END = object()

    def __init__(self) -> None:
        self._queue: queue.Queue[object] = queue.Queue()

    def put(self, message: Any) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self._queue.put(self._END)

    def __iter__(self) -> Iterator[Any]:
        while (item := self._queue.get()) is not self._END:
            yield item


def stubs(channel: grpc.Channel) -> tuple[Any, Any, Any]:
    produce = channel.stream_stream(
        PRODUCE,
        request_serializer=pb.Send.SerializeToString,
        response_deserializer=pb.SendResult.FromString,
    )
    consume = channel.stream_stream(
        CONSUME,
        request_serializer=pb.Ack.SerializeToString,
        response_deserializer=pb.Message.FromString,
    )
    send = channel.unary_unary(
        SEND,
        request_serializer=pb.Send.SerializeToString,
        response_deserializer=pb.SendResult.FromString,
    )
    return produce, consume, send


def consumer(
    channel: grpc.Channel, topic: str, subscription: str = "s", **metadata: str
) -> tuple[Requests, Any]:
    _, consume, _ = stubs(channel)
    acks = Requests()
    pairs = {
        "pulsar-topic": topic,
        "pulsar-subscription": subscription,
        "pulsar-initial-position": "earliest",
        **metadata,
    }
    return acks, consume(iter(acks), metadata=tuple(pairs.items()), timeout=DEADLINE)


def test_produced_messages_reach_a_consumer_with_their_fields(
    node: RunningNode, channel: grpc.Channel, topic: str
) -> None:
    produce, _, send = stubs(channel)
    sends = [
        pb.Send(
            payload=b"m%d" % n,
            key=f"k{n}",
            properties=[pb.Property(key="n", value=str(n)), pb.Property(key="n", value="again")],
            event_time=1000 + n,
            sequence_id=n + 1,
        )
        for n in range(20)
    ]
    metadata = (("pulsar-topic", topic), ("pulsar-producer-name", "e2e"))
    results = list(produce(iter(sends), metadata=metadata, timeout=DEADLINE))
    assert [r.sequence_id for r in results] == list(range(1, 21))
    assert all(r.HasField("message_id") for r in results)
    unary = send(pb.Send(payload=b"last"), metadata=(("pulsar-topic", topic),), timeout=DEADLINE)
    assert unary.HasField("message_id")

    acks, messages = consumer(channel, topic)
    got = [next(messages) for _ in range(21)]
    assert [m.payload for m in got] == [*(b"m%d" % n for n in range(20)), b"last"]
    first = got[0]
    assert (first.key, first.event_time, first.producer_name) == ("k0", 1000, "e2e")
    assert [(p.key, p.value) for p in first.properties] == [("n", "0"), ("n", "again")]
    assert first.topic == f"persistent://public/{first.topic.split('/')[3]}/{topic}"
    assert first.message_id.ledger_id == results[0].message_id.ledger_id
    assert first.message_id.entry_id == results[0].message_id.entry_id
    acks.put(pb.Ack(message_ids=[m.message_id for m in got]))
    acks.close()
    assert list(messages) == []
    stats = node.call(lambda: node.node.processor.stats.protocol("grpc"))
    assert (stats.messages_received, stats.messages_sent, stats.opened) == (21, 21, 3)
    assert stats.requests >= 21 + 1  # the Sends and the Ack


def test_nacked_and_unacked_messages_are_redelivered_with_a_count(
    channel: grpc.Channel, topic: str
) -> None:
    _, _, send = stubs(channel)
    for payload in (b"a", b"b"):
        send(pb.Send(payload=payload), metadata=(("pulsar-topic", topic),), timeout=DEADLINE)
    acks, messages = consumer(channel, topic)
    a, b = next(messages), next(messages)
    assert (a.payload, b.payload, a.redelivery_count) == (b"a", b"b", 0)
    acks.put(pb.Ack(negative_message_ids=[a.message_id]))
    again = next(messages)
    assert (again.payload, again.redelivery_count) == (b"a", 1)
    acks.put(pb.Ack(message_ids=[again.message_id]))
    acks.close()
    assert list(messages) == []
    # b was never acknowledged: the subscription's next consumer gets it.
    acks, messages = consumer(channel, topic)
    redelivered = next(messages)
    assert (redelivered.payload, redelivered.redelivery_count) == (b"b", 1)
    acks.put(pb.Ack(type=pb.Ack.CUMULATIVE, message_ids=[redelivered.message_id]))
    acks.close()
    assert list(messages) == []


def test_statuses_reach_the_client(channel: grpc.Channel, topic: str) -> None:
    _, _, send = stubs(channel)
    with pytest.raises(grpc.RpcError) as missing:
        send(pb.Send(payload=b"x"), timeout=DEADLINE)
    assert missing.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "pulsar-topic" in missing.value.details()
    acks, messages = consumer(channel, topic, **{"pulsar-subscription-type": "shared"})
    send(pb.Send(payload=b"x"), metadata=(("pulsar-topic", topic),), timeout=DEADLINE)
    first = next(messages)
    acks.put(pb.Ack(type=pb.Ack.CUMULATIVE, message_ids=[first.message_id]))
    with pytest.raises(grpc.RpcError) as cumulative:
        next(messages)
    assert cumulative.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    acks.close()


def write_passwords(path: Path) -> str:
    path.write_text(update_password_file("", "alice", b"wonderland"))
    return str(path)


@pytest.fixture
def secured(topology: Topology, tmp_path: Path) -> Iterator[RunningNode]:
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite mine/#\n")
    auth = AuthSettings(
        allow_anonymous=False,
        password_file=write_passwords(tmp_path / "passwords"),
        acl_file=str(acl),
        jwt=JwtSettings(secret=SECRET),
        max_failures=0,
    )
    with start_node(deployed(topology, auth=auth)) as running:
        yield running


def test_calls_authenticate_with_bearer_or_basic_and_the_acl_decides(
    secured: RunningNode,
) -> None:
    token = jwt.encode({"sub": "alice", "exp": int(time.time()) + 300}, SECRET, algorithm="HS256")
    mine = (("pulsar-topic", "mine%2Fa"),)
    with open_channel(secured) as channel:
        _, _, send = stubs(channel)
        with pytest.raises(grpc.RpcError) as anonymous:
            send(pb.Send(payload=b"x"), metadata=mine, timeout=DEADLINE)
        assert anonymous.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as wrong:
            send(
                pb.Send(payload=b"x"),
                metadata=(*mine, ("authorization", "Bearer not-a-token")),
                timeout=DEADLINE,
            )
        assert wrong.value.code() is grpc.StatusCode.UNAUTHENTICATED
        bearer = send(
            pb.Send(payload=b"x"),
            metadata=(*mine, ("authorization", f"Bearer {token}")),
            timeout=DEADLINE,
        )
        assert bearer.HasField("message_id")
        basic = send(
            pb.Send(payload=b"y"),
            metadata=(*mine, ("authorization", "Basic YWxpY2U6d29uZGVybGFuZA==")),
            timeout=DEADLINE,
        )
        assert basic.HasField("message_id")
        with pytest.raises(grpc.RpcError) as denied:
            send(
                pb.Send(payload=b"x"),
                metadata=(("pulsar-topic", "theirs"), ("authorization", f"Bearer {token}")),
                timeout=DEADLINE,
            )
        assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED


def brokers_admin(request: pytest.FixtureRequest, topology: Topology) -> ClusterSettings:
    """What a separated proxy needs to make partitioned topics: its broker's admin URL."""
    if topology.mode != "separated":
        return ClusterSettings()
    broker: NodeProcess = request.getfixturevalue("broker")
    # Logged just after its Pulsar listener, so maybe not read from its output yet.
    (listening,) = broker.find(ADMIN_LISTENING) or [broker.wait_for(ADMIN_LISTENING, 10)]
    return ClusterSettings(admin_url=f"http://{listening['host']}:{listening['port']}")


def test_a_partitioned_topic_is_produced_to_and_consumed_from_every_partition(
    request: pytest.FixtureRequest, topology: Topology, topic: str
) -> None:
    # Declared in settings: a separated proxy declares it on its brokers (in the background).
    pulsar = PulsarSettings(partitioned_topics={topic: 3})
    settings = deployed(topology, pulsar=pulsar, cluster=brokers_admin(request, topology))
    with start_node(settings) as node, open_channel(node) as channel:
        settings = node.node.settings
        full = f"persistent://{settings.default_tenant}/{settings.default_namespace}/{topic}"
        partitioned = node.node.processor.partitioned
        deadline = time.monotonic() + DEADLINE
        while node.run(lambda: partitioned.partitions(full)) != 3:
            assert time.monotonic() < deadline, "the partitioned topic was not declared"
            time.sleep(0.05)
        produce, _, _ = stubs(channel)
        sends = [pb.Send(payload=b"%d" % n, sequence_id=n + 1) for n in range(6)]
        sends += [pb.Send(payload=b"keyed", key="one-key", sequence_id=7 + n) for n in range(3)]
        metadata = (("pulsar-topic", topic),)
        results = list(produce(iter(sends), metadata=metadata, timeout=DEADLINE))
        assert [r.message_id.partition for r in results[:6]] == [0, 1, 2, 0, 1, 2]
        assert len({r.message_id.partition for r in results[6:]}) == 1

        acks, messages = consumer(channel, topic)
        got = [next(messages) for _ in range(9)]
        assert sorted(m.payload for m in got) == sorted(s.payload for s in sends)
        for message in got:
            assert message.topic == f"{full}-partition-{message.message_id.partition}"
        # Partitions number their messages alike: each ack reaches the partition its id names.
        acks.put(pb.Ack(message_ids=[m.message_id for m in got]))
        acks.close()
        assert list(messages) == []
        acks, messages = consumer(channel, topic)
        acks.close()
        assert list(messages) == []
