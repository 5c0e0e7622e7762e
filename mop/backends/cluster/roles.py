"""Cluster-wide roles in separated mode: one role topic per name,
`persistent://{tenant}/__mop/{namespace}%2Frole%2F{name}`, whose exclusive subscription "holder"
is held by the proxy that holds the role.

Every proxy that wants a role subscribes "holder" with subscription type Exclusive, and asks
again every `RETRY_INTERVAL` while another proxy has it (the broker answers ConsumerBusy). Why
this mechanism:
- the broker decides, one subscribe at a time: it admits one consumer on an exclusive
  subscription, so proxies that start together cannot both get the role;
- it frees the subscription as soon as the holder's connection closes (a proxy that stops or
  dies), and the next proxy to ask gets it: no lease to expire, no clock to trust;
- it is a standard subscription type, and the one client leases use too (`leases`).
A producer with access mode WaitForExclusive would hand the role on without the retries, but
the client gives up waiting after its operation timeout, and some Pulsar-protocol brokers
(pulsar-lite 0.2) admit every producer whatever its access mode, which would let every proxy
hold the role; an exclusive subscription is exclusive on each broker mop is run against.

The subscribes go through a Pulsar client of their own (`ClusterRoles`, from
`ClusterContext.new_client`, run in the backend's nursery), on a connection of their own: some
Pulsar-protocol brokers (pulsar-lite 0.2) answer a refused subscribe by closing the connection
it came on, which must not take the proxy's traffic down with it. That client is made when the
proxy first enters a role.

The holder's consumer does not come back by itself (`_HolderConsumer`): the client's consumers
subscribe again when their connection ends or the broker closes them, but this one closes
instead, and the role counts as lost at once. Meanwhile another proxy may have got the role, so
the proxy asks again with a new consumer, to start its duty afresh. Before a gain is reported,
the tables are read up to their end (`catch_up_tables`), so the new holder sees the last writes
of the previous one.

Windows in which two proxies may both act as holder:
- the broker frees the subscription when it sees the holder's connection close, the holder
  notices when its client does. A dead proxy acts no more; but when a connection breaks
  without either side being told at once (a silent network failure), the broker may hand the
  role on (after its keep-alive timeout) before the old holder's client gives up on the
  connection (after its own keep-alive timeout): both act meanwhile. `held` asks the consumer
  each time, which keeps the window as short as the client's view allows.
- a duty begun while held (a write and a publish, say) is finished even if the role is lost
  halfway through it.
The role's connection is not the one the duty's writes go through: a holder whose other
connection is down keeps the role, and what its duty writes fails (and is logged) meanwhile.
While the broker that owns the role topic is unreachable, nobody holds the role; a dead holder's
role passes on within `RETRY_INTERVAL` plus a subscribe and the tables' catch-up.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio

from mop.backends.cluster.errors import error_for
from mop.processor.backend import BackendError
from mop.protocols.pulsar.commands import SubType
from mop.protocols.pulsar.driver import (
    ClientConsumer,
    ConsumerConfig,
    DriverError,
    PulsarClient,
    Received,
)
from mop.protocols.pulsar.driver.connection import BrokerConnection
from mop.topic_names import system_topic

if TYPE_CHECKING:
    from mop.backends.cluster.context import ClusterContext
    from mop.processor.backend import Role

__all__ = ["HOLDER", "RETRY_INTERVAL", "ClusterRole", "ClusterRoles"]

log = logging.getLogger("mop.cluster")

HOLDER: Final = "holder"
# How often a proxy without the role asks for it: how long a dead holder's role may stay free.
RETRY_INTERVAL: Final = 0.5


class _HolderConsumer(ClientConsumer):
    """A consumer of the role's exclusive subscription that closes, and tells `down`, the
    first time it is detached (its connection ended, or the broker closed it) instead of
    subscribing again."""

    def __init__(self, client: PulsarClient, topic: str, down: Callable[[], None]) -> None:
        super().__init__(
            client,
            topic,
            HOLDER,
            # Nothing is ever published on a role topic.
            ConsumerConfig(sub_type=SubType.Exclusive, receiver_queue=1),
            _ignore,
            on_lost=lambda exc: down(),
        )
        self._down = down

    def on_closed_by_broker(self) -> None:
        super().on_closed_by_broker()
        self._give_up()

    def connection_lost(self, connection: BrokerConnection) -> None:
        if not self.connected:
            return  # a connection this consumer is not on
        super().connection_lost(connection)
        if not self.connected:
            self._give_up()

    def _give_up(self) -> None:
        if not self.closed:
            self.abort()
            self._down()


def _ignore(consumer: ClientConsumer, items: list[Received]) -> None:
    for item in items:
        consumer.ack(item.message_id)


class ClusterRoles:
    """The roles this proxy takes part in, and the client they ask with (made on first use)."""

    def __init__(self, context: ClusterContext, *, catch_up: Callable[[], Awaitable[None]]) -> None:
        """`catch_up` reads the tables up to their end (before a gain is reported)."""
        self._context = context
        self._catch_up = catch_up
        self._client: PulsarClient | None = None
        self._starting = trio.Lock()
        self._roles: set[ClusterRole] = set()
        self._closed = False

    async def client(self) -> PulsarClient:
        """The roles' client, made and run (in the backend's nursery) on first use."""
        async with self._starting:
            if self._closed:
                raise BackendError("backend is closed", reason="closed")
            if self._client is None:
                client = self._context.new_client()
                await self._context.nursery.start(client.serve)
                if self._closed:
                    await client.aclose()
                    raise BackendError("backend is closed", reason="closed")
                self._client = client
            return self._client

    async def hold(self, name: str) -> ClusterRole:
        """Enter this proxy for role `name`; it is asked for in the background."""
        role = ClusterRole(self._context, self, name, catch_up=self._catch_up)
        self._roles.add(role)
        self._context.nursery.start_soon(role.serve)
        await trio.lowlevel.checkpoint()
        return role

    def gone(self, role: ClusterRole) -> None:
        self._roles.discard(role)

    async def aclose(self) -> None:
        """Let go of every role at once and close the client."""
        self._closed = True
        for role in list(self._roles):
            role.abort()
        client, self._client = self._client, None
        if client is None:
            await trio.lowlevel.checkpoint()
            return
        await client.aclose()


class ClusterRole:
    """This proxy's part in one role: waiting for it, holding it, or released (see `Role`)."""

    permanent = False

    def __init__(
        self,
        context: ClusterContext,
        roles: ClusterRoles,
        name: str,
        *,
        catch_up: Callable[[], Awaitable[None]],
    ) -> None:
        self._context = context
        self._roles = roles
        self._catch_up = catch_up
        self._name = name
        self.topic = system_topic(context.tenant, context.namespace, "role", name)
        # The consumer of the exclusive subscription, while granted.
        self._consumer: ClientConsumer | None = None
        self._down = trio.Event()  # the consumer is detached: the role is lost
        self._granted = False
        self._reported = False  # what `changed` last returned
        self._change = trio.Event()
        self._released = False
        self._scope = trio.CancelScope()

    @property
    def name(self) -> str:
        return self._name

    @property
    def held(self) -> bool:
        consumer = self._consumer
        return self._granted and consumer is not None and consumer.connected and not consumer.closed

    async def changed(self) -> bool:
        if self._reported == self._granted:
            while self._reported == self._granted:
                await self._change.wait()
        else:
            await trio.lowlevel.checkpoint()
        self._reported = self._granted
        return self._reported

    def _set(self, granted: bool) -> None:
        if granted != self._granted:
            self._granted = granted
            self._change.set()
            self._change = trio.Event()

    # -- taking part -----------------------------------------------------------------------

    async def serve(self) -> None:
        """Ask for the role until it is granted, hold it while the connection lasts, ask
        again; until `release` (or the backend stops)."""
        with self._scope:
            while not self._released:
                started = trio.current_time()
                try:
                    await self._hold(await self._claim())
                except BackendError as exc:
                    if exc.reason == "closed":
                        return
                    if exc.reason != "consumer_busy":
                        log.warning("%s; asking again", exc)
                    # An attempt that waited (a timeout) has waited long enough already.
                    await trio.sleep(max(0.0, started + RETRY_INTERVAL - trio.current_time()))

    async def _claim(self) -> ClientConsumer:
        """The consumer of the exclusive subscription, if the broker admits it (BackendError
        with reason "consumer_busy": another proxy holds the role)."""
        client = await self._roles.client()
        down = self._down = trio.Event()
        consumer = _HolderConsumer(client, self.topic, down.set)
        try:
            # Shielded (the client's operation timeout bounds it): a subscribe cut short
            # might still be granted by the broker, to a consumer nobody would close.
            with trio.CancelScope(shield=True):
                await client.start(consumer.run)
        except DriverError as exc:
            if self._released:
                raise BackendError(f"role {self._name!r} released", reason="closed") from None
            raise error_for(exc, f"role {self._name!r}") from None
        if self._released:
            consumer.abort()
            raise BackendError(f"role {self._name!r} released", reason="closed")
        return consumer

    async def _hold(self, consumer: ClientConsumer) -> None:
        self._consumer = consumer
        down = self._down
        try:
            caught_up = False
            try:
                await self._catch_up()
                caught_up = True
            except* BackendError as group:
                log.debug("role %r: %s", self._name, group.exceptions)
            if not caught_up:
                raise BackendError(
                    f"role {self._name!r}: the tables could not be read", reason="unavailable"
                )
            if down.is_set():
                return
            log.info("role %r: held by this proxy", self._name)
            self._set(True)
            await down.wait()
            log.warning("role %r: lost with the connection to its broker", self._name)
        finally:
            self._set(False)
            if self._consumer is consumer:  # not closed by `abort` already
                self._consumer = None
                consumer.abort()

    # -- letting go ------------------------------------------------------------------------

    async def release(self) -> None:
        """Leave the role: closing the consumer frees the subscription for the next proxy."""
        self.abort()
        self._roles.gone(self)
        await trio.lowlevel.checkpoint()

    def abort(self) -> None:
        """Stop taking part now, without waiting (also when the proxy stops)."""
        self._released = True
        self._set(False)
        self._scope.cancel()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.abort()


if TYPE_CHECKING:

    def _conforms(role: ClusterRole) -> Role:
        return role
