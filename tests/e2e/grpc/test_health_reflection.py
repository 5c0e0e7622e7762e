"""A node serving gRPC: the standard health service (grpcio-health-checking's stub) and server
reflection (grpcio-reflection's descriptor database), as load balancers and grpcurl use them."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from mop.testing.node import RunningNode, running_node
from tests.e2e.grpc.server_support import grpc_node_settings

pytestmark = pytest.mark.e2e

_HEALTH = "grpc.health.v1.Health"


@pytest.fixture(scope="module")
def node() -> Iterator[RunningNode]:
    with running_node(grpc_node_settings()) as running:
        yield running


@pytest.fixture
def channel(node: RunningNode) -> Iterator[grpc.Channel]:
    _, port = node.node.address("grpc")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as opened:
        yield opened


def test_the_node_is_serving(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", _HEALTH):
        answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_an_unknown_service_is_not_found(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    with pytest.raises(grpc.RpcError) as failed:
        stub.Check(health_pb2.HealthCheckRequest(service="no.Such"), timeout=5)
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND


def test_watch_sends_the_current_status_and_then_waits(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    answers = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=1.5)
    assert next(answers).status == health_pb2.HealthCheckResponse.SERVING
    # Nothing changes: no second message before the deadline.
    with pytest.raises(grpc.RpcError) as ended:
        next(answers)
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_watch_of_an_unknown_service_says_so_and_stays(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    answers = stub.Watch(health_pb2.HealthCheckRequest(service="no.Such"), timeout=1)
    assert next(answers).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def test_watch_sees_the_node_close(node: RunningNode) -> None:
    # A node of its own, closed while a watch is open.
    with running_node(grpc_node_settings()) as closing:
        _, port = closing.node.address("grpc")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        answers = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
        assert next(answers).status == health_pb2.HealthCheckResponse.SERVING
    # Closing: the watch ends with UNAVAILABLE (clients look for another node).
    with pytest.raises(grpc.RpcError) as ended:
        for _ in answers:
            pass
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()


def test_reflection_lists_the_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert {
        _HEALTH,
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services


def test_reflection_describes_a_service_with_its_methods(channel: grpc.Channel) -> None:
    pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    health = pool.FindServiceByName(_HEALTH)
    assert {"Check", "Watch"} <= set(health.methods_by_name)
    request = pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")
    assert [field.name for field in request.fields] == ["service"]


def _ask(
    channel: grpc.Channel, request: reflection_pb2.ServerReflectionRequest
) -> reflection_pb2.ServerReflectionResponse:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    return answer


def test_reflection_answers_an_unknown_name_with_not_found(channel: grpc.Channel) -> None:
    for request in (
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="no.Such.Thing"),
        reflection_pb2.ServerReflectionRequest(file_by_filename="no/such.proto"),
        reflection_pb2.ServerReflectionRequest(
            file_containing_extension=reflection_pb2.ExtensionRequest(
                containing_type="grpc.health.v1.HealthCheckRequest", extension_number=5
            )
        ),
    ):
        answer = _ask(channel, request)
        assert answer.WhichOneof("message_response") == "error_response"
        assert answer.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


def test_reflection_v1_is_served_too(channel: grpc.Channel) -> None:
    # grpcurl asks v1 first; the messages are v1alpha's, so its stub works on the v1 path.
    call = channel.stream_stream(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    request = reflection_pb2.ServerReflectionRequest(
        file_containing_symbol="grpc.reflection.v1.ServerReflection"
    )
    (answer,) = list(call(iter([request]), timeout=5))
    names = [
        descriptor_pb2.FileDescriptorProto.FromString(data).name
        for data in answer.file_descriptor_response.file_descriptor_proto
    ]
    assert names == ["grpc/reflection/v1/reflection.proto"]


def test_reflection_describes_mops_service(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    assert "mop.grpc.v1.PulsarGrpcService" in database.get_services()
    pool = DescriptorPool(database)
    service = pool.FindServiceByName("mop.grpc.v1.PulsarGrpcService")
    assert set(service.methods_by_name) == {"produce", "consume", "send"}
    send = pool.FindMessageTypeByName("mop.grpc.v1.Send")
    assert send.fields_by_name["payload"].number == 1
    health = health_pb2_grpc.HealthStub(channel)
    answer = health.Check(
        health_pb2.HealthCheckRequest(service="mop.grpc.v1.PulsarGrpcService"), timeout=5
    )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
