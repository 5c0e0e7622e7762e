"""`ConnectionTasks`: a connection's helper tasks run beside it in its parent nursery, keep a
nursery's rules (`aclose` cancels them and waits for them), and a failing one ends only its own
connection, never the shared nursery."""

from __future__ import annotations

import trio
import trio.testing

from mop.transport import ConnectionTasks, OutboundBuffer


async def test_tasks_run_beside_the_connection_and_end_with_aclose() -> None:
    events: list[str] = []

    async def forever() -> None:
        try:
            await trio.sleep_forever()
        finally:
            events.append("ended")

    async def connection(nursery: trio.Nursery) -> None:
        tasks = ConnectionTasks(trio.CancelScope())
        tasks.start_soon(forever)
        tasks.start_soon(forever)
        await trio.testing.wait_all_tasks_blocked()
        # Beside the connection's own task, in the nursery it runs in.
        assert len(nursery.child_tasks) == 3
        await tasks.aclose()
        assert events == ["ended", "ended"]
        assert tasks.error is None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection, nursery)


async def test_aclose_without_tasks_returns_at_once() -> None:
    async with trio.open_nursery() as nursery:

        async def connection() -> None:
            tasks = ConnectionTasks(trio.CancelScope())
            with trio.fail_after(1):
                await tasks.aclose()

        nursery.start_soon(connection)


async def test_a_failing_task_ends_its_connection_only() -> None:
    other_connection_done = trio.Event()
    cancelled_sibling = trio.Event()

    async def fails() -> None:
        await trio.lowlevel.checkpoint()
        raise trio.BrokenResourceError("the peer went away")

    async def sibling() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled_sibling.set()
            raise

    async def connection() -> None:
        reads = trio.CancelScope()
        tasks = ConnectionTasks(reads)
        tasks.start_soon(sibling)
        tasks.start_soon(fails)
        with reads:  # the connection's reads, which the failure cancels
            await trio.sleep_forever()
        await tasks.aclose()
        assert isinstance(tasks.error, trio.BrokenResourceError)
        assert cancelled_sibling.is_set()
        # A task started once one failed does not run.
        ran: list[bool] = []

        async def late() -> None:
            await trio.lowlevel.checkpoint()
            ran.append(True)

        tasks.start_soon(late)
        await tasks.aclose()
        assert ran == []

    async def other_connection() -> None:
        await trio.sleep(0.05)
        other_connection_done.set()

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection)
            nursery.start_soon(other_connection)
    assert other_connection_done.is_set()


async def test_cancelling_a_tasks_own_scope_ends_that_task_only() -> None:
    async def connection() -> None:
        tasks = ConnectionTasks(trio.CancelScope())
        scope = trio.CancelScope()
        ended = trio.Event()
        kept = trio.Event()

        async def wait(done: trio.Event) -> None:
            try:
                await trio.sleep_forever()
            finally:
                done.set()

        tasks.start_soon(lambda: wait(ended), scope)
        tasks.start_soon(lambda: wait(kept))
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
        await ended.wait()
        assert not kept.is_set() and tasks.error is None
        await tasks.aclose()
        assert kept.is_set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection)


async def test_an_outbound_buffer_writes_from_connection_tasks() -> None:
    sending, receiving = trio.testing.memory_stream_pair()

    async def connection() -> None:
        tasks = ConnectionTasks(trio.CancelScope())
        out = OutboundBuffer(sending)
        out.write_from(tasks)
        out.write(b"hello")
        with trio.fail_after(5):
            assert await receiving.receive_some(5) == b"hello"
        await tasks.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection)


async def test_a_task_started_once_the_tasks_are_closing_starts_cancelled() -> None:
    """As in a nursery whose scope is cancelled: nothing started late outlives its connection
    in the shared nursery."""
    ran_to_the_end: list[str] = []

    async def late() -> None:
        await trio.sleep(10)
        ran_to_the_end.append("late")

    async def connection(nursery: trio.Nursery) -> None:
        tasks = ConnectionTasks(trio.CancelScope())
        await tasks.aclose()
        tasks.start_soon(late)
        with trio.fail_after(1):
            await tasks.aclose()  # the late one ends at once, cancelled
        assert len(nursery.child_tasks) == 1  # this connection's own task only

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection, nursery)
    assert ran_to_the_end == []


async def test_tasks_are_named_after_what_they_run() -> None:
    async def deliver() -> None:
        await trio.sleep_forever()

    async def connection(nursery: trio.Nursery) -> None:
        tasks = ConnectionTasks(trio.CancelScope())
        tasks.start_soon(deliver)
        await trio.testing.wait_all_tasks_blocked()
        names = {task.name for task in nursery.child_tasks}
        assert any(name.endswith("deliver") for name in names), names
        await tasks.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection, nursery)
