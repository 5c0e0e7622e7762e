"""The send method: one Send stored, its SendResult once it is."""

from __future__ import annotations

import pytest
import trio

from mop.message import MessageId
from mop.processor import (
    BackendError,
    ClientContext,
    MessagingProcessor,
    StartPosition,
    SubscriptionSpec,
)
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.pulsar_service import SEND
from mop.protocols.grpc.status import StatusCode
from tests.unit.protocols.grpc.serving.conftest import FakeCall

TOPIC = "persistent://public/default/sent"
CTX = ClientContext(client_id="reader", protocol="test")


async def test_send_stores_the_message_and_answers_its_id(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    reader = await processor.subscribe(
        CTX, SubscriptionSpec("r", frozenset([TOPIC]), start=StartPosition.EARLIEST)
    )
    call = FakeCall(SEND, {"pulsar-topic": "sent"})
    call.request(
        pb.Send(
            payload=b"hello",
            key="k",
            properties=[pb.Property(key="a", value="1"), pb.Property(key="a", value="2")],
            event_time=5,
            sequence_id=7,
        )
    )
    call.half_close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[SEND])
        result = await call.response(pb.SendResult)
    assert call.status is StatusCode.OK
    assert result.sequence_id == 7 and result.HasField("message_id")
    (delivery,) = await reader.receive(10)
    assert delivery.message_id == MessageId(result.message_id.ledger_id, result.message_id.entry_id)
    message = delivery.message
    assert (message.payload, message.key, message.event_time) == (b"hello", "k", 5)
    assert message.properties == (("a", "1"), ("a", "2"))
    assert processor.stats.protocol("grpc").messages_received == 1
    assert processor.stats.protocol("grpc").opened == 1
    assert processor.stats.protocol("grpc").connections == 0


async def test_send_without_a_topic_is_an_invalid_argument(
    methods: dict[str, MethodHandler],
) -> None:
    call = FakeCall(SEND, {})
    call.request(pb.Send(payload=b"x"))
    call.half_close()
    await call.run(methods[SEND])
    assert call.status is StatusCode.INVALID_ARGUMENT
    assert "pulsar-topic" in call.message


async def test_a_node_that_cannot_admit_clients_answers_unavailable(
    processor: MessagingProcessor,
    methods: dict[str, MethodHandler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def unreachable(client_id: str) -> None:
        raise BackendError("no broker answers", reason="unavailable")

    monkeypatch.setattr(processor.backend, "open_client", unreachable)
    call = FakeCall(SEND, {"pulsar-topic": "sent"})
    call.request(pb.Send(payload=b"x"))
    call.half_close()
    await call.run(methods[SEND])
    assert call.status is StatusCode.UNAVAILABLE and "no broker answers" in call.message
    stats = processor.stats.protocol("grpc")
    assert stats.refused == {"unavailable": 1} and stats.connections == 0


async def test_a_node_at_its_connection_limit_answers_resource_exhausted(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    processor.max_connections = 1
    processor.stats.protocol("other").connections = 1
    call = FakeCall(SEND, {"pulsar-topic": "sent"})
    call.request(pb.Send(payload=b"x"))
    call.half_close()
    await call.run(methods[SEND])
    assert call.status is StatusCode.RESOURCE_EXHAUSTED
