"""Flow control end to end, on a node process whose memory the test watches:
- a consume call that stops reading in front of a large stored backlog holds the node's
  memory to the broker's read-ahead, its receiver queue and the HTTP/2 window, not the
  backlog, and gets every message, in order, once it reads again;
- a producer stream that sends faster than storage stores is held back by HTTP/2 flow control
  (the client cannot get far ahead of the results), and every send gets its result, in order,
  with a message id: nothing is dropped.

Both modes, each on node processes of their own (a merged node; a separated proxy in front of
a broker), so that the resident memory measured is that of the process serving gRPC alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest

from mop.protocols.grpc.proto.mop_grpc_pb2 import Ack, Send, SendResult
from tests.e2e.grpc.interop import GrpcClient
from tests.e2e.nodeproc import GRPC_LISTENING, NodeProcess, broker_process

pytestmark = pytest.mark.e2e

MiB = 1 << 20
KiB = 1 << 10
# The node keeps the last 32 MiB of its log in memory for reads: filled before the baseline,
# so that the backlog replaces what it holds instead of adding to it.
WARMUP = 48 * MiB
BACKLOG = 64 * MiB
# The stalled consumer's messages: what may wait for it is bounded in messages as well as
# bytes (a merged broker reads a stored backlog ahead by up to 1000 messages or 16 MiB per
# subscription; a separated proxy takes up to 1000 + 500 per consumer from its brokers), so
# small messages keep that part well under the bound.
STALL_MESSAGE = 4 * KiB
# What the stalled consumer may cost the node: that read-ahead, the call's receiver queue (8
# messages), the HTTP/2 window and the allocator's noise. Far below BACKLOG: buffering it all
# cannot pass.
STALL_BOUND = 24 * MiB
# The producer's messages: large, so that the bound on what a produce call has in flight is
# met in bytes before it is in count.
PRODUCE_MESSAGE = 64 * KiB
FIXED_WINDOW = [("grpc.http2.bdp_probe", 0)]


@pytest.fixture(scope="module", params=["merged", "separated"])
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    """The process that serves gRPC: a merged node, or a separated proxy in front of a broker
    process (whose storage is then the one that fsyncs)."""
    workdir = tmp_path_factory.mktemp(f"flow-{request.param}")
    with contextlib.ExitStack() as stack:
        settings = {"MOP_PROTOCOLS": '["grpc"]', "MOP_STORAGE__FSYNC": "always"}
        if request.param == "separated":
            broker = broker_process(workdir / "broker", MOP_STORAGE__FSYNC="always")
            stack.callback(broker.end)
            broker.start()
            settings.update(MOP_MODE="separated", MOP_CLUSTER__SERVICE_URL=broker.service_url)
        process = NodeProcess(workdir / "node", listening=GRPC_LISTENING, **settings)
        stack.callback(process.end)
        process.start()
        yield process


def payloads(total: int, tag: str, size: int) -> list[bytes]:
    """`total` bytes of distinct messages of `size` bytes, each starting with its number."""
    return [f"{tag}-{n:08d}-".encode().ljust(size, b".") for n in range(total // size)]


def produce(client: GrpcClient, topic: str, messages: list[bytes]) -> list[SendResult]:
    sends = (Send(payload=p, sequence_id=n + 1) for n, p in enumerate(messages))
    return client.produce(topic, sends, timeout=120)


def test_a_consumer_that_stops_reading_does_not_make_the_node_buffer_the_backlog(
    node: NodeProcess,
) -> None:
    topic = f"stall-{uuid.uuid4().hex[:8]}"
    backlog = payloads(BACKLOG, "b", STALL_MESSAGE)
    with GrpcClient(node.port) as client:
        # Warm up: the same sizes through produce and consume, so that the storage's read
        # cache, the allocator and the HTTP/2 buffers have grown to their working size.
        warm = f"warm-{uuid.uuid4().hex[:8]}"
        warmup = payloads(WARMUP, "w", STALL_MESSAGE)
        produce(client, warm, warmup)
        with client.consumer(warm, "w", pulsar_initial_position="earliest") as reader:
            taken = reader.receive_many(len(warmup), timeout=30)
            reader.ack([m.message_id for m in taken])
        results = produce(client, topic, backlog)
        assert all(r.WhichOneof("result") == "message_id" for r in results)

    # The stalled consumer's own channel, its HTTP/2 window fixed at the default 64 KiB: what
    # the node may send it is the window, not what grpc-c's bandwidth probing grants it.
    with GrpcClient(node.port, options=FIXED_WINDOW) as stalled:
        acks_done = threading.Event()

        def no_acks() -> Iterator[Ack]:
            acks_done.wait()
            yield from ()

        time.sleep(0.5)
        before = node.rss()
        call = stalled.consume_call(
            topic,
            "stalled",
            no_acks(),
            pulsar_initial_position="earliest",
            pulsar_receiver_queue_size="8",
        )
        try:
            first = next(call)  # the call is open and delivering; from here on nobody reads
            assert first.payload == backlog[0]
            time.sleep(2.0)  # time for the node to push whatever it would push
            grown = node.rss() - before
            assert grown < STALL_BOUND, (
                f"the node grew {grown / MiB:.1f} MiB while {BACKLOG / MiB:.0f} MiB waited for"
                f" a consumer that does not read"
            )

            # Reading again: every message, in order, none lost while held back.
            rest = [next(call).payload for _ in backlog[1:]]
            assert rest == backlog[1:]
        finally:
            acks_done.set()
            call.cancel()


def test_a_producer_faster_than_storage_is_held_back_and_loses_nothing(
    node: NodeProcess,
) -> None:
    """fsync after every write makes storage the slow part; the client's request iterator is
    only drained as fast as the node takes messages, so at no time is most of the stream in
    flight, and every result arrives, in order."""
    topic = f"fast-{uuid.uuid4().hex[:8]}"
    messages = payloads(48 * MiB, "p", PRODUCE_MESSAGE)
    results: list[SendResult] = []
    ahead: list[int] = []  # messages sent and not yet answered, seen at each send

    def sends() -> Iterator[Send]:
        for n, payload in enumerate(messages):
            ahead.append(n - len(results))
            yield Send(payload=payload, sequence_id=n + 1)

    with GrpcClient(node.port) as client:
        try:
            for result in client.produce_call(topic, sends()):
                results.append(result)
        except grpc.RpcError as error:
            raise AssertionError(f"produce ended with {error.code()}: {error.details()}") from None

    assert [r.sequence_id for r in results] == list(range(1, len(messages) + 1))
    assert all(r.WhichOneof("result") == "message_id" for r in results), [
        r for r in results if r.WhichOneof("result") != "message_id"
    ][:3]
    # (A separated proxy stores them in batches: ids differ by their batch index there.)
    ids = [
        (r.message_id.ledger_id, r.message_id.entry_id, r.message_id.batch_index) for r in results
    ]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # Held back: the client was never more than a bounded part of the stream ahead.
    assert max(ahead) * PRODUCE_MESSAGE < 24 * MiB, f"{max(ahead)} messages were in flight at once"
