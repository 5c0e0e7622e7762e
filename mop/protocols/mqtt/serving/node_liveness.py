"""Which nodes of a separated deployment are alive, for the sessions connected through them.

A proxy that dies takes its connections with it, but the table still records their sessions
as connected (through that proxy), and nothing else would end them: their wills would never go
out and their sessions never expire. So every proxy writes a heartbeat, a record under its node
id in the `NODES_TABLE` table, every `heartbeat_interval(timeout)`; it deletes the record when
it stops. The holder of the session-timer role watches the heartbeats through its table reader
and, once a node has written none for `timeout` seconds by its own clock, takes that node for
dead: the sessions recorded as connected through it go offline from that moment (see
`SessionRegistry`), and its heartbeat record is deleted.

Judged by the holder's clock alone (the time since it last saw a heartbeat arrive), so the
nodes' wall clocks need not agree. A node cut off from the brokers for longer than `timeout`
is taken for dead as well, with its clients still connected: when it sees its heartbeat record
deleted by someone else it records its sessions as connected again, which stops their timers on
the holder; a will without delay, or the end of a session without expiry, may have happened
meanwhile. A stopping node's goodbye (its record deleted) starts a last `timeout` for it, so
that the releases of its last connections arrive first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final

import trio

from mop.clock import now_ms
from mop.processor import BackendError
from mop.processor.backend import Table

log = logging.getLogger("mop.mqtt")

NODES_TABLE: Final = "mqtt-nodes"
# The shortest heartbeat interval, whatever the timeout (a record a second per node at most
# five times over).
MIN_HEARTBEAT: Final = 0.2
# How long a stopping node tries to delete its heartbeat record.
GOODBYE_TIMEOUT: Final = 2.0


def heartbeat_interval(timeout: float) -> float:
    """Five heartbeats per timeout: a node is taken for dead only after several are lost."""
    return max(MIN_HEARTBEAT, timeout / 5)


class NodeLiveness:
    """This node's heartbeat, and (on the holder of the session-timer role) the other nodes'
    as seen arriving through the table."""

    def __init__(
        self, table: Table, node_id: str, timeout: float, on_declared_dead: Callable[[], None]
    ) -> None:
        self.node_id = node_id
        self.timeout = timeout
        self._table = table
        self._on_declared_dead = on_declared_dead
        # When each other node's latest heartbeat (or write of a session) arrived, trio clock.
        self._last_seen: dict[str, float] = {}
        # When this node began to watch; a node never seen since counts as seen then.
        self._since = 0.0
        self._beat_now = trio.Event()
        table.watch(self._written_elsewhere)

    async def beat(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write this node's heartbeat until cancelled, then delete it."""
        interval = heartbeat_interval(self.timeout)
        task_status.started()
        failing = False
        try:
            while True:
                try:
                    await self._table.put(self.node_id, str(now_ms()).encode())
                    if failing:
                        log.info("node %s: heartbeats are written again", self.node_id)
                    failing = False
                except BackendError as exc:
                    if not failing:
                        log.warning("node %s: heartbeat not written: %s", self.node_id, exc)
                    failing = True
                with trio.move_on_after(interval):
                    await self._beat_now.wait()
                self._beat_now = trio.Event()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(GOODBYE_TIMEOUT):
                try:
                    await self._table.put(self.node_id, None)
                except BackendError as exc:
                    log.warning("node %s: heartbeat record not deleted: %s", self.node_id, exc)

    def _written_elsewhere(self, node_id: str, value: bytes | None) -> None:
        if node_id == self.node_id:
            if value is None:
                # Another node took this one for dead: say otherwise at once.
                self._beat_now.set()
                self._on_declared_dead()
            return
        # A heartbeat, or a goodbye: either way the node was there just now.
        self._last_seen[node_id] = trio.current_time()

    def saw(self, node_id: str) -> None:
        """`node_id` wrote something else (a session): it was alive just now."""
        if node_id != self.node_id:
            self._last_seen[node_id] = trio.current_time()

    def start_watching(self) -> None:
        """Begin judging the other nodes: every node known now gets a whole timeout."""
        now = self._since = trio.current_time()
        for node_id, _ in self._table.items():
            if node_id != self.node_id:
                self._last_seen[node_id] = now

    def silent(self, referenced: Iterable[str]) -> list[str]:
        """The nodes (of those with a heartbeat record and those in `referenced`) that have
        been silent for longer than the timeout."""
        now = trio.current_time()
        nodes = set(self._last_seen).union(referenced)
        nodes.discard(self.node_id)
        return sorted(
            node_id
            for node_id in nodes
            if now - self._last_seen.get(node_id, self._since) > self.timeout
        )

    async def forget(self, node_id: str) -> None:
        """Stop following a node taken for dead, and delete its heartbeat record (which also
        tells the node, should it be alive after all)."""
        self._last_seen.pop(node_id, None)
        if self._table.get(node_id) is not None:
            try:
                await self._table.put(node_id, None)
            except BackendError as exc:
                log.warning("heartbeat record of node %s not deleted: %s", node_id, exc)
