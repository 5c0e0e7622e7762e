"""Token buckets and per-client budgets, on a clock the tests move by hand."""

from __future__ import annotations

import pytest

from mop.overload.buckets import ClientLimits, ClientRates, Rate, TokenBucket


def test_a_bucket_starts_full_and_refuses_when_empty() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, now=100.0)
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]
    # A refusal spends nothing: half a second later one token is back.
    assert not bucket.take(100.4)
    assert bucket.take(100.5)
    assert not bucket.take(100.5)


def test_a_bucket_never_saves_more_than_its_burst() -> None:
    bucket = TokenBucket(rate=10.0, burst=2.0, now=0.0)
    assert bucket.take(0.0) and bucket.take(0.0)
    # An hour idle still leaves room for two at once, not 36000.
    assert [bucket.take(3600.0) for _ in range(3)] == [True, True, False]


def test_charge_goes_into_debt_and_says_how_long_to_wait() -> None:
    bucket = TokenBucket(rate=100.0, burst=100.0, now=0.0)
    assert bucket.charge(60, 0.0) == 0.0
    assert bucket.charge(90, 0.0) == pytest.approx(0.5)  # 50 owed at 100 a second
    assert bucket.tokens == pytest.approx(-50)
    # Waiting that long pays the debt; the next charge starts from zero.
    assert bucket.charge(10, 0.5) == pytest.approx(0.1)
    assert bucket.charge(0, 0.6) == pytest.approx(0.0, abs=1e-9)


def test_charged_reads_keep_to_the_rate_on_average() -> None:
    """A source that always waits as told sends `rate` a second, whatever its read sizes."""
    bucket = TokenBucket(rate=1000.0, burst=1000.0, now=0.0)
    now = 0.0
    sent = 0
    sizes = [37, 512, 3, 4096, 800] * 200
    for size in sizes:
        sent += size
        now += bucket.charge(size, now)
    # Everything but the first burst went at 1000 a second.
    assert now == pytest.approx((sent - 1000) / 1000.0)


def test_a_bucket_wants_positive_numbers() -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=0.0, burst=1.0, now=0.0)
    with pytest.raises(ValueError, match="burst"):
        TokenBucket(rate=1.0, burst=0.0, now=0.0)


def test_a_rate_without_a_burst_saves_one_second() -> None:
    assert Rate(250.0).bucket(0.0).burst == 250.0
    assert Rate(0.2).bucket(0.0).burst == 1.0  # at least one event
    assert Rate(250.0, burst=10).bucket(0.0).burst == 10.0


def test_client_limits_without_rates_give_no_budgets() -> None:
    assert not ClientLimits().enabled
    assert ClientLimits().start(0.0) is None


def test_client_rates_wait_for_the_tighter_budget() -> None:
    rates = ClientLimits(messages=Rate(10.0), nbytes=Rate(1000.0)).start(0.0)
    assert rates is not None
    # 20 messages of 10 bytes: the messages are over (1 s owed), the bytes are not.
    assert rates.charge(20, 200, 0.0) == pytest.approx(1.0)
    # One message of 2000 bytes a second later: the messages owe 0.1 s, the bytes (back to
    # their burst of 1000) owe 1 s.
    assert rates.charge(1, 2000, 1.0) == pytest.approx(1.0)


def test_client_rates_count_only_what_is_limited() -> None:
    only_bytes = ClientRates(None, TokenBucket(100.0, 100.0, 0.0))
    assert only_bytes.charge(10_000, 50, 0.0) == 0.0
    only_messages = ClientRates(TokenBucket(1.0, 1.0, 0.0), None)
    assert only_messages.charge(0, 10**9, 0.0) == 0.0
    assert only_messages.charge(3, 0, 0.0) == pytest.approx(2.0)


def test_the_read_size_follows_the_byte_burst() -> None:
    assert ClientRates(TokenBucket(1.0, 1.0, 0.0), None).read_size(65536) == 65536
    assert ClientRates(None, TokenBucket(8192.0, 8192.0, 0.0)).read_size(65536) == 8192
    assert ClientRates(None, TokenBucket(10.0, 10.0, 0.0)).read_size(65536) == 1024
    assert ClientRates(None, TokenBucket(1e9, 1e9, 0.0)).read_size(65536) == 65536
