"""Overload protection: Sends refused while the node is over its memory mark (the stream goes
on), and a producer over its message rate not read from until it is back within it."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from mop.overload.guard import OverloadGuard
from mop.overload.watermark import Watermarks
from mop.processor import MessagingProcessor
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.pulsar_service import PRODUCE
from mop.protocols.grpc.status import StatusCode
from mop.settings import LimitsSettings
from tests.unit.protocols.grpc.serving.conftest import FakeCall


@pytest.fixture
def processor_options() -> dict[str, Any]:
    limits = LimitsSettings(client_message_rate=20.0)
    return {"overload": OverloadGuard(limits, watermarks=Watermarks(1000, 800))}


async def test_sends_over_the_memory_mark_are_refused_and_the_stream_goes_on(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    call = FakeCall(PRODUCE, {"pulsar-topic": "t"})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        processor.overload.observe_memory(1500)
        call.request(pb.Send(payload=b"refused", sequence_id=1))
        refused = await call.response(pb.SendResult)
        processor.overload.observe_memory(100)
        call.request(pb.Send(payload=b"stored", sequence_id=2))
        stored = await call.response(pb.SendResult)
        call.half_close()
    assert refused.error.code == StatusCode.RESOURCE_EXHAUSTED and refused.sequence_id == 1
    assert stored.HasField("message_id") and call.status is StatusCode.OK
    assert processor.overload.stats.publishes_refused == 1
    assert processor.stats.dropped == {"overloaded": 1}


async def test_a_producer_over_its_rate_is_held_back(methods: dict[str, MethodHandler]) -> None:
    call = FakeCall(PRODUCE, {"pulsar-topic": "t"})
    for n in range(40):
        call.request(pb.Send(payload=b"x", sequence_id=n + 1))
    call.half_close()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[PRODUCE])
        for _ in range(40):
            await call.response(pb.SendResult)
    # A second's worth (20) at once, the next 20 at 20 a second.
    assert trio.current_time() - start >= 0.8
    assert call.status is StatusCode.OK
