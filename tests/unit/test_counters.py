"""`mop.counters`: latency buckets and their sampling, per-protocol counters, reason names."""

from __future__ import annotations

import pytest

from mop.counters import (
    Closing,
    Drop,
    LatencyHistogram,
    ProtocolStats,
    Refusal,
    drop_reason,
    refusal_of,
)
from mop.messaging import QUEUE_FULL
from mop.security.identity import AuthFailure


def test_a_duration_lands_in_the_first_bucket_whose_bound_holds_it() -> None:
    histogram = LatencyHistogram((0.001, 0.01, 0.1))
    for seconds in (0.0005, 0.001, 0.002, 0.01, 0.05, 3.0):
        histogram.record(seconds)
    # Buckets are "<= bound" (Prometheus `le`), the last one above every bound.
    assert histogram.counts == [2, 2, 1, 1]
    assert histogram.count == 6
    assert histogram.total == pytest.approx(3.0635)
    assert (histogram.low, histogram.high) == (0.0005, 3.0)


def test_bounds_must_increase() -> None:
    with pytest.raises(ValueError):
        LatencyHistogram((0.1, 0.01))


def test_due_is_true_once_per_every_events_counted() -> None:
    histogram = LatencyHistogram(every=4)
    assert [histogram.due() for _ in range(8)] == [False, False, False, True] * 2
    # Batches count by their size: one sample per batch at most, then the count starts again.
    assert histogram.due(3) is False
    assert histogram.due(10) is True
    assert [histogram.due() for _ in range(4)] == [False, False, False, True]


def test_sampling_can_change_and_one_means_every_event() -> None:
    histogram = LatencyHistogram(every=100)
    histogram.sample_every(1)
    assert all(histogram.due() for _ in range(5))
    histogram.sample_every(0)  # at least one
    assert histogram.every == 1


def test_an_age_is_recorded_in_seconds_and_only_when_known() -> None:
    histogram = LatencyHistogram()
    histogram.record_age(now_ms=10_250, since_ms=10_000)
    histogram.record_age(now_ms=10_250, since_ms=0)  # no publish time: nothing
    histogram.record_age(now_ms=10_000, since_ms=10_005)  # another host's clock ahead: 0
    assert histogram.count == 2
    assert histogram.total == pytest.approx(0.25)
    assert histogram.low == 0.0


def test_protocol_stats_count_refusals_and_closings_by_reason() -> None:
    stats = ProtocolStats("mqtt")
    stats.connections = 2
    stats.refuse(Refusal.BAD_CREDENTIALS)
    stats.refuse(Refusal.BAD_CREDENTIALS)
    stats.refuse(Refusal.BANNED)
    stats.close(Closing.TAKEOVER)
    stats.record_sent(3, 300)
    stats.record_received_bytes(40)
    assert stats.refused == {"bad_credentials": 2, "banned": 1}
    assert stats.closed == {"takeover": 1}
    assert (stats.connections, stats.messages_sent, stats.bytes_sent) == (1, 3, 300)
    assert stats.bytes_received == 40


def test_reason_names() -> None:
    assert refusal_of(AuthFailure.EXPIRED) is Refusal.BAD_CREDENTIALS
    assert refusal_of(AuthFailure.BANNED) is Refusal.BANNED
    assert refusal_of(AuthFailure.NOT_AUTHORIZED) is Refusal.NOT_AUTHORIZED
    assert drop_reason(QUEUE_FULL) == Drop.QUEUE_FULL == "queue_full"
    assert drop_reason("something new") == "something_new"
