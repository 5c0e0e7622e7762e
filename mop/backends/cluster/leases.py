"""Client ids across proxies: one lease topic per client id,
`persistent://{tenant}/__mop/{namespace}%2Fclient%2F{client id}`.

Taking an id: (1) a producer with access mode ExclusiveWithFencing fences any producer still
on the lease topic, (2) it sends a takeover message carrying this lease's random token, (3) the
lease subscribes to the topic's exclusive subscription "holder", which the previous holder
keeps until it lets go (the broker frees it at once when that proxy closes it or dies), and
(4) the session tables are caught up so the previous holder's last writes are visible. A holder
learns of a takeover from the messages its "holder" consumer receives: one with another token,
sent after its own, fences it; so does losing "holder" to another consumer (the holder's
consumer, subscribing again after its connection ended, is refused).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio

from mop.backends.cluster.errors import error_for
from mop.backends.cluster.tables import system_topic
from mop.message import MessageId
from mop.processor.backend import BackendError, ProducerFenced
from mop.protocols.pulsar.commands import InitialPosition, ProducerAccessMode, SubType
from mop.protocols.pulsar.driver import (
    ClientConsumer,
    ConsumerConfig,
    DriverError,
    ProducerConfig,
    Received,
    create_producer,
    subscribe,
)

if TYPE_CHECKING:
    from mop.backends.cluster.context import ClusterContext

__all__ = ["HOLDER", "ClusterLease"]

log = logging.getLogger("mop.cluster")

HOLDER: Final = "holder"
TAKEOVER: Final = "takeover"


class ClusterLease:
    """Ownership of one client id, fenced when another connection (on any proxy) takes it."""

    def __init__(
        self,
        context: ClusterContext,
        client_id: str,
        *,
        catch_up: Callable[[], Awaitable[None]],
        gone: Callable[[ClusterLease], None],
    ) -> None:
        """`catch_up` reads the tables up to their end (step 4); `gone` is told when the
        lease is released."""
        self._context = context
        self._catch_up = catch_up
        self._gone = gone
        self._client_id = client_id
        self.topic = system_topic(context.tenant, context.namespace, "client", client_id)
        self.token = uuid.uuid4().hex
        self._own: MessageId | None = None
        self._holder: ClientConsumer | None = None
        self._fenced = trio.Event()
        self._released = trio.Event()

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def fenced(self) -> bool:
        return self._fenced.is_set()

    @property
    def holding(self) -> bool:
        """Whether this lease has the topic's "holder" subscription."""
        return self._holder is not None

    async def wait_fenced(self) -> None:
        await self._fenced.wait()

    def fence(self) -> None:
        self._fenced.set()

    # -- taking the id ---------------------------------------------------------------------

    async def acquire(self, previous: ClusterLease | None) -> None:
        """Take the id over (see the module docstring); `previous` is this proxy's own
        current holder, if any, which is fenced directly."""
        try:
            self._own = await self._announce()
        except ProducerFenced:
            # Someone took the id over between our producer and our message: they win.
            self._fenced.set()
            return
        timeout = self._context.fence_timeout
        if previous is not None:
            previous.fence()
            with trio.move_on_after(timeout):
                await previous._released.wait()
        with trio.move_on_after(timeout):
            await self._hold()
        if self._holder is None and not self._fenced.is_set():
            log.warning(
                "client %r: its previous holder did not let go within %ss; taking over anyway",
                self._client_id,
                timeout,
            )
            self._context.nursery.start_soon(self._hold_later)
        await self._catch_up()

    async def _announce(self) -> MessageId:
        context = self._context
        what = f"taking client id {self._client_id!r}"
        config = ProducerConfig(
            access_mode=ProducerAccessMode.ExclusiveWithFencing,
            batching=False,
            send_timeout=context.operation_timeout,
        )
        try:
            producer = await create_producer(context.client(), self.topic, config)
        except DriverError as exc:
            raise error_for(exc, what) from None
        try:
            # Brokers keep the latest message per key of a system topic: the last takeover.
            ticket = await producer.send(self.token.encode(), (), key=TAKEOVER)
            assert ticket is not None
            return await ticket.wait()
        except DriverError as exc:
            raise error_for(exc, what) from None
        finally:
            producer.abort()  # its message is stored (or failed): nothing left to wait for

    async def _hold(self) -> None:
        """Subscribe "holder", retrying while the previous holder still has it."""
        context = self._context
        config = ConsumerConfig(
            sub_type=SubType.Exclusive,
            receiver_queue=10,
            initial_position=InitialPosition.Earliest,
        )
        delay = 0.02
        while self._holder is None and not self._released.is_set() and not self._fenced.is_set():
            try:
                # Shielded (the client's operation timeout bounds it): a subscribe cut short
                # might still be granted by the broker, to a consumer nobody would close.
                with trio.CancelScope(shield=True):
                    holder = await subscribe(
                        context.client(),
                        self.topic,
                        HOLDER,
                        self._on_messages,
                        config,
                        on_lost=self._on_lost,
                    )
            except DriverError as exc:
                error = error_for(exc, f"holding client id {self._client_id!r}")
                if error.reason not in ("consumer_busy", "unavailable"):
                    raise error from None
                await trio.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            if self._released.is_set():
                holder.abort()
                return
            self._holder = holder

    async def _hold_later(self) -> None:
        try:
            await self._hold()
        except BackendError as exc:
            log.warning("client %r: %s", self._client_id, exc)

    def _on_messages(self, consumer: ClientConsumer, items: list[Received]) -> None:
        """The "holder" consumer's sink: a takeover after this lease's own fences it."""
        token = self.token.encode()
        for item in items:
            consumer.ack(item.message_id)
            own = self._own
            newer = own is not None and item.message_id > own
            if newer and item.payload != token:
                self._fenced.set()

    def _on_lost(self, exc: DriverError) -> None:
        """The "holder" consumer could not subscribe again (another consumer has it: the id
        was taken over): this lease no longer learns of takeovers, so it counts as fenced."""
        if self._released.is_set():
            return
        log.warning("client %r: %s", self._client_id, error_for(exc, "holding the client id"))
        self._holder = None
        self._fenced.set()

    # -- letting go ------------------------------------------------------------------------

    async def release(self) -> None:
        if self._released.is_set():
            await trio.lowlevel.checkpoint()
            return
        self._released.set()
        self._gone(self)
        holder, self._holder = self._holder, None
        if holder is None:
            await trio.lowlevel.checkpoint()
            return
        with trio.CancelScope(shield=True), trio.move_on_after(self._context.fence_timeout):
            try:
                # Deleting the subscription leaves nothing behind per client id on the broker.
                await holder.unsubscribe()
            except DriverError as exc:
                log.debug("%s", error_for(exc, "releasing a client id"))
        holder.abort()  # if it is still open (the unsubscribe failed or took too long)

    def abort(self) -> None:
        """The backend stops: fence and let go without waiting."""
        self._fenced.set()
        self._released.set()
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.abort()
