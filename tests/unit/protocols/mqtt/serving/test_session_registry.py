"""Who runs the timers of offline sessions: the holder of the session-timer role, for sessions
released on any node. Two registries share one table (as proxies share a compacted topic, each
told of the other's writes) and each holds a role the test hands around; the clock is trio's
mock clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from mop.message import MessageId
from mop.messaging import BackendError
from mop.protocols.mqtt.packets import Properties, Will
from mop.protocols.mqtt.serving.session_registry import (
    EXPIRY_GRACE,
    FLOWS_TABLE,
    ROLE,
    TABLE,
    SessionRegistry,
)
from mop.protocols.mqtt.serving.timers import Timers
from mop.protocols.mqtt.session import Outbound, SessionState, outbound_to_bytes
from tests.unit.protocols.mqtt.serving.shared_table import SharedTable


def mock_wall_clock() -> int:
    """Milliseconds since the epoch, as trio's mock clock moves them."""
    return EPOCH_MS + int(trio.current_time() * 1000)


EPOCH_MS = 1_800_000_000_000


class HandedRole:
    """A role the test gives and takes away."""

    def __init__(self, *, held: bool = False, permanent: bool = False) -> None:
        self.name = ROLE
        self.permanent = permanent
        self._held = held
        self._granted = held
        self._reported = False
        self._change = trio.Event()

    @property
    def held(self) -> bool:
        return self._held

    def grant(self, granted: bool) -> None:
        """Gain or lose the role (`held` follows; `changed` reports it)."""
        self._held = self._granted = granted
        self._change.set()
        self._change = trio.Event()

    def doubt(self, held: bool) -> None:
        """Change `held` alone, as a broken connection does before the loss is reported."""
        self._held = held

    async def changed(self) -> bool:
        while self._reported == self._granted:
            await self._change.wait()
        self._reported = self._granted
        return self._reported

    async def release(self) -> None:
        self.grant(False)


class Node:
    """What a registry needs of the processor, with wills and deleted subscriptions noted."""

    def __init__(self, shared: dict[str, tuple[dict[str, bytes], list[SharedTable]]]) -> None:
        self._shared = shared
        self.role = HandedRole()
        self.wills: list[bytes] = []
        self.deleted: list[str] = []
        # Subscriptions a consumer is still attached to: deleting them is refused.
        self.busy: set[str] = set()
        # How long deleting a subscription takes (a round trip to a broker, say).
        self.delete_time = 0.0
        self.timers = Timers()
        self.sessions = SessionRegistry(
            self,  # type: ignore[arg-type]
            self.timers,
            self._publish_will,
            wall_clock=mock_wall_clock,
        )

    def table(self, name: str) -> SharedTable:
        data, views = self._shared.setdefault(name, ({}, []))
        return SharedTable(name, data, views)

    async def hold_role(self, name: str) -> HandedRole:
        assert name == ROLE
        await trio.lowlevel.checkpoint()
        return self.role

    async def delete_subscription(self, name: str, member: str = "") -> None:
        await trio.sleep(self.delete_time)
        if name in self.busy:
            raise BackendError(f"{name!r} has a consumer attached", reason="consumer_busy")
        self.deleted.append(name)

    async def _publish_will(self, client_id: str, will: Will) -> None:
        await trio.lowlevel.checkpoint()
        self.wills.append(will.payload)


@asynccontextmanager
async def two_nodes(*, permanent: bool = False) -> AsyncIterator[tuple[Node, Node]]:
    shared: dict[str, tuple[dict[str, bytes], list[SharedTable]]] = {}
    a, b = Node(shared), Node(shared)
    a.role = HandedRole(held=True, permanent=permanent)
    async with trio.open_nursery() as nursery:
        for node in (a, b):
            await nursery.start(node.timers.serve)
            await nursery.start(node.sessions.serve)
        yield a, b
        nursery.cancel_scope.cancel()


def will(delay: int) -> Will:
    return Will("w", b"will", 1, False, properties=Properties(will_delay_interval=delay))


