"""Client ids across proxies: one lease topic per client id,
`persistent://{tenant}/__mop/{namespace}%2Fclient%2F{client id}`.

Taking an id: (1) a producer with access mode ExclusiveWithFencing fences any producer still
on the lease topic, (2) it sends a takeover message carrying this lease's random token, (3) the
lease subscribes to the topic's exclusive subscription "holder", which the previous holder
keeps until it lets go (the broker frees it at once when that proxy closes it or dies), and
(4) the session tables are caught up so the previous holder's last writes are visible. A holder
learns of a takeover from the messages its "holder" consumer receives: one with another token,
sent after its own, fences it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import _pulsar
import trio

from mop.backends.cluster.bridge import ignore_result
from mop.backends.cluster.producers import message_id_of
from mop.backends.cluster.tables import system_topic
from mop.message import MessageId
from mop.processor.backend import BackendError, ProducerFenced

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
        self._holder: Any = None
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
        bridge = context.bridge
        conf = _pulsar.ProducerConfiguration()
        conf.access_mode(_pulsar.ProducerAccessMode.ExclusiveWithFencing)
        conf.batching_enabled(False)
        conf.send_timeout_millis(int(context.operation_timeout * 1000))
        producer = await bridge.call(
            lambda done: context.client().create_producer_async(self.topic, conf, done),
            f"taking client id {self._client_id!r}",
            cleanup=lambda handle: handle.close_async(ignore_result),
        )
        try:
            builder = _pulsar.MessageBuilder()
            builder.content(self.token.encode())
            # Brokers keep the latest message per key of a system topic: the last takeover.
            builder.partition_key(TAKEOVER)
            pulsar_id = await bridge.call(
                lambda done: producer.send_async(builder.build(), done),
                f"taking client id {self._client_id!r}",
            )
        finally:
            producer.close_async(ignore_result)
        return message_id_of(pulsar_id)

    async def _hold(self) -> None:
        """Subscribe "holder", retrying while the previous holder still has it."""
        context = self._context
        conf = _pulsar.ConsumerConfiguration()
        conf.consumer_type(_pulsar.ConsumerType.Exclusive)
        conf.receiver_queue_size(10)
        conf.subscription_initial_position(_pulsar.InitialPosition.Earliest)
        conf.message_listener(
            lambda consumer, message: context.bridge.soon(self._on_message, consumer, message)
        )
        delay = 0.02
        while self._holder is None and not self._released.is_set() and not self._fenced.is_set():
            try:
                holder = await context.bridge.call(
                    lambda done: context.client().subscribe_async(self.topic, HOLDER, conf, done),
                    f"holding client id {self._client_id!r}",
                    cleanup=lambda handle: handle.close_async(ignore_result),
                )
            except BackendError as exc:
                if exc.reason not in ("consumer_busy", "unavailable"):
                    raise
                await trio.sleep(delay)
                delay = min(delay * 2, 0.25)
                continue
            if self._released.is_set():
                holder.close_async(ignore_result)
                return
            self._holder = holder

    async def _hold_later(self) -> None:
        try:
            await self._hold()
        except BackendError as exc:
            log.warning("client %r: %s", self._client_id, exc)

    def _on_message(self, consumer: Any, message: Any) -> None:
        consumer.acknowledge_async(message.message_id(), ignore_result)
        own = self._own
        newer = own is not None and message_id_of(message.message_id()) > own
        if newer and message.data() != self.token.encode():
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
        bridge = self._context.bridge
        with trio.CancelScope(shield=True), trio.move_on_after(self._context.fence_timeout):
            try:
                # Deleting the subscription leaves nothing behind per client id on the broker.
                await bridge.call(holder.unsubscribe_async, "releasing a client id")
            except BackendError as exc:
                log.debug("%s", exc)
                holder.close_async(ignore_result)

    def abort(self) -> None:
        """The backend stops: fence and let go without waiting."""
        self._fenced.set()
        self._released.set()
        holder, self._holder = self._holder, None
        if holder is not None:
            holder.close_async(ignore_result)
