"""`LocalLease`: taking a client id over fences the holder, waits (boundedly) for its release,
and calls a fencing callback once, never after a release."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from mop.backends.local import LocalBackend, open_local_backend
from mop.broker.storage import MemoryStorage
from mop.processor.backend import Backend


async def test_lease_fencing_waits_for_release(backend: Backend) -> None:
    first = await backend.open_client("dev")
    assert first.client_id == "dev"
    second_lease = []
    async with trio.open_nursery() as nursery:

        async def take_over() -> None:
            second_lease.append(await backend.open_client("dev"))

        nursery.start_soon(take_over)
        with trio.fail_after(1):
            await first.wait_fenced()
        await trio.testing.wait_all_tasks_blocked()
        assert second_lease == []  # still waiting for the first to let go
        await first.release()
    second = second_lease[0]
    with trio.move_on_after(0.01) as scope:
        await second.wait_fenced()
    assert scope.cancelled_caught  # the new holder is not fenced
    await second.release()
    third = await backend.open_client("dev")  # nobody holds it: no wait
    await third.release()


async def test_lease_takeover_is_bounded(
    storage: MemoryStorage, autojump_clock: trio.abc.Clock
) -> None:
    async with open_local_backend(storage, fence_timeout=3.0) as backend:
        stuck = await backend.open_client("dev")
        start = trio.current_time()
        second = await backend.open_client("dev")
        assert trio.current_time() - start == pytest.approx(3.0)
        with trio.fail_after(1):
            await stuck.wait_fenced()
        await stuck.release()  # late release must not drop the new holder
        third_started = trio.current_time()
        await backend.open_client("dev")
        assert trio.current_time() - third_started == pytest.approx(3.0)
        await second.release()


async def test_fencing_calls_back_once(backend: LocalBackend) -> None:
    calls: list[str] = []
    first = await backend.open_client("dev")
    assert backend.capabilities.fence_callbacks
    first.on_fenced(lambda: calls.append("first"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backend.open_client, "dev")
        await trio.testing.wait_all_tasks_blocked()
        assert calls == ["first"]
        await first.release()
    # A lease fenced already calls back at once.
    first.on_fenced(lambda: calls.append("late"))
    assert calls == ["first", "late"]


async def test_a_released_lease_never_calls_back(backend: LocalBackend) -> None:
    calls: list[str] = []
    lease = await backend.open_client("dev")
    assert backend.capabilities.fence_callbacks
    lease.on_fenced(lambda: calls.append("fenced"))
    await lease.release()
    await backend.open_client("dev")
    assert calls == []
