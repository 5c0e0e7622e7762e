"""`LocalTable`: a table of the local backend, which is the table's compacted topic in the
colocated broker (`mop.topic_names.table_topic`), the very topic a separated proxy reads as that
table; so Pulsar clients of the node (a proxy, `mop ban`) and the node share it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import trio

from mop.backends.local.errors import translated
from mop.broker import Broker
from mop.clock import now_ms
from mop.message import CATCH_UP_KEY, TOMBSTONE_PROPERTY, Message
from mop.topic_names import table_topic

__all__ = ["LocalTable"]

log = logging.getLogger("mop.local")

_TOMBSTONE = ((TOMBSTONE_PROPERTY, "1"),)


class LocalTable:
    """One table: the live keys of its compacted topic, each with its message's payload.

    The broker keeps the latest message of each key (in memory and in storage), so reads are
    dictionary lookups; a write is a message stored to the topic (durable when `put` returns).
    The backend reports every change of the topic with `_changed`: those made through this
    object are not passed on to watchers, those of anyone else are. The markers separated
    proxies write to the topic (`CATCH_UP_KEY`) are no entries.
    """

    def __init__(self, broker: Broker, name: str, *, check_running: Callable[[], None]) -> None:
        self._broker = broker
        self._name = name
        self._check_running = check_running  # raises BackendError when the backend is not
        self.topic = table_topic(broker.tenant, broker.namespace, name)
        self._watchers: list[Callable[[str, bytes | None], None]] = []
        self._writing = False  # while a write of this object is being stored
        self._adopt_earlier_rows()

    def _adopt_earlier_rows(self) -> None:
        """Earlier versions kept a table in a storage table of its own name: its rows move
        into the topic, once (a key the topic has already is not overwritten), so that an
        upgrade keeps retained messages and sessions. The old rows are deleted after the
        messages are stored, in the one log, so a crash in between loses neither."""
        storage = self._broker.storage
        rows = list(storage.table_items(self._name))
        if not rows:
            return
        moved = 0
        for key, value in rows:
            if key != CATCH_UP_KEY and self._broker.compacted.latest(self.topic, key) is None:
                message = Message(value, key=key, publish_time=now_ms())
                self._writing = True
                try:
                    self._broker.store(self.topic, message)
                finally:
                    self._writing = False
                moved += 1
            storage.table_put(self._name, key, None)
        log.info("table %r: %d entries moved from the earlier storage table", self._name, moved)

    @property
    def name(self) -> str:
        return self._name

    def get(self, key: str) -> bytes | None:
        if key == CATCH_UP_KEY:
            return None
        message = self._broker.compacted.latest(self.topic, key)
        return None if message is None else message.payload

    def items(self) -> Iterator[tuple[str, bytes]]:
        items = self._broker.compacted.items(self.topic)
        return iter([(key, message.payload) for key, message in items if key != CATCH_UP_KEY])

    async def put(self, key: str, value: bytes | None) -> None:
        self._check_running()
        if value is None and self._broker.compacted.latest(self.topic, key) is None:
            await trio.lowlevel.checkpoint()  # nothing to delete: nothing to write
            return
        properties = _TOMBSTONE if value is None else ()
        message = Message(value or b"", properties, key=key, publish_time=now_ms())
        with translated():
            # The broker reports the change while it stores the message, before any await.
            self._writing = True
            try:
                self._broker.store(self.topic, message)
            finally:
                self._writing = False
            await self._broker.storage.sync()

    def watch(self, callback: Callable[[str, bytes | None], None]) -> None:
        """Call `callback(key, value)` (value None: deleted) whenever a write that did not
        come through this object changes a key: a Pulsar client's, through the broker."""
        self._watchers.append(callback)

    def _changed(self, key: str, before: Message | None, after: Message | None) -> None:
        """The backend's report of a change of the topic's key `key` (see the class)."""
        if self._writing or key == CATCH_UP_KEY:
            return
        value = None if after is None else after.payload
        if before is not None and before.payload == value:
            return  # written again with the same value: no change of the table
        for callback in self._watchers:
            try:
                callback(key, value)
            except Exception:
                log.exception("a watcher of table %r failed", self._name)
