"""Interop with grpc-js, Node's own gRPC implementation (`js/client.mjs`, which loads the .proto
mop ships): it produces, sends and consumes with acknowledgements against mop, next to grpcio
and MQTT clients on the same topics, in both modes.

Needs `node` and the client's packages (`npm ci --prefix tests/e2e/grpc/js`); skipped with the
reason when they are missing, an error under tox (REQUIRE_NODE_TESTS=1), which installs them.
"""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mop.protocols.grpc.proto.mop_grpc_pb2 import Send
from mop.protocols.grpc.status import StatusCode
from mop.settings import TlsSettings
from mop.testing import make_test_certificates
from mop.testing.node import node_settings, running_node
from tests.e2e.clients import Client
from tests.e2e.conftest import Topology
from tests.e2e.grpc.interop import (
    GrpcClient,
    Site,
    grpc_site,
    pairs,
    run_js,
    skip_unless_node,
    with_grpc,
)

skip_unless_node()

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

EVENT_TIME = 1_790_000_000_456


@pytest.fixture
def site(topology: Topology) -> Iterator[Site]:
    with grpc_site(topology) as running:
        yield running


@pytest.fixture
def topic(site: Site) -> str:
    return site.topic(f"js/{uuid.uuid4().hex[:10]}")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def js(site: Site, method: str, topic: str, **request: Any) -> dict[str, Any]:
    metadata = {"pulsar-topic": topic, **request.pop("metadata", {})}
    return run_js(
        {"target": f"127.0.0.1:{site.grpc_port}", "method": method, "metadata": metadata, **request}
    )


def test_grpc_js_produces_what_grpcio_consumes(site: Site, topic: str) -> None:
    sends = [
        {
            "payload": b64(f"js{n}".encode()),
            "key": f"k{n}",
            "properties": [["colour", "red"], ["n", str(n)]],
            "event_time": EVENT_TIME + n,
            "sequence_id": n + 1,
        }
        for n in range(5)
    ]
    answer = js(site, "produce", topic, sends=sends, metadata={"pulsar-producer-name": "js-p"})
    assert answer["status"]["code"] == StatusCode.OK, answer
    results = answer["results"]
    assert [int(r["sequence_id"]) for r in results] == [1, 2, 3, 4, 5]
    assert all(r["result"] == "message_id" for r in results), results

    with (
        GrpcClient(site.grpc_port) as client,
        client.consumer(topic, "py", pulsar_initial_position="earliest") as consumer,
    ):
        messages = consumer.receive_many(5)
        consumer.ack([m.message_id for m in messages])
    assert [m.payload for m in messages] == [f"js{n}".encode() for n in range(5)]
    assert [m.key for m in messages] == [f"k{n}" for n in range(5)]
    assert [pairs(m.properties) for m in messages] == [
        [("colour", "red"), ("n", str(n))] for n in range(5)
    ]
    assert [m.event_time for m in messages] == [EVENT_TIME + n for n in range(5)]
    assert {m.producer_name for m in messages} == {"js-p"}
    assert [(m.message_id.ledger_id, m.message_id.entry_id) for m in messages] == [
        (int(r["message_id"]["ledger_id"]), int(r["message_id"]["entry_id"])) for r in results
    ]


def test_grpc_js_consumes_and_acknowledges_what_grpcio_produces(site: Site, topic: str) -> None:
    with GrpcClient(site.grpc_port) as client:
        client.produce(
            topic,
            [Send(payload=bytes([n, 0, 255]), key="same", sequence_id=n + 1) for n in range(4)],
        )
        answer = js(
            site,
            "consume",
            topic,
            count=4,
            ack="individual",
            metadata={"pulsar-subscription": "js", "pulsar-initial-position": "earliest"},
        )
        assert answer["status"]["code"] == StatusCode.OK, answer
        messages = answer["messages"]
        assert [base64.b64decode(m["payload"]) for m in messages] == [
            bytes([n, 0, 255]) for n in range(4)
        ]
        assert {m["key"] for m in messages} == {"same"}
        assert {m["topic"] for m in messages} == {topic}
        assert all(int(m["publish_time"]) > 0 for m in messages), messages
        # Acknowledged by grpc-js: the subscription has nothing left for the next consumer.
        with client.consumer(topic, "js") as after:
            after.expect_nothing(timeout=1.0)


def test_grpc_js_cumulative_ack_covers_everything_before(site: Site, topic: str) -> None:
    with GrpcClient(site.grpc_port) as client:
        # One send after the other: an entry each. (A separated proxy batches a produce
        # stream's messages, and a cumulative ack inside a batch acknowledges the entries
        # before that batch only, as Pulsar's does; the rest of the batch comes again.)
        for n in range(6):
            client.send(topic, Send(payload=f"c{n}".encode()))
        metadata = {"pulsar-subscription": "cum", "pulsar-initial-position": "earliest"}
        answer = js(site, "consume", topic, count=4, ack="cumulative", metadata=metadata)
        assert answer["status"]["code"] == StatusCode.OK, answer
        with client.consumer(topic, "cum") as after:
            rest = after.receive_many(2)
            assert [m.payload for m in rest] == [b"c4", b"c5"]
            after.ack([m.message_id for m in rest])
            after.expect_nothing()


