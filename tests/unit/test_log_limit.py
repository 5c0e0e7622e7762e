"""Tests of `RateLimit` and `LimitedLog`: one line per kind per interval, with a count."""

from __future__ import annotations

import logging

import pytest

from mop.log_limit import LimitedLog, LineBudget, RateLimit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_first_event_of_a_kind_is_admitted_then_held_for_the_interval() -> None:
    clock = FakeClock()
    limit = RateLimit(10.0, clock)
    assert limit.admit("full") == 0
    clock.now += 9.9
    assert limit.admit("full") is None
    assert limit.admit("full") is None
    clock.now += 0.1
    assert limit.admit("full") == 2
    assert limit.admit("full") is None


def test_kinds_are_limited_apart() -> None:
    clock = FakeClock()
    limit = RateLimit(10.0, clock)
    assert limit.admit("a") == 0
    assert limit.admit("b") == 0
    assert limit.admit("a") is None
    clock.now += 10
    assert limit.admit("b") == 0
    assert limit.admit("a") == 1


def test_limited_log_writes_one_line_per_interval_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    log = LimitedLog(logging.getLogger("mop.test.limit"), RateLimit(10.0, clock))
    with caplog.at_level(logging.WARNING, "mop.test.limit"):
        for i in range(1000):
            log.warning("full", "publish %d refused: %s", i, "disk full")
        clock.now += 10
        log.warning("full", "publish %d refused: %s", 1000, "disk full")
        log.error("other", "something else")
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "publish 0 refused: disk full",
        "publish 1000 refused: disk full (999 more like this in the last 10 s)",
        "something else",
    ]


def test_disabled_level_counts_nothing(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    limit = RateLimit(10.0, clock)
    log = LimitedLog(logging.getLogger("mop.test.limit.quiet"), limit)
    with caplog.at_level(logging.ERROR, "mop.test.limit.quiet"):
        log.warning("full", "not written")
    assert caplog.records == []
    assert limit.admit("full") == 0


def test_line_budget_admits_so_many_lines_per_window_and_counts_the_rest() -> None:
    clock = FakeClock()
    budget = LineBudget(3, 1.0, clock)
    assert [budget.admit() for _ in range(5)] == [0, 0, 0, None, None]
    clock.now += 0.5
    assert budget.admit() is None  # the same window
    clock.now += 0.5
    assert budget.admit() == 3  # a new window; it says how many were held back
    assert budget.admit() == 0
    clock.now += 10
    assert [budget.admit() for _ in range(4)] == [0, 0, 0, None]
