"""Sessions connected through a node that dies: the holder of the session-timer role hears no
more heartbeats from it and takes its sessions offline (wills, expiry). Nodes share tables
through `SharedTable`; a node dies when its registry stops (its heartbeats stop, its table
record stays, as a killed process leaves it); the clock is trio's mock clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from mop.processor import BackendError
from mop.protocols.mqtt.packets import Properties, Will
from mop.protocols.mqtt.serving.node_liveness import NODES_TABLE, NodeLiveness
from mop.protocols.mqtt.serving.session_registry import EXPIRY_GRACE, TABLE
from mop.protocols.mqtt.session import SessionState
from tests.unit.protocols.mqtt.serving.shared_table import SharedTable
from tests.unit.protocols.mqtt.serving.test_session_registry import HandedRole, Node

TIMEOUT = 10.0
Shared = dict[str, tuple[dict[str, bytes], list[SharedTable]]]


class Running:
    """Nodes whose registries run in the background, each stoppable on its own."""

    def __init__(self, nursery: trio.Nursery, shared: Shared) -> None:
        self._nursery = nursery
        self._shared = shared
        self._scopes: dict[int, trio.CancelScope] = {}

    async def start(self, *, holder: bool = False) -> Node:
        node = Node(self._shared)
        node.sessions._node_timeout = TIMEOUT
        node.role = HandedRole(held=holder)
        scope = trio.CancelScope()

        async def run(task_status: trio.TaskStatus[None]) -> None:
            with scope:
                async with trio.open_nursery() as inner:
                    await inner.start(node.timers.serve)
                    await inner.start(node.sessions.serve)
                    task_status.started()

        await self._nursery.start(run)
        self._scopes[id(node)] = scope
        return node

    def kill(self, node: Node) -> None:
        """Stop the node without a goodbye: its heartbeat record stays."""
        cut_off(node)
        self.stop(node)

    def stop(self, node: Node) -> None:
        self._scopes[id(node)].cancel()


def cut_off(node: Node) -> Callable[[], None]:
    """Make the node's writes (heartbeats, sessions) fail; returns what undoes it."""
    liveness = node.sessions._liveness
    assert isinstance(liveness, NodeLiveness)
    tables = [liveness._table, node.sessions._table]
    puts = [table.put for table in tables]

    async def failing(key: str, value: bytes | None) -> None:
        await trio.lowlevel.checkpoint()
        raise BackendError("cut off")

    for table in tables:
        table.put = failing  # type: ignore[method-assign]

    def undo() -> None:
        for table, put in zip(tables, puts, strict=True):
            table.put = put  # type: ignore[method-assign]

    return undo


@asynccontextmanager
async def deployment() -> AsyncIterator[Running]:
    async with trio.open_nursery() as nursery:
        yield Running(nursery, {})
        nursery.cancel_scope.cancel()


def will(delay: int) -> Will:
    return Will("w", b"will", 1, False, properties=Properties(will_delay_interval=delay))


async def connect(node: Node, client_id: str, *, expiry: int, will_delay: int | None) -> None:
    """A client connected through `node`, as the MQTT handler records it."""
    state, _ = await node.sessions.take(client_id, clean_start=expiry == 0)
    state.expiry_interval = expiry
    state.will = None if will_delay is None else will(will_delay)
    await node.sessions.attach(state)


async def test_a_dead_nodes_clean_session_ends_and_its_will_goes_out(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with deployment() as running:
        holder = await running.start(holder=True)
        proxy = await running.start()
        await connect(proxy, "c", expiry=0, will_delay=0)
        assert holder.table(TABLE).get("c") is not None  # recorded while connected
        await trio.sleep(30)
        assert holder.wills == []  # alive: its heartbeats keep coming
        running.kill(proxy)
        await trio.sleep(TIMEOUT - 0.5)
        assert holder.wills == []
        await trio.sleep(3)
        assert holder.wills == [b"will"]
        assert holder.table(TABLE).get("c") is None
        assert holder.table(NODES_TABLE).get(proxy.sessions.node_id) is None  # forgotten


async def test_a_dead_nodes_persistent_session_waits_its_delay_and_expiry(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with deployment() as running:
        holder = await running.start(holder=True)
        proxy = await running.start()
        await connect(proxy, "p", expiry=60, will_delay=20)
        running.kill(proxy)
        # Taken for dead at the first look after the timeout (looks come every TIMEOUT / 5).
        await trio.sleep(TIMEOUT + 3)
        assert len(holder.sessions) == 1 and holder.wills == []
        await trio.sleep(18)
        assert holder.wills == []
        await trio.sleep(2)
        assert holder.wills == [b"will"]
        assert holder.deleted == []
        await trio.sleep(40 + EXPIRY_GRACE)
        assert holder.deleted == ["p"]  # expired: 60 s after the node was taken for dead


async def test_a_client_back_through_another_node_keeps_its_session(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with deployment() as running:
        holder = await running.start(holder=True)
        proxy = await running.start()
        await connect(proxy, "p", expiry=60, will_delay=30)
        running.kill(proxy)
        await trio.sleep(TIMEOUT + 3)
        assert len(holder.sessions) == 1  # offline now
        other = await running.start()
        state, present = await other.sessions.take("p", clean_start=False)
        assert present
        await other.sessions.attach(state)
        await trio.sleep(100)
        assert (holder.wills, holder.deleted) == ([], [])
        assert SessionState.from_bytes(holder.table(TABLE).get("p") or b"").node == (
            other.sessions.node_id
        )


async def test_a_node_that_stops_cleanly_ends_its_sessions_itself(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with deployment() as running:
        holder = await running.start(holder=True)
        proxy = await running.start()
        await connect(proxy, "c", expiry=0, will_delay=None)
        state, _ = await proxy.sessions.take("d", clean_start=True)
        state.will = will(0)
        await proxy.sessions.attach(state)
        await proxy.sessions.release(state, will=state.will)  # its connection ended
        assert proxy.wills == [b"will"]
        running.stop(proxy)  # the heartbeat record goes
        await trio.sleep(0.1)
        assert holder.table(NODES_TABLE).get(proxy.sessions.node_id) is None
        await trio.sleep(3 * TIMEOUT)
        assert holder.wills == []  # the will went out once, where the connection ended


async def test_a_node_taken_for_dead_records_its_sessions_again(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with deployment() as running:
        holder = await running.start(holder=True)
        proxy = await running.start()
        await connect(proxy, "p", expiry=600, will_delay=60)
        # The proxy's heartbeats stop reaching the brokers (its writes fail) for a while.
        reconnect = cut_off(proxy)
        await trio.sleep(TIMEOUT + 3)
        assert len(holder.sessions) == 1  # taken offline
        reconnect()
        await trio.sleep(3)  # its record was deleted: it records its session again
        assert len(holder.sessions) == 0
        await trio.sleep(100)
        assert holder.wills == []


async def test_a_new_holder_gives_every_node_a_whole_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with deployment() as running:
        first = await running.start(holder=True)
        proxy = await running.start()
        second = await running.start()
        await connect(proxy, "c", expiry=0, will_delay=0)
        running.kill(proxy)
        await trio.sleep(TIMEOUT / 2)
        first.role.grant(False)
        second.role.grant(True)
        await trio.sleep(TIMEOUT - 1)
        assert second.wills == []
        await trio.sleep(3 + EXPIRY_GRACE)  # the will of a clean session goes with its end
        assert (first.wills, second.wills) == ([], [b"will"])
