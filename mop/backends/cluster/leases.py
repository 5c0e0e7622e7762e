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
   session tables are in, and (4) the new holder reads the tables that far.

Letting go writes a release under the client id: `-{nonce}`, then a line per table this proxy
wrote to, `{ledger} {entry} {table}`, where its last confirmed write to that table is (its
*frontier*). A release ends that claim only (a later claim stays the holder, whatever the order
the two arrive in), and it is what a new holder waits for. Step 4 then reads each table up to
the previous holder's frontier, which its reader has mostly passed already: a connect costs the
brokers its claim and nothing more. Only when that frontier is unknown (the previous holder's
proxy died, or did not let go in time, or one of its writes landed where it cannot tell: the
release then has no frontier lines) are the tables caught up with markers. A claim with no
previous holder in this proxy's view reads up to the frontiers of every release it has seen
(and catches up after a release without one): an id let go of and deleted since is covered by
that, one let go of before this proxy started by the tables' loading. Writes made without
holding the id (the session timers' role ending an expired session) are not ordered by this;
the session registry's `EXPIRY_GRACE` keeps them apart from a take in time.

A little later (`CLEAN_UP_DELAY`), when nothing claimed the id meanwhile, the releasing proxy
deletes the key (a tombstone), so the table keeps nothing per client id that left. Each
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
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final

import trio

from mop.message import MessageId
from mop.processor.backend import BackendError
from mop.processor.fencing import LeaseFence

if TYPE_CHECKING:
    from mop.backends.cluster.context import ClusterContext
    from mop.backends.cluster.tables import ClusterTable, Position

__all__ = [
    "CLEAN_UP_DELAY",
    "HEARTBEAT",
    "LIVENESS_TIMEOUT",
    "PRESENCE_TABLE",
    "ClusterLease",
    "Frontier",
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

# Table name -> the position of a proxy's last confirmed write to that table.
Frontier = Mapping[str, "Position"]


def release_value(nonce: str, frontier: Frontier | None) -> bytes:
    """The release of claim `nonce` by a proxy whose writes reached `frontier` (None:
    unknown, so the next holder reads the tables to their end)."""
    if frontier is None:
        return f"{RELEASE_MARK}{nonce}".encode()
    lines = [
        RELEASE_MARK + nonce,
        *(f"{ledger} {entry} {name}" for name, (ledger, entry) in frontier.items()),
    ]
    return ("\n".join(lines) + "\n").encode()


def parse_release(value: str) -> tuple[str, Frontier | None]:
    """The nonce and frontier of a release (`value` starts with RELEASE_MARK); the frontier
    is None when unknown (a release without one, as proxies of earlier versions write)."""
    first, newline, rest = value[len(RELEASE_MARK) :].partition("\n")
    if not newline:
        return first, None
    frontier: dict[str, Position] = {}
    for line in rest.splitlines():
        fields = line.split(" ", 2)
        try:
            frontier[fields[2]] = (int(fields[0]), int(fields[1]))
        except (IndexError, ValueError):
            return first, None  # unreadable: as good as unknown
    return first, frontier


class ClusterLease(LeaseFence):
    """Ownership of one client id, fenced when another connection (on any proxy) takes it
    (see `LeaseFence` for its states)."""

    __slots__ = ("_client_id", "_presence", "applied", "holding", "nonce", "previous")

    def __init__(self, presence: Presence, client_id: str, nonce: str) -> None:
        super().__init__()
        self._presence = presence
        self._client_id = client_id
        self.nonce = nonce
        # Set once its claim has been read back; dropped then (only a claim in flight has one).
        self.applied: trio.Event | None = trio.Event()
        self.previous: tuple[str, str] | None = None  # (proxy, nonce) its claim replaced
        self.holding = False

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def claimed(self) -> bool:
        """Whether its claim has been read back (so a later claim can fence it)."""
        return self.applied is None or self.applied.is_set()

    def fence(self) -> None:
        self.holding = False
        self.set_fenced()

    async def release(self) -> None:
        if not self.set_released():
            await trio.lowlevel.checkpoint()
            return
        self.holding = False
        with trio.CancelScope(shield=True):
            await self._presence.let_go(self)

    def abort(self) -> None:
        """The backend stops: fence and let go without a word to the brokers."""
        self.fence()
        self.set_released()


class Presence:
    """This proxy's view of the presence table, its heartbeat and its leases."""

    def __init__(
        self,
        context: ClusterContext,
        table: ClusterTable,
        *,
        catch_up: Callable[[], Awaitable[None]],
        written: Callable[[], Frontier | None],
        read_through: Callable[[Frontier], Awaitable[None]],
    ) -> None:
        """Step 4: `catch_up` reads the tables up to their end, `read_through` up to a
        frontier; `written` is this proxy's own frontier (the presence table is no part of it;
        None: unknown)."""
        self._context = context
        self._table = table
        self._catch_up = catch_up
        self._written = written
        self._read_through = read_through
        self.proxy_id = secrets.token_hex(8)
        self._owners: dict[str, tuple[str, str]] = {}  # client id -> (proxy, nonce)
        self._pending: dict[str, ClusterLease] = {}  # nonce -> lease whose claim is on its way
        self._leases: dict[str, ClusterLease] = {}  # client id -> this proxy's holder
        # Nonces let go of, with the frontier their release carries (None: unknown).
        self._released: OrderedDict[str, Frontier | None] = OrderedDict()
        # Per table, the furthest frontier of every release read (for ids deleted since).
        self._released_through: dict[str, Position] = {}
        # Releases read without a frontier, and how many of them a catch-up has covered.
        self._unknown_releases = 0
        self._unknown_caught_up = 0
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
            nonce, frontier = parse_release(value)
            self._remember_release(nonce, frontier)
            if previous is not None and previous[1] == nonce:
                del self._owners[client_id]
            return
        proxy, _, nonce = value.partition(" ")
        self._owners[client_id] = (proxy, nonce)
        pending = self._pending.pop(nonce, None)
        if pending is not None and pending.applied is not None:
            pending.previous = previous
            pending.applied.set()
        local = self._leases.get(client_id)
        if local is not None and local.nonce != nonce and local.claimed:
            local.fence()  # a later claim, from another connection

    def _remember_release(self, nonce: str, frontier: Frontier | None) -> None:
        self._released[nonce] = frontier
        if frontier is None:
            self._unknown_releases += 1
        if len(self._released) > _RELEASES_KEPT:
            self._released.popitem(last=False)
        through = self._released_through
        for name, position in (frontier or {}).items():
            if name not in through or through[name] < position:
                through[name] = position

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
        taken = False
        try:
            await self._write_claim(lease)
            taken = True
            await self._take_over(lease, previous_here)
        except BaseException:
            self._pending.pop(lease.nonce, None)
            if self._leases.get(client_id) is lease:
                if not taken and previous_here is not None and not previous_here.fenced:
                    self._leases[client_id] = previous_here  # it still holds the id
                else:
                    del self._leases[client_id]
            # The claim may be in the table all the same: its release, so nobody waits for it.
            lease.abort()
            with trio.CancelScope(shield=True):
                await self._release_claim(client_id, lease.nonce)
            raise
        return lease

    async def _write_claim(self, lease: ClusterLease) -> None:
        """Steps 1 and 2: the claim written and read back (its previous holder known)."""
        applied = lease.applied
        assert applied is not None  # a new lease's claim is in flight
        await self._table.put(lease.client_id, f"{self.proxy_id} {lease.nonce}".encode())
        with trio.move_on_after(self._context.operation_timeout):
            await applied.wait()
        if not applied.is_set():
            # Unseen, this claim could not be fenced by a later one: refuse it.
            raise BackendError(
                f"client id {lease.client_id!r}: the presence table did not bring the claim back",
                reason="unavailable",
            )
        lease.applied = None

    async def _take_over(self, lease: ClusterLease, previous_here: ClusterLease | None) -> None:
        """Steps 3 and 4: the previous holder let go, and its writes read."""
        timeout = self._context.fence_timeout
        if previous_here is not None:
            previous_here.fence()
            with trio.move_on_after(timeout):
                await previous_here.wait_released()
        previous = lease.previous
        if previous is not None and previous[1] != lease.nonce and not lease.fenced:
            with trio.move_on_after(timeout) as waited:
                await self._let_go_of(previous)
            if waited.cancelled_caught:
                log.warning(
                    "client %r: its previous holder did not let go within %ss; taking over anyway",
                    lease.client_id,
                    timeout,
                )
        lease.holding = not lease.fenced
        frontier = self._previous_frontier(previous)
        if frontier is None:
            unknown = self._unknown_releases
            await self._catch_up()
            # Its markers came after every release read before it: those are covered now.
            self._unknown_caught_up = max(self._unknown_caught_up, unknown)
        else:
            await self._read_through(frontier)

    def _previous_frontier(self, previous: tuple[str, str] | None) -> Frontier | None:
        """How far the tables must be read for the previous holder's writes (step 4), or
        None to read them to their end."""
        if previous is None:
            if self._unknown_releases > self._unknown_caught_up:
                return None  # a release without a frontier, of an id since deleted maybe
            return dict(self._released_through)  # a copy: releases may come while it is read
        if previous[0] == self.proxy_id:
            # This proxy's own writes are in its tables as soon as confirmed; one that may
            # have landed unconfirmed is not.
            return {} if self._written() is not None else None
        return self._released.get(previous[1])

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
        nonce = lease.nonce
        if await self._release_claim(client_id, nonce):
            self._context.delays.call_later(
                CLEAN_UP_DELAY, lambda: self._clean_up(client_id, nonce)
            )

    async def _release_claim(self, client_id: str, nonce: str) -> bool:
        """Write the release of claim `nonce`; whether it was written."""
        with trio.move_on_after(self._context.fence_timeout):
            try:
                await self._table.put(client_id, release_value(nonce, self._written()))
                return True
            except BackendError as exc:
                log.debug("releasing client id %r: %s", client_id, exc)
        return False

    def _clean_up(self, client_id: str, nonce: str) -> None:
        if not self._closed and self._unclaimed(client_id, nonce):
            self._context.nursery.start_soon(self._delete, client_id, nonce)

    def _unclaimed(self, client_id: str, nonce: str) -> bool:
        """Whether nobody claimed `client_id` since the claim `nonce` was let go of (the
        reader may not have brought that release back yet: the claim is then still ours)."""
        if client_id in self._leases:
            return False
        owner = self._owners.get(client_id)
        return owner is None or owner[1] == nonce

    async def _delete(self, client_id: str, nonce: str) -> None:
        if not self._unclaimed(client_id, nonce):
            await trio.lowlevel.checkpoint()
            return
        try:
            await self._table.put(client_id, None)
        except BackendError as exc:
            log.debug("client id %r: %s", client_id, exc)
