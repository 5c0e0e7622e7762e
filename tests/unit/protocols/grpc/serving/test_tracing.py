"""A traced node traces gRPC messages as it does the other protocols': publish and store
spans for a produced message (which carries its trace on), a deliver span for a consumed one."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mop.observability.tracing import NodeTracing
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.pulsar_service import CONSUME, SEND
from tests.unit.protocols.grpc.serving.conftest import FakeCall

EXPORTER = InMemorySpanExporter()


@pytest.fixture
def processor_options() -> dict[str, Any]:
    EXPORTER.clear()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    return {"tracing": NodeTracing(provider)}


async def test_a_sent_message_is_traced_to_its_consumer(methods: dict[str, MethodHandler]) -> None:
    consume = FakeCall(CONSUME, {"pulsar-topic": "traced", "pulsar-subscription": "s"})
    send = FakeCall(SEND, {"pulsar-topic": "traced"})
    send.request(pb.Send(payload=b"x"))
    send.half_close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume.run, methods[CONSUME])
        await trio.testing.wait_all_tasks_blocked(0.05)
        await send.run(methods[SEND])
        message = await consume.response(pb.Message)
        consume.half_close()
    assert [p.key for p in message.properties] == ["traceparent"]
    spans = {span.name: span for span in EXPORTER.get_finished_spans()}
    assert {"publish", "store", "deliver"} <= set(spans)
    publish, deliver = spans["publish"], spans["deliver"]
    assert publish.context is not None and deliver.parent is not None
    assert deliver.parent.span_id == publish.context.span_id
    assert deliver.attributes is not None and deliver.attributes["mop.protocol"] == "grpc"
