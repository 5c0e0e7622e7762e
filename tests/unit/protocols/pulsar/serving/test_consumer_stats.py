"""CONSUMER_STATS's pure parts: the consumer's meter, its response, and the response's
encoding (doubles on the wire)."""

from __future__ import annotations

import pytest

from mop.protocols.pulsar.commands import ConsumerStatsResponse, SubType
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import FrameDecoder, encode_command
from mop.protocols.pulsar.serving.consumer_stats import (
    ConsumerMeter,
    stats_response,
    wall_clock_text,
)


def test_rates_cover_a_window_whoever_asks() -> None:
    meter = ConsumerMeter(since=100.0)
    meter.granted(10)
    meter.sent(4, 400)
    meter.redelivering(2)
    meter.acknowledged(3)
    assert meter.permits == 6
    first = meter.rates(102.0)  # the first report measures from subscribing
    assert first == (2.0, 200.0, 1.0, 1.5)
    meter.sent(20, 100)  # more than granted: never below zero
    assert meter.permits == 0
    # Another client asking within the window is told the same, and does not reset it.
    assert meter.rates(103.0) == first
    assert meter.rates(106.0) == first
    assert meter.rates(107.0) == (4.0, 20.0, 0.0, 0.0)  # 102 -> 107


def test_the_response_says_what_pulsar_says() -> None:
    meter = ConsumerMeter(since=0.0)
    meter.granted(5)
    meter.sent(1, 10)
    answer = stats_response(
        7,
        meter,
        2.0,
        name="c",
        sub_type=SubType.Key_Shared,
        address="/127.0.0.1:5000",
        unacked=1,
        backlog=3,
    )
    assert (answer.request_id, answer.consumer_name, answer.type) == (7, "c", "Key_Shared")
    assert (answer.available_permits, answer.unacked_messages, answer.msg_backlog) == (4, 1, 3)
    assert (answer.msg_rate_out, answer.msg_throughput_out) == (0.5, 5.0)
    assert answer.message_ack_rate == 0.0
    assert answer.blocked_consumer_on_unacked_msgs is False
    assert answer.connected_since == "1970-01-01T00:00:00.000Z"


def test_wall_clock_text() -> None:
    assert wall_clock_text(1_700_000_000.25) == "2023-11-14T22:13:20.250Z"


@pytest.mark.parametrize(
    "answer",
    [
        ConsumerStatsResponse(request_id=1, msg_rate_out=1.5, msg_throughput_out=1e9, type="x"),
        ConsumerStatsResponse(request_id=3, message_ack_rate=0.25),
        ConsumerStatsResponse(
            request_id=2, error_code=ServerError.ConsumerNotFound, error_message="none"
        ),
    ],
)
def test_the_response_goes_over_the_wire(answer: ConsumerStatsResponse) -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_command(answer))
    assert decoder.next_frame() == answer
