"""Client ids across proxies: one presence table per namespace that every proxy follows, so a
connection costs the brokers one small write, not a topic, producer and subscription of its own.

The table (`PRESENCE_TABLE`, a compacted system topic read into memory by every proxy) holds,
under each client id, the claim of the connection that has it: `{proxy id} {nonce}`. Taking an
id is one write of a claim; the topic's order decides, and the later claim wins:

1. the claim is written, and waited for until this proxy's reader has read it back; the claim
   it replaced, in the topic's order, is the previous holder;
2. a proxy that reads a claim for an id one of its own connections holds (with an earlier
   claim) fences that connection;
3. the new holder waits until the previous one has let go (its release read back), or its
   proxy is dead, or `fence_timeout` passed: then the previous holder's last writes to the
   session tables are in, and (4) the tables are caught up so they are visible.

Letting go writes a release, `-{nonce}`, under the client id: it ends that claim only (a later
claim stays the holder, whatever the order the two arrive in), and it is what a new holder
waits for. A little later (`CLEAN_UP_DELAY`), when nothing claimed the id meanwhile, the releasing
proxy deletes the key (a tombstone), so the table keeps nothing per client id that left. Each
proxy writes a heartbeat under `\\x00proxy\\x00{proxy id}` every `HEARTBEAT` seconds, and deletes
it when it stops: a previous holder whose proxy has written none for `LIVENESS_TIMEOUT` (or
said goodbye) is not waited for, so the clients of a proxy that died come back at once
elsewhere.

Tombstones only compact the table: in memory a claim ends with its release. A tombstone that
crosses a new claim (the id taken again within the clean-up delay, by a proxy that had not yet
read the release) removes that claim from the compacted view only: a proxy that starts later
does not know that holder, and does not wait for its last writes if it takes the id over.
Claims of a proxy that died stay in the table until their ids connect again.
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

import trio

from mop.message import MessageId
from mop.processor.backend import BackendError

if TYPE_CHECKING:
    from mop.backends.cluster.context import ClusterContext
    from mop.backends.cluster.tables import ClusterTable

__all__ = [
    "CLEAN_UP_DELAY",
    "HEARTBEAT",
    "LIVENESS_TIMEOUT",
    "PRESENCE_TABLE",
    "ClusterLease",
    "Presence",
]

log = logging.getLogger("mop.cluster")

PRESENCE_TABLE: Final = "mop.client-ids"
RELEASE_MARK: Final = "-"
PROXY_PREFIX: Final = "\x00proxy\x00"
# Seconds between a proxy's heartbeats, and without one before its claims are not waited for.
HEARTBEAT: Final = 1.0
LIVENESS_TIMEOUT: Final = 5.0
# Seconds after a release before its key is deleted, unless the id was claimed meanwhile.
CLEAN_UP_DELAY: Final = 5.0
# Releases remembered (nonces) for claims that are waited for a little later.
_RELEASES_KEPT: Final = 10_000


class ClusterLease:
    """Ownership of one client id, fenced when another connection (on any proxy) takes it."""

    def __init__(self, presence: Presence, client_id: str, nonce: str) -> None:
        self._presence = presence
        self._client_id = client_id
        self.nonce = nonce
        self.applied = trio.Event()  # its claim has been read back
        self.previous: tuple[str, str] | None = None  # (proxy, nonce) its claim replaced
        self.holding = False
        self._fenced = trio.Event()
        self._released = trio.Event()

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def fenced(self) -> bool:
        return self._fenced.is_set()

    @property
    def released(self) -> trio.Event:
        return self._released

    async def wait_fenced(self) -> None:
        await self._fenced.wait()

    def fence(self) -> None:
        self.holding = False
        self._fenced.set()

    async def release(self) -> None:
        if self._released.is_set():
            await trio.lowlevel.checkpoint()
            return
        self._released.set()
        self.holding = False
        with trio.CancelScope(shield=True):
            await self._presence.let_go(self)

    def abort(self) -> None:
        """The backend stops: fence and let go without a word to the brokers."""
        self.fence()
        self._released.set()


class Presence:
    """This proxy's view of the presence table, its heartbeat and its leases."""

    def __init__(
        self,
        context: ClusterContext,
        table: ClusterTable,
        *,
        catch_up: Callable[[], Awaitable[None]],
    ) -> None:
        """`catch_up` reads the session tables up to their end (step 4)."""
        self._context = context
        self._table = table
        self._catch_up = catch_up
        self.proxy_id = secrets.token_hex(8)
        self._owners: dict[str, tuple[str, str]] = {}  # client id -> (proxy, nonce)
        self._pending: dict[str, ClusterLease] = {}  # nonce -> lease whose claim is on its way
        self._leases: dict[str, ClusterLease] = {}  # client id -> this proxy's holder
        self._released: OrderedDict[str, None] = OrderedDict()  # nonces let go of
        self._heard: dict[str, float] = {}  # proxy -> when its last heartbeat was read
        self._change = trio.Event()
        self._closed = False
        table.observe(self._observe)

    # -- the table's history -----------------------------------------------------------------

    def _observe(self, key: str, value: bytes | None, _position: MessageId) -> None:
        if key.startswith(PROXY_PREFIX):
            proxy = key[len(PROXY_PREFIX) :]
            if value is None:
                self._heard.pop(proxy, None)  # a goodbye
            else:
                self._heard[proxy] = trio.current_time()
        elif value is not None:  # tombstones only compact the table
            self._observe_claim(key, value.decode("utf-8", "replace"))
        self._change.set()
        self._change = trio.Event()

    def _observe_claim(self, client_id: str, value: str) -> None:
        previous = self._owners.get(client_id)
        if value.startswith(RELEASE_MARK):
            nonce = value[len(RELEASE_MARK) :]
            self._remember_release(nonce)
            if previous is not None and previous[1] == nonce:
                del self._owners[client_id]
            return
        proxy, _, nonce = value.partition(" ")
        self._owners[client_id] = (proxy, nonce)
        pending = self._pending.pop(nonce, None)
        if pending is not None:
            pending.previous = previous
            pending.applied.set()
        local = self._leases.get(client_id)
        if local is not None and local.nonce != nonce and local.applied.is_set():
            local.fence()  # a later claim, from another connection

    def _remember_release(self, nonce: str) -> None:
        self._released[nonce] = None
        if len(self._released) > _RELEASES_KEPT:
            self._released.popitem(last=False)

    def _alive(self, proxy: str) -> bool:
        heard = self._heard.get(proxy)
        return heard is not None and trio.current_time() - heard < LIVENESS_TIMEOUT

    # -- heartbeat -------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write this proxy's heartbeat (the first before it reports started) until
        cancelled."""
        key = PROXY_PREFIX + self.proxy_id
        while not self._closed:
            try:
                await self._table.put(key, b"1")
            except BackendError as exc:
                log.debug("presence heartbeat: %s", exc)
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            await trio.sleep(HEARTBEAT)

    async def aclose(self) -> None:
        """Say goodbye (the heartbeat deleted): this proxy's claims are not waited for."""
        self._closed = True
        for lease in list(self._leases.values()):
            lease.abort()
        with trio.CancelScope(shield=True), trio.move_on_after(self._context.fence_timeout):
            try:
                await self._table.put(PROXY_PREFIX + self.proxy_id, None)
            except BackendError as exc:
                log.debug("presence goodbye: %s", exc)

    # -- taking and letting go -------------------------------------------------------------

    async def claim(self, client_id: str) -> ClusterLease:
        """Take `client_id` over (see the module docstring)."""
        if self._closed:
            raise BackendError("backend is closed", reason="closed")
        previous_here = self._leases.get(client_id)
        lease = ClusterLease(self, client_id, secrets.token_hex(8))
        self._leases[client_id] = lease
        self._pending[lease.nonce] = lease
        timeout = self._context.fence_timeout
        try:
            await self._table.put(client_id, f"{self.proxy_id} {lease.nonce}".encode())
            with trio.move_on_after(self._context.operation_timeout):
                await lease.applied.wait()
            if not lease.applied.is_set():
                # Unseen, this claim could not be fenced by a later one: refuse it.
                raise BackendError(
                    f"client id {client_id!r}: the presence table did not bring the claim back",
                    reason="unavailable",
                )
        except BaseException:
            self._pending.pop(lease.nonce, None)
            if self._leases.get(client_id) is lease:
                if previous_here is not None and not previous_here.fenced:
                    self._leases[client_id] = previous_here  # it still holds the id
                else:
                    del self._leases[client_id]
            # The claim may be in the table all the same: its release, so nobody waits for it.
            lease.abort()
            with trio.CancelScope(shield=True):
                await self._release_claim(client_id, lease.nonce)
            raise
        if previous_here is not None:
            previous_here.fence()
            with trio.move_on_after(timeout):
                await previous_here.released.wait()
        previous = lease.previous
        if previous is not None and previous[1] != lease.nonce and not lease.fenced:
            with trio.move_on_after(timeout) as waited:
                await self._let_go_of(previous)
            if waited.cancelled_caught:
                log.warning(
                    "client %r: its previous holder did not let go within %ss; taking over anyway",
                    client_id,
                    timeout,
                )
        lease.holding = not lease.fenced
        await self._catch_up()
        return lease

    async def _let_go_of(self, previous: tuple[str, str]) -> None:
        """Return once the claim `previous` was let go of, or its proxy is dead."""
        proxy, nonce = previous
        while nonce not in self._released and (proxy == self.proxy_id or self._alive(proxy)):
            with trio.move_on_after(HEARTBEAT / 2):  # liveness is judged by the clock too
                await self._change.wait()

    async def let_go(self, lease: ClusterLease) -> None:
        """`lease` is done: its release ends its claim (and wakes a holder that took it over);
        the key is deleted a little later if nothing claims it meanwhile."""
        client_id = lease.client_id
        if self._leases.get(client_id) is lease:
            del self._leases[client_id]
        if self._closed:
            return
        if await self._release_claim(client_id, lease.nonce):
            self._context.delays.call_later(CLEAN_UP_DELAY, lambda: self._clean_up(client_id))

    async def _release_claim(self, client_id: str, nonce: str) -> bool:
        """Write the release of claim `nonce`; whether it was written."""
        with trio.move_on_after(self._context.fence_timeout):
            try:
                await self._table.put(client_id, f"{RELEASE_MARK}{nonce}".encode())
                return True
            except BackendError as exc:
                log.debug("releasing client id %r: %s", client_id, exc)
        return False

    def _clean_up(self, client_id: str) -> None:
        if self._closed or client_id in self._owners or client_id in self._leases:
            return  # claimed again meanwhile
        self._context.nursery.start_soon(self._delete, client_id)

    async def _delete(self, client_id: str) -> None:
        if client_id in self._owners or client_id in self._leases:
            await trio.lowlevel.checkpoint()
            return
        try:
            await self._table.put(client_id, None)
        except BackendError as exc:
            log.debug("client id %r: %s", client_id, exc)
