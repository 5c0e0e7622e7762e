"""Tables in separated mode: a compacted system topic per table, read into memory.

Table `name` lives in `persistent://{tenant}/__mop/{namespace}%2Ftable%2F{name}` (per default
namespace, since table keys are relative to it): each write is a message keyed
by the table key, whose payload is the value, or an empty payload with property `mop.tombstone`
= "1" for a delete; brokers keep only the latest message per key. Every proxy tails the topic
with a reader from its first message into a dict, so `get` and `items` answer from memory. A
`put` waits for the broker's receipt and then updates the dict (read-your-writes); `catch_up`
reads up to the topic's last message, for when another proxy's last write must be seen.
Messages without a key, and the markers `catch_up` writes, are no entries of the table.

The reader is a non-durable subscription of the backend's Pulsar client (a unique name per
reader, from the earliest message, acknowledged as read), whose messages are applied to the dict
as they arrive, on the trio thread; the latest write of each key wins. It reads the compacted
view where the broker has one (the latest value of each key, then what was written since),
and the topic as stored otherwise (brokers that do not compact, such as pulsar-lite).

`SubscriptionRegistry` is such a table that the backend keeps for itself: for each durable
subscription member, when each of its selectors was first subscribed.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from mop.backends.cluster.errors import error_for
from mop.message import CATCH_UP_KEY, TOMBSTONE_PROPERTY, Message, MessageId
from mop.processor.backend import BackendError, SubscriptionKind, SubscriptionSpec
from mop.protocols.pulsar.commands import InitialPosition, SubType
from mop.protocols.pulsar.driver import (
    ClientClosed,
    ClientConsumer,
    ConsumerConfig,
    DriverError,
    Received,
    subscribe,
)
from mop.topic_names import table_topic

if TYPE_CHECKING:
    from mop.backends.cluster.producers import ProducerCache
    from mop.protocols.pulsar.driver import PulsarClient

__all__ = [
    "REGISTRY_TABLE",
    "ClusterTable",
    "Position",
    "SubscriptionRegistry",
    "TableContext",
]

log = logging.getLogger("mop.cluster")

REGISTRY_TABLE: Final = "mop.subscriptions"
# The subscription names of table readers: this prefix and a random part, one per reader.
READER_PREFIX: Final = "mop-table-"
# The id the reader starts from: the topic's earliest message.
EARLIEST: Final = MessageId(-1, -1)
# Deleted keys whose last position is remembered (see `ClusterTable._set`).
_DELETED_KEPT: Final = 10_000

# A message's place in its topic, (ledger, entry): table writes are never batched.
Position = tuple[int, int]


class _CatchUp:
    """One marker's catch-up, shared by the callers that joined it."""

    __slots__ = ("done", "error", "finished")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: BackendError | None = None
        self.finished = False


class TableContext(Protocol):
    """What a table needs of whoever runs it: a `ClusterContext` (in a proxy), or
    `mop.backends.cluster.table_client` (for a command that edits a deployment's table)."""

    @property
    def operation_timeout(self) -> float: ...

    @property
    def producers(self) -> ProducerCache: ...

    @property
    def client(self) -> Callable[[], PulsarClient]: ...