async def offline(node: Node, client_id: str, *, delay: int, expiry: int = 60) -> None:
    """A session whose connection ended on `node`, with a will and an expiry."""
    state, _ = await node.sessions.take(client_id, clean_start=False)
    state.expiry_interval = expiry
    await node.sessions.save(state)
    await node.sessions.release(state, will=will(delay))


async def test_the_holder_runs_the_timers_of_a_session_released_elsewhere(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, other):
        await offline(other, "c", delay=5)
        assert (len(holder.sessions), len(other.sessions)) == (1, 0)
        await trio.sleep(4.9)
        assert holder.wills == []
        await trio.sleep(0.2)
        assert (holder.wills, other.wills) == ([b"will"], [])


async def test_a_will_without_delay_goes_out_where_the_connection_ended_only(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, other):
        await offline(other, "c", delay=0)
        assert other.wills == [b"will"]
        await trio.sleep(100)
        assert holder.wills == []
        assert other.wills == [b"will"]


async def test_taking_the_session_on_another_node_cancels_the_holders_timers(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, other):
        await offline(holder, "c", delay=5, expiry=10)
        state, present = await other.sessions.take("c", clean_start=False)
        assert present and state.disconnected_at is not None  # as stored, for put_back
        assert len(holder.sessions) == 0
        await trio.sleep(20)
        assert (holder.wills, other.wills, holder.deleted) == ([], [], [])


async def test_a_session_put_back_on_another_node_is_offline_again_for_the_holder(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, other):
        await offline(holder, "c", delay=5)
        state, _ = await other.sessions.take("c", clean_start=False)
        state.will = will(5)  # the new connection's, which the node keeps as merged mode does
        other.sessions.put_back(state)
        await trio.sleep(0.1)
        assert len(holder.sessions) == 1
        await trio.sleep(6)
        assert holder.wills == [b"will"]


async def test_the_role_moves_with_its_sessions_and_the_will_goes_out_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (first, second):
        await offline(first, "c", delay=5)
        await trio.sleep(1)
        first.role.grant(False)
        second.role.grant(True)
        await trio.sleep(0.1)
        assert (len(first.sessions), len(second.sessions)) == (0, 1)
        await trio.sleep(10)
        assert (first.wills, second.wills) == ([], [b"will"])


async def test_the_holder_follows_offline_and_deleted_sessions_written_elsewhere(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, other):
        await offline(other, "c", delay=50, expiry=5)
        assert len(holder.sessions) == 1
        await other.sessions.take("c", clean_start=True)
        assert len(holder.sessions) == 0
        await trio.sleep(60)
        assert holder.wills == [] and holder.deleted == []


async def test_a_timer_due_while_the_role_is_in_doubt_waits_for_it(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, _):
        await offline(holder, "c", delay=5)
        holder.role.doubt(False)
        await trio.sleep(10)
        assert holder.wills == []
        holder.role.doubt(True)
        await trio.sleep(1.5)
        assert holder.wills == [b"will"]


async def test_an_expired_session_ends_on_the_holder(autojump_clock: trio.abc.Clock) -> None:
    async with two_nodes() as (holder, other):
        await offline(other, "c", delay=50, expiry=5)
        await trio.sleep(5 + EXPIRY_GRACE + 0.5)
        # The will waited for the end of the session (its delay is longer).
        assert (holder.wills, holder.deleted, other.deleted) == ([b"will"], ["c"], [])
        assert holder.table(TABLE).get("c") is None


async def test_sessions_recorded_as_connected_are_resumed_only_by_a_permanent_holder(
    autojump_clock: trio.abc.Clock,
) -> None:
    for permanent, expected in ((False, 0), (True, 1)):
        shared: dict[str, tuple[dict[str, bytes], list[SharedTable]]] = {}
        writer = Node(shared)
        connected = SessionState(client_id="c", expiry_interval=5)
        await writer.table(TABLE).put("c", connected.to_bytes())
        starting = Node(shared)
        starting.role = HandedRole(held=True, permanent=permanent)
        async with trio.open_nursery() as nursery:
            await nursery.start(starting.timers.serve)
            await nursery.start(starting.sessions.serve)
            assert len(starting.sessions) == expected
            nursery.cancel_scope.cancel()


