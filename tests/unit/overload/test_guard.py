"""The overload guard the adapters consult: memory pressure, waiting it out, readiness."""

from __future__ import annotations

from functools import partial

import trio
import trio.testing

from mop.overload.guard import OverloadGuard
from mop.overload.memory import open_guard, process_rss, serve_memory_watch
from mop.overload.watermark import Watermarks
from mop.settings import LimitsSettings


def guard_with_marks(high: int = 1000, low: int = 800) -> OverloadGuard:
    return OverloadGuard(watermarks=Watermarks(high, low))


async def test_without_limits_nothing_is_held_back() -> None:
    guard = OverloadGuard()
    assert guard.client_rates() is None
    assert not guard.watches_memory
    guard.observe_memory(10**12)
    assert not guard.memory_high
    assert guard.not_ready() == []
    with trio.fail_after(1):
        await guard.wait_memory("client")
    assert guard.stats.memory_pauses == 0


async def test_client_rates_follow_the_settings() -> None:
    guard = OverloadGuard(LimitsSettings(client_message_rate=5.0))
    rates = guard.client_rates()
    assert rates is not None
    assert rates.charge(10, 10**9, trio.current_time()) > 0.9  # bytes are not limited


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


async def test_the_memory_watch_samples_into_the_guard() -> None:
    guard = guard_with_marks(high=100, low=50)
    samples = [10, 200, 200, 20]
    seen: list[bool] = []  # whether the node was over the mark before each sample
    done = trio.Event()

    def read_used() -> int:
        seen.append(guard.memory_high)
        if len(seen) > len(samples):
            done.set()
            return samples[-1]
        return samples[len(seen) - 1]

    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_memory_watch, guard, 0.01, read_used=read_used))
        assert seen == [False]  # the first sample is in before it reports started
        with trio.fail_after(5):
            await done.wait()
        nursery.cancel_scope.cancel()
    assert seen == [False, False, True, True, False]
    assert guard.stats.memory_high_events == 1


def test_the_guard_of_the_settings_reads_real_memory() -> None:
    assert process_rss() > 1 << 20
    assert not open_guard(LimitsSettings()).watches_memory
    guard = open_guard(LimitsSettings(memory_high_watermark=0.99))
    assert guard.watches_memory