class ClusterTable:
    """One table: an in-memory dict kept up to date from its topic by `serve`.

    A table may be made before the backend runs (`ClusterBackend.table`); it reaches the
    brokers through the context `serve` is given.
    """

    def __init__(self, name: str, *, tenant: str, namespace: str) -> None:
        self._context: TableContext | None = None  # set by `serve`
        self._name = name
        self.topic = table_topic(tenant, namespace, name)
        self._items: dict[str, bytes] = {}
        # The id of the write each key's value comes from, so that the reader never undoes a
        # newer `put` with an older message it reaches later.
        self._ids: dict[str, MessageId] = {}
        self._deleted: OrderedDict[str, MessageId] = OrderedDict()
        self._reader: ClientConsumer | None = None
        self.loaded = trio.Event()
        self._applied = trio.Event()
        # The position of the last message the reader applied (keyed or not), and whether
        # the reader still follows the topic (not once the table stops).
        self._read_through: Position | None = None
        # The catch-up whose marker is still to be written, for callers to join.
        self._next_catch_up: _CatchUp | None = None
        self._following = False
        self._stopped = trio.Event()  # the reader is closed or lost: `serve` returns
        self._failed: BackendError | None = None
        self._watchers: list[Callable[[str, bytes | None], None]] = []
        self._observers: list[Callable[[str, bytes | None, MessageId], None]] = []
        # Keys with a write of this proxy in flight, and how many.
        self._own: dict[str, int] = {}
        # The position of this proxy's last write that the broker confirmed.
        self._written_through: Position | None = None
        # Puts are numbered as they are made; the latest one whose position is unknown (0:
        # none since the last confirmed one made after it).
        self._put_order = 0
        self._unknown_from = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def _running(self) -> TableContext:
        assert self._context is not None, "serve() has started"
        return self._context

    def _ready(self) -> None:
        if self._failed is not None:
            raise self._failed
        if not self.loaded.is_set():
            raise BackendError(
                f"table {self._name!r} is still loading; tables the node uses are loaded"
                " before it starts",
                reason="unavailable",
            )

    def get(self, key: str) -> bytes | None:
        self._ready()
        return self._items.get(key)

    def items(self) -> Iterator[tuple[str, bytes]]:
        self._ready()
        return iter(list(self._items.items()))

    async def put(self, key: str, value: bytes | None) -> None:
        await self.loaded.wait()
        extra = {TOMBSTONE_PROPERTY: "1"} if value is None else None
        # The reader may bring this very write back before its receipt does: while it is in
        # flight, changes of the key are this proxy's own and are not reported to watchers.
        self._own[key] = self._own.get(key, 0) + 1
        order = self._put_order = self._put_order + 1
        try:
            result = await self._running.producers.send(
                self.topic, Message(payload=value or b"", key=key), batching=False, extra=extra
            )
        except BaseException:
            # Failed or given up on (cancelled): it may have landed all the same.
            self._unknown_from = max(self._unknown_from, order)
            raise
        finally:
            if self._own[key] == 1:
                del self._own[key]
            else:
                self._own[key] -= 1
        message_id = result.message_id
        if message_id.ledger < 0:
            # Stored before, by a send whose receipt was lost (the broker deduplicated this
            # one): where is unknown.
            self._unknown_from = max(self._unknown_from, order)
        else:
            if order > self._unknown_from:
                # Sent after every write whose position is unknown (one producer, in order):
                # those are before it, so its position covers them.
                self._unknown_from = 0
            position = (message_id.ledger, message_id.entry)
            if self._written_through is None or position > self._written_through:
                self._written_through = position
        self._set(key, value, message_id)

    @property
    def written_through(self) -> Position | None:
        """The topic position of this proxy's last confirmed write (None: none yet). A proxy
        that hands a client id over passes it on, so the next holder reads at least that far
        before it takes the client's state (see `mop.backends.cluster.leases`)."""
        return self._written_through

    @property
    def written_unknown(self) -> bool:
        """Whether a write since the last confirmed one may have landed at an unknown
        position (it failed, or its receipt was lost): `written_through` falls short."""
        return self._unknown_from > 0

    def watch(self, callback: Callable[[str, bytes | None], None]) -> None:
        """Call `callback(key, value)` (value None: deleted) on the trio thread whenever the
        reader brings a change made by another proxy, so that state derived from the table
        (an index of retained topics, offline sessions) can follow."""
        self._watchers.append(callback)

    def observe(self, callback: Callable[[str, bytes | None, MessageId], None]) -> None:
        """Call `callback(key, value, position)` on the trio thread for every write the reader
        brings, this proxy's own included, in the topic's order, from the first one read
        (loading included): for state that needs the table's history, not only its values."""
        self._observers.append(callback)

    def _set(self, key: str, value: bytes | None, message_id: MessageId) -> bool:
        known = self._ids.get(key)
        if known is None:
            known = self._deleted.get(key)
        if known is not None and message_id <= known:
            return False
        if value is None:
            # Deleted keys are remembered a while only (an older write arriving late is then
            # told apart), not for good: a table of client ids sees endless distinct keys.
            self._ids.pop(key, None)
            self._deleted[key] = message_id
            if len(self._deleted) > _DELETED_KEPT:
                self._deleted.popitem(last=False)
            return self._items.pop(key, None) is not None
        self._deleted.pop(key, None)
        self._ids[key] = message_id
        changed = self._items.get(key) != value
        self._items[key] = value
        return changed

    def _receive(self, consumer: ClientConsumer, items: list[Received]) -> None:
        """The reader's sink: apply what it brings, in order, as it arrives."""
        for item in items:
            self._apply(item)
        self._applied.set()
        self._applied = trio.Event()

    def _apply(self, item: Received) -> None:
        position = item.message_id
        self._read_through = (position.ledger, position.entry)
        key = item.key
        if key and key != CATCH_UP_KEY:
            tombstone = dict(item.properties).get(TOMBSTONE_PROPERTY) == "1"
            value = None if tombstone else item.payload
            changed = self._set(key, value, position)
            for observer in self._observers:
                try:
                    observer(key, value, position)
                except Exception:
                    log.exception("an observer of table %r failed", self._name)
            if changed and self.loaded.is_set() and key not in self._own:
                for callback in self._watchers:
                    try:
                        callback(key, value)
                    except Exception:
                        log.exception("a watcher of table %r failed", self._name)

    def _lost(self, exc: DriverError) -> None:
        """The reader could not subscribe again (the client gave up on it)."""
        level = logging.DEBUG if isinstance(exc, ClientClosed) else logging.WARNING
        log.log(level, "table %r: %s", self._name, error_for(exc, "reading the table"))
        self._stop_following()

    def _stop_following(self) -> None:
        # A `catch_up` waiting for the reader cannot be served any more: wake it.
        self._following = False
        self._stopped.set()
        self._applied.set()

    # -- reading ---------------------------------------------------------------------------

    async def serve(
        self,
        context: TableContext,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open the reader, load the table, report readiness, then follow the topic (the
        reader brings its messages by itself) until the table is closed, its reader is lost
        for good, or cancellation."""
        self._context = context
        config = ConsumerConfig(
            sub_type=SubType.Exclusive,
            durable=False,
            initial_position=InitialPosition.Earliest,
            start_message_id=EARLIEST,
            receiver_queue=1000,
            auto_ack=True,
            read_compacted=True,
        )
        subscription = READER_PREFIX + secrets.token_hex(8)
        try:
            self._reader = await subscribe(
                context.client(),
                self.topic,
                subscription,
                self._receive,
                config,
                on_lost=self._lost,
            )
        except DriverError as exc:
            self._failed = error_for(exc, f"opening table {self._name!r}")
            raise self._failed from None
        except BackendError as exc:
            self._failed = exc
            raise
        self._following = True
        try:
            await self.catch_up()
            self.loaded.set()
            task_status.started()
            await self._stopped.wait()
        finally:
            self._stop_following()

    async def catch_up(self) -> None:
        """Return once every message the topic had when called is in the dict (or, with a
        warning, after the backend's operation timeout).

        A marker goes to the topic, and the reader is waited for until it has read through
        it: the topic's order puts every earlier write before it. (Asking the broker for the
        topic's last message id instead would not do: some brokers answer that question for
        an empty topic with an error.) Callers that come while a marker is still to be written
        share it (a storm of connects writes one marker per table and moment, not one each);
        the first of them writes it, and if it is cancelled the others start another round.
        """
        if self._reader is None:
            await self.loaded.wait()
        while (joining := self._next_catch_up) is not None:
            await joining.done.wait()
            if joining.error is not None:
                raise joining.error
            if joining.finished:
                return
            # Its first caller was cancelled before the end: another round.
        round_ = self._next_catch_up = _CatchUp()
        try:
            await trio.lowlevel.checkpoint()  # callers of this same moment join
            if self._next_catch_up is round_:
                self._next_catch_up = None  # later ones need a marker written after them
            await self._read_past_a_marker()
            round_.finished = True
        except BackendError as exc:
            round_.error = exc
            raise
        finally:
            if self._next_catch_up is round_:
                self._next_catch_up = None
            round_.done.set()

    async def _read_past_a_marker(self) -> None:
        timeout = self._running.operation_timeout
        with trio.move_on_after(timeout) as scope:
            marker = Message(payload=b"", key=CATCH_UP_KEY)
            result = await self._running.producers.send(self.topic, marker, batching=False)
            await self._read_until((result.message_id.ledger, result.message_id.entry))
        if scope.cancelled_caught:
            log.warning("table %r: not caught up after %ss", self._name, timeout)

    async def read_through(self, position: Position) -> None:
        """Return once the reader has applied the message at `position` and all before it
        (at once when it has; with a warning after the operation timeout): a write another
        proxy reported confirmed is then in the dict, with no marker round trip."""
        if self._read_through is not None and self._read_through >= position:
            await trio.lowlevel.checkpoint()
            return
        timeout = self._running.operation_timeout
        with trio.move_on_after(timeout) as scope:
            await self._read_until(position)
        if scope.cancelled_caught:
            log.warning("table %r: not read through %s after %ss", self._name, position, timeout)

    async def _read_until(self, position: Position) -> None:
        while self._read_through is None or self._read_through < position:
            if not self._following:
                log.debug("table %r: stopped before it caught up", self._name)
                return
            await self._applied.wait()

    async def aclose(self) -> None:
        reader, self._reader = self._reader, None
        self._stop_following()
        if reader is not None:
            with trio.move_on_after(5):
                await reader.close(5)
            reader.abort()  # if the close did not finish in time (nothing once it did)


def _registry_key(name: str, member: str) -> str:
    return json.dumps([name, member], separators=(",", ":"))


def _registry_entry(key: str) -> tuple[str, str] | None:
    """The (subscription name, member) of a registry key; None for a key of another shape."""
    try:
        name, member = json.loads(key)
    except (ValueError, TypeError):
        return None
    return (name, member) if isinstance(name, str) and isinstance(member, str) else None


def _since(record: Any) -> dict[str, int]:
    try:
        return {str(s): int(t) for s, t in record["since"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        log.warning("unreadable subscription record %r", record)
        return {}


def _member(spec: SubscriptionSpec) -> str:
    # Only a shared subscription has members of its own; any other has one consumer at a time.
    return spec.member if spec.kind is SubscriptionKind.SHARED else ""


class SubscriptionRegistry:
    """Per durable (or shared) subscription member: its selectors and when each was first
    subscribed, so a resumed session skips what was published before, and a subscription can
    be deleted (or a shared one left) without a consumer attached."""

    def __init__(self, table: ClusterTable) -> None:
        """`table` has loaded: the registry indexes what it holds, then follows its writes."""
        self.table = table
        # Subscription name -> the keys of its members that may be in the table (a superset:
        # `members` reads each back), so that looking one subscription up costs its members,
        # not a scan of every subscription of the namespace.
        self._keys: dict[str, set[str]] = {}
        table.observe(self._observe)
        for key, _ in table.items():
            self._note(key)

    def _note(self, key: str) -> None:
        entry = _registry_entry(key)
        if entry is not None:
            self._keys.setdefault(entry[0], set()).add(key)

    def _observe(self, key: str, value: bytes | None, _position: MessageId) -> None:
        if value is not None:
            self._note(key)
            return
        entry = _registry_entry(key)
        keys = None if entry is None else self._keys.get(entry[0])
        if keys is None or key not in keys:
            return
        try:
            if self.table.get(key) is not None:
                return  # written again since (this proxy's own write, read back later)
        except BackendError:
            return  # the table failed: keep the key, `members` reads it back anyway
        keys.discard(key)
        if not keys:
            assert entry is not None
            del self._keys[entry[0]]

    @staticmethod
    def _kept(spec: SubscriptionSpec) -> bool:
        return spec.durable or spec.kind is SubscriptionKind.SHARED

    def since(self, spec: SubscriptionSpec) -> dict[str, int]:
        """When each selector of `spec`'s subscription was first subscribed, as recorded (for
        a shared one, by any member: the messages belong to the group)."""
        if spec.kind is SubscriptionKind.SHARED:
            found: dict[str, int] = {}
            for record in self.members(spec.name).values():
                for selector, time in _since(record).items():
                    found[selector] = min(time, found.get(selector, time))
            return found
        data = self.table.get(_registry_key(spec.name, _member(spec)))
        if data is None:
            return {}
        try:
            return _since(json.loads(data))
        except ValueError:
            return {}

    async def record(self, spec: SubscriptionSpec, since: dict[str, int]) -> None:
        if not self._kept(spec):
            await trio.lowlevel.checkpoint()
            return
        record: dict[str, object] = {
            "since": since,
            "kind": spec.kind.value,
            "durable": spec.durable,
        }
        if spec.kind is not SubscriptionKind.SHARED:
            # Recorded under "" (see `_member`): the member it was made with is kept in the
            # record, for `delete_subscription` to check.
            record["member"] = spec.member
        value = json.dumps(record, separators=(",", ":"), sort_keys=True).encode()
        key = _registry_key(spec.name, _member(spec))
        if self.table.get(key) == value:
            await trio.lowlevel.checkpoint()
            return
        self._note(key)
        await self.table.put(key, value)
        self._note(key)  # a delete read back meanwhile may have dropped it

    def members(self, name: str) -> dict[str, dict[str, Any]]:
        """The recorded members of subscription `name`, with their records."""
        found: dict[str, dict[str, Any]] = {}
        for key in list(self._keys.get(name, ())):
            value = self.table.get(key)
            entry = _registry_entry(key)
            if value is None or entry is None:
                continue
            try:
                found[entry[1]] = json.loads(value)
            except ValueError:
                continue
        return found

    async def leave(self, spec: SubscriptionSpec) -> bool:
        """Forget `spec`'s member of its subscription; whether other members remain."""
        return await self.leave_member(spec.name, _member(spec))

    async def leave_member(self, name: str, member: str) -> bool:
        """Forget `member` of subscription `name` ("" for one that is not shared); whether
        other members remain."""
        await self.table.catch_up()
        members = self.members(name)
        if member in members:
            await self.table.put(_registry_key(name, member), None)
            del members[member]
        return bool(members)