def test_grpc_js_negative_acks_are_redelivered_with_a_count(site: Site, topic: str) -> None:
    with GrpcClient(site.grpc_port) as client:
        client.produce(topic, [Send(payload=b"again")])
        metadata = {
            "pulsar-subscription": "neg",
            "pulsar-subscription-type": "shared",
            "pulsar-initial-position": "earliest",
        }
        answer = js(site, "consume", topic, count=1, ack="negative", metadata=metadata)
        assert answer["status"]["code"] == StatusCode.OK, answer
        assert answer["messages"][0]["redelivery_count"] == 0
        with client.consumer(topic, "neg", pulsar_subscription_type="shared") as after:
            message = after.receive()
            assert (message.payload, message.redelivery_count >= 1) == (b"again", True)
            after.ack([message.message_id])


def test_grpc_js_unary_send_reaches_an_mqtt_subscriber(site: Site) -> None:
    name = f"js/unary/{uuid.uuid4().hex[:8]}"
    subscriber = Client(site.node.mqtt_port, "js-sub")
    subscriber.subscribe(name, 1)
    sends = [{"payload": b64(b"from node"), "properties": [["mqtt.content_type", "text/x"]]}]
    answer = js(site, "send", site.topic(name), sends=sends)
    assert answer["status"]["code"] == StatusCode.OK, answer
    assert answer["results"][0]["result"] == "message_id"
    [received] = subscriber.expect(1)
    assert (received.payload, received.properties.ContentType) == (b"from node", "text/x")


def test_grpc_js_sees_statuses_with_their_messages(site: Site) -> None:
    answer = run_js(
        {
            "target": f"127.0.0.1:{site.grpc_port}",
            "method": "send",
            "metadata": {},
            "sends": [{"payload": b64(b"x")}],
        }
    )
    assert answer["status"]["code"] == StatusCode.INVALID_ARGUMENT, answer
    assert "pulsar-topic" in answer["status"]["details"]
    answer = js(site, "consume", site.topic("js/no-sub"), count=1, timeout_ms=5000)
    assert answer["status"]["code"] == StatusCode.INVALID_ARGUMENT, answer
    assert "pulsar-subscription" in answer["status"]["details"]


@pytest.mark.merged_only(reason="the TLS listener is the adapter's, the same in both modes")
def test_grpc_js_over_mutual_tls(tmp_path: Path) -> None:
    """grpc-js negotiates HTTP/2 over TLS (ALPN h2) with mop's TLS listener, trusting the test
    CA and presenting a client certificate where the listener asks for one."""
    certificates = make_test_certificates(tmp_path)
    tls = TlsSettings(
        certfile=str(certificates.server_cert),
        keyfile=str(certificates.server_key),
        cafile=str(certificates.ca_cert),
        require_client_cert=True,
    )
    settings = with_grpc(node_settings())
    settings = dataclasses.replace(
        settings, grpc=dataclasses.replace(settings.grpc, tls_port=0, tls=tls)
    )
    with running_node(settings) as node:
        _, port = node.node.address("grpc", "tls")
        topic = "persistent://public/default/js-tls"
        client_tls = {
            "ca": str(certificates.ca_cert),
            "cert": str(certificates.client_cert),
            "key": str(certificates.client_key),
        }
        request = {"target": f"localhost:{port}", "metadata": {"pulsar-topic": topic}}
        sent = run_js(
            {**request, "method": "send", "tls": client_tls, "sends": [{"payload": b64(b"s")}]}
        )
        assert sent["status"]["code"] == StatusCode.OK, sent
        consume = {
            **request,
            "method": "consume",
            "tls": client_tls,
            "count": 1,
            "metadata": {
                "pulsar-topic": topic,
                "pulsar-subscription": "tls",
                "pulsar-initial-position": "earliest",
            },
        }
        answer = run_js(consume)
        assert answer["status"]["code"] == StatusCode.OK, answer
        assert [base64.b64decode(m["payload"]) for m in answer["messages"]] == [b"s"]
        # Without a client certificate the mTLS listener refuses the handshake.
        refused = run_js(
            {
                **request,
                "method": "send",
                "tls": {"ca": client_tls["ca"]},
                "sends": [{"payload": b64(b"x")}],
                "timeout_ms": 10000,
            }
        )
        assert refused["status"]["code"] == StatusCode.UNAVAILABLE, refused