async def test_the_holder_resumes_a_session_with_what_the_table_has_now(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, other):
        await offline(other, "c", delay=50)
        # A QoS 2 step that the holder's copy (adopted with the session) has not seen.
        flow = Outbound(7, 2, "persistent://public/default/t", MessageId(1, 2), released=True)
        await other.table(FLOWS_TABLE).put("c/7", outbound_to_bytes(flow))
        state, present = await holder.sessions.take("c", clean_start=False)
        assert present and state.outbound[7].released


# -- the deadline decides, not a timer racing a CONNECT ------------------------------------


async def test_a_take_while_the_timer_ends_the_session_waits_and_starts_anew(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes(permanent=True) as (node, _):
        node.delete_time = 1.0
        await offline(node, "c", delay=50, expiry=5)
        await trio.sleep(5.1)  # the expiry timer has fired and is deleting the subscription
        assert node.deleted == []
        state, present = await node.sessions.take("c", clean_start=False)
        assert not present and state.subscriptions == {}
        assert (node.deleted, node.wills) == (["c"], [b"will"])  # ended once, by the timer
        assert node.table(TABLE).get("c") is None


async def test_a_session_that_expired_while_the_node_was_down_is_gone_at_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    for wait in (0.0, 0.1):  # a CONNECT before the timer runs, and while it ends the session
        shared: dict[str, tuple[dict[str, bytes], list[SharedTable]]] = {}
        writer = Node(shared)
        down_since = mock_wall_clock() - 3000
        stored = SessionState("c", expiry_interval=2, will=will(50), disconnected_at=down_since)
        await writer.table(TABLE).put("c", stored.to_bytes())
        restarted = Node(shared)
        restarted.delete_time = 1.0
        restarted.role = HandedRole(held=True, permanent=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(restarted.timers.serve)
            await nursery.start(restarted.sessions.serve)
            await trio.sleep(wait)
            _, present = await restarted.sessions.take("c", clean_start=False)
            assert not present, f"session present {wait} s after the restart"
            await trio.sleep(10)
            assert (restarted.deleted, restarted.wills) == (["c"], [b"will"])
            nursery.cancel_scope.cancel()


async def test_a_session_past_its_deadline_ends_on_the_node_it_is_taken_on(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, other):
        await offline(other, "c", delay=50, expiry=5)
        await trio.sleep(5.2)  # past the deadline, before the holder's timer
        _, present = await other.sessions.take("c", clean_start=False)
        assert not present
        assert (other.deleted, other.wills) == (["c"], [b"will"])
        await trio.sleep(10)
        assert (holder.deleted, holder.wills) == ([], [])
        assert len(holder.sessions) == 0


async def test_a_take_just_before_the_deadline_is_heard_by_the_holder_in_time(
    autojump_clock: trio.abc.Clock,
) -> None:
    async with two_nodes() as (holder, other), trio.open_nursery() as nursery:
        lag = 0.5  # the holder hears of the take after the deadline, within the grace
        assert lag < EXPIRY_GRACE
        holder.sessions._table.lag(nursery, lag)  # type: ignore[attr-defined]
        await offline(other, "c", delay=50, expiry=5)
        await trio.sleep(5 - lag / 2)
        _, present = await other.sessions.take("c", clean_start=False)
        assert present
        await trio.sleep(10)
        assert (holder.deleted, holder.wills) == ([], [])
        assert other.table(TABLE).get("c") is not None
        nursery.cancel_scope.cancel()


async def test_a_subscription_still_attached_does_not_refuse_a_clean_start(
    autojump_clock: trio.abc.Clock,
) -> None:
    """A connection that could not leave its subscription when it closed left a consumer
    attached: a clean start of its client id still ends the session (not refused with an
    error, its stored state deleted all the same)."""
    async with two_nodes() as (holder, _):
        await offline(holder, "c", delay=50)
        holder.busy.add("c")
        _, present = await holder.sessions.take("c", clean_start=True)
        assert not present
        holder.busy.clear()
        _, present = await holder.sessions.take("c", clean_start=False)
        assert not present
