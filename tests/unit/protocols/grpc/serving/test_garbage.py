"""Requests that are not the method's message, or messages with odd values, end the call with
INVALID_ARGUMENT or are answered: the handlers never fail otherwise."""

from __future__ import annotations

import random

import trio

from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.pulsar_service import CONSUME, PRODUCE
from mop.protocols.grpc.status import StatusCode
from tests.unit.protocols.grpc.serving.conftest import FakeCall

ENDINGS = {StatusCode.OK, StatusCode.INVALID_ARGUMENT}


def garbage(rng: random.Random) -> bytes:
    return rng.randbytes(rng.randrange(0, 40))


async def drain(call: FakeCall) -> None:
    async for _ in call.responses:
        pass


async def test_random_produce_requests(methods: dict[str, MethodHandler]) -> None:
    rng = random.Random(7)
    for round_ in range(40):
        call = FakeCall(PRODUCE, {"pulsar-topic": f"garbage-{round_}"})
        for _ in range(rng.randrange(1, 6)):
            call.raw_request(garbage(rng))
        call.half_close()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain, call)
            with trio.fail_after(5):
                await call.run(methods[PRODUCE])
        assert call.status in ENDINGS, (round_, call.status, call.message)


async def test_random_acks(methods: dict[str, MethodHandler]) -> None:
    rng = random.Random(11)
    odd_ids = [
        pb.MessageId(ledger_id=-5, entry_id=2**40, batch_index=-9, partition=3),
        pb.MessageId(),
        pb.MessageId(ledger_id=2**62, entry_id=-1),
    ]
    for round_ in range(40):
        metadata = {"pulsar-topic": f"acks-{round_}", "pulsar-subscription": "s"}
        call = FakeCall(CONSUME, metadata)
        for _ in range(rng.randrange(1, 6)):
            if rng.random() < 0.5:
                call.raw_request(garbage(rng))
            else:
                ack = pb.Ack(
                    type=rng.choice([pb.Ack.INDIVIDUAL, pb.Ack.CUMULATIVE]),
                    message_ids=rng.sample(odd_ids, rng.randrange(0, 3)),
                    negative_message_ids=rng.sample(odd_ids, rng.randrange(0, 3)),
                    redelivery_delay_ms=rng.randrange(0, 10),
                )
                call.request(ack)
        call.half_close()
        with trio.fail_after(5):
            await call.run(methods[CONSUME])
        assert call.status in ENDINGS, (round_, call.status, call.message)
