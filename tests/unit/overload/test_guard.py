"""The overload guard the adapters consult: memory pressure, waiting it out, readiness."""

from __future__ import annotations

import gc
import itertools
import time
from functools import partial

import pytest
import trio
import trio.testing

from mop.overload.guard import OverloadGuard
from mop.overload.memory import (
    can_trim_malloc,
    open_guard,
    process_rss,
    release_memory,
    serve_memory_watch,
)
from mop.overload.watermark import Watermarks
from mop.settings import LimitsSettings


def guard_with_marks(high: int = 1000, low: int = 800) -> OverloadGuard:
    return OverloadGuard(watermarks=Watermarks(high, low))


async def test_without_limits_nothing_is_held_back() -> None:
    guard = OverloadGuard()
    assert guard.client_rates("c") is None
    assert not guard.watches_memory
    guard.observe_memory(10**12)
    assert not guard.memory_high
    assert guard.not_ready() == []
    with trio.fail_after(1):
        await guard.wait_memory("client")
    assert guard.stats.memory_pauses == 0


async def test_client_rates_follow_the_settings() -> None:
    guard = OverloadGuard(LimitsSettings(client_message_rate=5.0))
    rates = guard.client_rates("c")
    assert rates is not None
    assert rates.charge(10, 10**9, trio.current_time()) > 0.9  # bytes are not limited


async def test_a_client_that_connects_again_carries_on_with_its_budgets() -> None:
    guard = OverloadGuard(LimitsSettings(client_message_rate=5.0))
    rates = guard.client_rates("mqtt c")
    assert rates is not None
    assert rates.charge(10, 0, trio.current_time()) > 0.9
    guard.client_left("mqtt c", rates)
    assert guard.client_rates("mqtt c") is rates
    other = guard.client_rates("mqtt other")
    assert other is not None and other.charge(5, 0, trio.current_time()) == 0.0


async def test_publishers_wait_until_memory_is_below_the_low_mark() -> None:
    guard = guard_with_marks()
    guard.observe_memory(1500)
    assert guard.memory_high
    [problem] = guard.not_ready()
    assert "high-water mark" in problem and "limits.memory_high_watermark" in problem
    resumed: list[str] = []

    async def publisher(name: str) -> None:
        await guard.wait_memory(name)
        resumed.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publisher, "a")
        nursery.start_soon(publisher, "b")
        await trio.testing.wait_all_tasks_blocked()
        guard.observe_memory(900)  # between the marks: still over
        await trio.testing.wait_all_tasks_blocked()
        assert resumed == []
        guard.observe_memory(700)
    assert sorted(resumed) == ["a", "b"]
    assert guard.not_ready() == []
    assert guard.stats.memory_pauses == 2
    assert guard.stats.memory_high_events == 1
    assert guard.stats.memory_used == 700


async def test_going_over_again_holds_publishers_again() -> None:
    guard = guard_with_marks()
    for used in (2000, 10, 2000):
        guard.observe_memory(used)
    assert guard.memory_high
    with trio.move_on_after(0.05) as waited:
        await guard.wait_memory("again")
    assert waited.cancelled_caught
    assert guard.stats.memory_high_events == 2


async def test_counters_of_refusals_and_pauses() -> None:
    guard = OverloadGuard()
    guard.refused_connection("mqtt (tcp)")
    guard.refused_busy("127.0.0.1:5555")
    guard.refused_publishes("c", 3)
    await guard.throttle(0.01, "c")
    stats = guard.stats
    assert (stats.connections_refused_rate, stats.connections_refused_busy) == (1, 1)
    assert stats.publishes_refused == 3
    assert stats.throttled_reads == 1 and stats.throttled_seconds == 0.01


async def _no_release() -> None:
    pass


async def test_the_memory_watch_samples_into_the_guard() -> None:
    guard = guard_with_marks(high=100, low=50)
    samples = [10, 200, 200, 200, 20]
    seen: list[bool] = []  # whether the node was over the mark before each sample
    done = trio.Event()

    def read_used() -> int:
        seen.append(guard.memory_high)
        if len(seen) > len(samples):
            done.set()
            return samples[-1]
        return samples[len(seen) - 1]

    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(serve_memory_watch, guard, 0.01, read_used=read_used, release=_no_release)
        )
        assert seen == [False]  # the first sample is in before it reports started
        with trio.fail_after(5):
            await done.wait()
        nursery.cancel_scope.cancel()
    # A sample of 200 that would put the node over its mark is taken again after a release
    # (200 again: over); so is the next, which would keep it over (20: below the marks).
    assert seen == [False, False, False, True, True, False]
    assert guard.stats.memory_high_events == 1
    assert guard.stats.memory_releases == 2 and guard.stats.memory_released == 180


async def test_memory_given_back_before_a_sample_keeps_the_node_below_its_mark() -> None:
    """A sample over the high mark of memory the process could give back (freed, not yet
    returned to the system) does not put the node over its mark."""
    guard = guard_with_marks(high=100, low=50)
    memory = [80]
    releases: list[float] = []
    released = trio.Event()

    def read_used() -> int:
        if releases:
            released.set()
        return memory[0]

    async def release() -> None:
        releases.append(trio.current_time())
        memory[0] = 40

    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(serve_memory_watch, guard, 0.01, read_used=read_used, release=release)
        )
        memory[0] = 150  # freed memory the allocator kept
        with trio.fail_after(5):
            await released.wait()
        nursery.cancel_scope.cancel()
    assert not guard.memory_high and guard.stats.memory_high_events == 0
    assert len(releases) == 1
    assert guard.stats.memory_releases == 1 and guard.stats.memory_released == 110


async def test_a_costly_release_runs_within_its_share_of_the_time() -> None:
    """A release that takes 10 ms runs at most every 200 ms (5% of the time), however often
    the memory is sampled while it presses."""
    guard = guard_with_marks(high=100, low=50)
    releases: list[float] = []

    async def slow_release() -> None:
        releases.append(trio.current_time())
        time.sleep(0.01)  # noqa: ASYNC251 (a garbage collection holds the thread so)

    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(serve_memory_watch, guard, 0.005, read_used=lambda: 500, release=slow_release)
        )
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    assert guard.memory_high
    assert 2 <= len(releases) <= 5, releases
    assert all(b - a >= 0.2 for a, b in itertools.pairwise(releases))


def test_releasing_memory_gives_freed_memory_back_to_the_system() -> None:
    """A real spike of message-like objects (payloads of 100 B to 64 KiB), freed while
    something allocated after them lives on (as in any server): the RSS stays up, a garbage
    collection does not change that, and `release_memory` takes it most of the way back."""
    if not can_trim_malloc():
        pytest.skip("no malloc_trim in this C library")
    trio.run(release_memory)
    before = process_rss()
    sizes = (100, 300, 1000, 4000, 16000, 64000)
    spike = [(f"t/{i}", bytes([i % 251]) * sizes[i % len(sizes)]) for i in range(20_000)]
    later = bytes([1]) * 1024  # on top of malloc's heap, where it stops it shrinking
    grown = process_rss() - before
    assert grown > 200 << 20
    del spike
    gc.collect()
    assert process_rss() - before > grown // 2
    trio.run(release_memory)
    assert process_rss() - before < grown // 4
    assert later


def test_the_guard_of_the_settings_reads_real_memory() -> None:
    assert process_rss() > 1 << 20
    assert not open_guard(LimitsSettings()).watches_memory
    guard = open_guard(LimitsSettings(memory_high_watermark=0.99))
    assert guard.watches_memory
