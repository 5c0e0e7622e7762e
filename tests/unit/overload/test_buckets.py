"""Token buckets and per-client budgets, on a clock the tests move by hand."""

from __future__ import annotations

import pytest

from mop.overload.buckets import ClientBudgets, ClientLimits, ClientRates, Rate, TokenBucket


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


def test_a_bucket_knows_when_it_is_full_again() -> None:
    bucket = TokenBucket(rate=10.0, burst=20.0, now=0.0)
    assert bucket.full_at(0.0) == 0.0
    bucket.charge(50, 0.0)  # 30 owed: full again once 50 are back
    assert bucket.full_at(1.0) == pytest.approx(5.0)


def test_a_client_that_connects_again_carries_on_with_its_budgets() -> None:
    budgets = ClientBudgets(ClientLimits(messages=Rate(10.0, 10.0), nbytes=Rate(1000.0)))
    rates = budgets.start("a", 0.0)
    assert rates is not None
    assert rates.charge(30, 0, 0.0) == pytest.approx(2.0)  # 20 owed
    budgets.end("a", rates, 0.5)
    other = budgets.start("b", 0.5)  # another client starts afresh
    assert other is not None and other.charge(10, 0, 0.5) == 0.0
    again = budgets.start("a", 1.0)
    assert again is rates  # with its debt: 10 more wait 2 s (10 still owed, then these)
    assert again.charge(10, 0, 1.0) == pytest.approx(2.0)


def test_a_connection_still_open_passes_its_budgets_on() -> None:
    """A client that gave up on a connection held back over its rates connects again before
    the node noticed: the new connection starts from what the old one has."""
    budgets = ClientBudgets(ClientLimits(messages=Rate(10.0, 10.0)))
    old = budgets.start("a", 0.0)
    assert old is not None
    old.charge(30, 0, 0.0)  # 20 owed: 2 s
    new = budgets.start("a", 0.5)  # 15 owed
    assert new is not None and new is not old
    assert new.charge(5, 0, 0.5) == pytest.approx(2.0)
    # The old one ends later: the new one, which carries on, is not replaced.
    budgets.end("a", old, 2.0)
    assert len(budgets) == 0
    budgets.end("a", new, 2.0)
    assert budgets.start("a", 2.1) is new


def test_budgets_are_kept_until_they_would_be_full_again() -> None:
    budgets = ClientBudgets(ClientLimits(messages=Rate(10.0, 10.0)))
    used = budgets.start("used", 0.0)
    untouched = budgets.start("untouched", 0.0)
    assert used is not None and untouched is not None
    used.charge(5, 0, 0.0)  # full again at 0.5
    budgets.end("used", used, 0.0)
    budgets.end("untouched", untouched, 0.0)  # full: nothing to keep
    assert len(budgets) == 1
    fresh = budgets.start("used", 0.6)  # full again by then: a fresh one is the same
    assert fresh is not used
    budgets.end("used", fresh, 0.6)
    # Those full again go when others are kept.
    for name, at in (("x", 1.0), ("y", 2.0)):
        rates = budgets.start(name, at)
        assert rates is not None
        rates.charge(5, 0, at)
        budgets.end(name, rates, at)
    assert len(budgets) == 1


def test_the_oldest_kept_budgets_go_first_beyond_the_limit() -> None:
    budgets = ClientBudgets(ClientLimits(messages=Rate(1.0, 1.0)), limit=2)
    kept = {}
    for name in ("a", "b", "c"):
        rates = budgets.start(name, 0.0)
        assert rates is not None
        rates.charge(100, 0, 0.0)
        budgets.end(name, rates, 0.0)
        kept[name] = rates
    assert len(budgets) == 2
    assert budgets.start("a", 1.0) is not kept["a"]
    assert budgets.start("b", 1.0) is kept["b"] and budgets.start("c", 1.0) is kept["c"]


def test_without_rates_there_are_no_budgets() -> None:
    budgets = ClientBudgets(ClientLimits())
    assert budgets.start("a", 0.0) is None
    budgets.end("a", None, 0.0)
    assert len(budgets) == 0
