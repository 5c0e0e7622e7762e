"""A node's gRPC clients and protocol data in the admin API (answers checked against
openapi.yaml): the advertised URLs with the ports bound, the connections with their calls,
and a connection closed by the administrator."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest

from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.testing.node import RunningNode, running_node
from tests.e2e.admin.api import Api, encoded, eventually
from tests.e2e.grpc.server_support import grpc_node_settings

pytestmark = pytest.mark.e2e

CONSUME = "/mop.grpc.v1.PulsarGrpcService/consume"


@pytest.fixture(scope="module")
def node() -> Iterator[RunningNode]:
    with running_node(grpc_node_settings()) as running:
        yield running


def test_the_node_advertises_its_grpc_url_with_the_port_bound(node: RunningNode) -> None:
    _, port = node.node.address("grpc")
    info = Api(node).get("/api/v1/node")
    assert info["protocol_data"]["grpc"] == {"grpc": f"grpc://127.0.0.1:{port}"}
    assert info["protocol_data"]["mqtt"]["mqtt"].startswith("mqtt://127.0.0.1:")
    assert {"protocol": "grpc", "kind": "tcp", "host": "127.0.0.1", "port": port} in info[
        "listeners"
    ]
    assert node.node.protocol_data() == info["protocol_data"]


def test_a_grpc_connection_is_listed_with_its_calls_and_can_be_closed(node: RunningNode) -> None:
    api = Api(node)
    _, port = node.node.address("grpc")
    stop = threading.Event()

    def acks() -> Iterator[pb.Ack]:
        stop.wait(10)
        yield from ()

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        consume = channel.stream_stream(
            CONSUME,
            request_serializer=pb.Ack.SerializeToString,
            response_deserializer=pb.Message.FromString,
        )
        messages = consume(
            acks(),
            metadata=[("pulsar-topic", "admin-view"), ("pulsar-subscription", "watchers")],
            timeout=10,
        )
        # Listed once connected; its call a moment later.
        (client,) = eventually(
            lambda: [
                item
                for item in api.get("/api/v1/clients", protocol="grpc")["items"]
                if item["subscriptions"]
            ]
        )
        assert client["client_id"].startswith("grpc:127.0.0.1:")
        assert client["protocol"] == "grpc"
        assert client["subscriptions"] == 1
        detail = api.get(f"/api/v1/clients/{encoded(client['client_id'])}")
        (subscription,) = detail["subscriptions_detail"]
        assert (subscription["filter"], subscription["group"]) == ("admin-view", "watchers")
        api.delete(f"/api/v1/clients/{encoded(client['client_id'])}")
        with pytest.raises(grpc.RpcError) as ended:
            next(messages)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        stop.set()
    eventually(lambda: not api.get("/api/v1/clients", protocol="grpc")["items"])
