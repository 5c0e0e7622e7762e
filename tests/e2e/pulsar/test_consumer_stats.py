"""CONSUMER_STATS end to end. pulsar-client's Python API (sync and asyncio) does not expose a
consumer's broker stats, so a raw client speaking mop's codec asks, about a consumer that
pulsar-client's producer fed. Merged, and on the broker node of a separated deployment (where
Pulsar clients connect)."""

from __future__ import annotations

import socket
from datetime import datetime

import pytest

from mop.protocols.pulsar.commands import (
    Ack,
    AckType,
    ConsumerStats,
    ConsumerStatsResponse,
    Flow,
    Message,
    Subscribe,
    SubType,
    Success,
)
from mop.protocols.pulsar.errors import ServerError
from tests.e2e.pulsar_support import (
    Deployment,
    RawPulsar,
    pulsar_client,
    pulsar_port,
    topic_for,
)

pytestmark = pytest.mark.e2e


def stats_of(raw: RawPulsar, consumer_id: int, request_id: int) -> ConsumerStatsResponse:
    raw.send(ConsumerStats(request_id=request_id, consumer_id=consumer_id))
    answer = raw.recv()
    assert isinstance(answer, ConsumerStatsResponse), answer
    assert answer.request_id == request_id
    return answer


def test_a_consumers_stats(deployment: Deployment, request: pytest.FixtureRequest) -> None:
    topic = topic_for(request.node.name)
    raw = RawPulsar(pulsar_port(deployment.pulsar))
    try:
        assert raw.connect() is not None
        raw.send(
            Subscribe(
                topic=topic,
                subscription="metered",
                sub_type=SubType.Shared,
                consumer_id=1,
                request_id=1,
                consumer_name="meter",
            )
        )
        assert raw.recv() == Success(request_id=1)
        raw.send(Flow(consumer_id=1, message_permits=10))
        with pulsar_client(deployment.pulsar) as client:
            producer = client.create_producer(topic, batching_enabled=False)
            for i in range(3):
                producer.send(f"m{i}".encode())
        delivered = [raw.recv() for _ in range(3)]
        assert all(isinstance(frame, Message) for frame in delivered)
        first = delivered[0]
        assert isinstance(first, Message)
        raw.send(Ack(consumer_id=1, ack_type=AckType.Individual, message_id=(first.message_id,)))
        local = raw.sock.getsockname()
        stats = stats_of(raw, 1, 2)
        assert stats.error_code is None
        assert stats.consumer_name == "meter" and stats.type == "Shared"
        assert stats.available_permits == 7
        assert stats.unacked_messages == 2
        assert stats.msg_backlog == 2
        assert stats.blocked_consumer_on_unacked_msgs is False
        assert stats.msg_rate_out is not None and stats.msg_rate_out > 0
        assert stats.msg_throughput_out is not None and stats.msg_throughput_out > 0
        assert stats.msg_rate_redeliver == 0.0 and stats.msg_rate_expired == 0.0
        assert stats.message_ack_rate is not None and stats.message_ack_rate > 0
        assert stats.address == f"/{local[0]}:{local[1]}"
        assert stats.connected_since is not None
        assert datetime.fromisoformat(stats.connected_since).tzinfo is not None
        # Rates cover a window, whoever asks: a second report right after the first (another
        # client's, say) is told the same rates instead of rates since that report.
        again = stats_of(raw, 1, 3)
        assert (again.msg_rate_out, again.message_ack_rate) == (
            stats.msg_rate_out,
            stats.message_ack_rate,
        )
        missing = stats_of(raw, 9, 4)
        assert missing.error_code is ServerError.ConsumerNotFound and missing.error_message
    finally:
        raw.sock.shutdown(socket.SHUT_RDWR)
        raw.close()
