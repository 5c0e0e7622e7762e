"""Retained messages: the last retained message per MQTT topic, kept in a processor table.

The table makes them durable and visible to every node; the in-memory topic tree answers
"which retained topics match this filter" without scanning every retained message. A node's own
topics (`$SYS`, see `sys_topics`) are retained in memory on that node only (`keep_local`).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from mop.clock import now_ms
from mop.message import Message
from mop.processor import Table
from mop.topics import TopicTree

log = logging.getLogger("mop.mqtt")

TABLE = "retained"


@dataclass(frozen=True, slots=True)
class Retained:
    topic: str  # MQTT topic name
    message: Message


class RetainedStore:
    def __init__(self, table: Table) -> None:
        self._table = table
        self._tree = TopicTree()
        self._messages: dict[str, Message] = {}
        self._local: set[str] = set()  # topics this node retains for itself alone
        self.payload_bytes = 0  # of every message kept, the node's own too
        for key, value in table.items():
            self._keep(key, decode_message(value))
        # Other nodes (proxies of a separated deployment) retain and clear messages too.
        table.watch(self._changed_elsewhere)

    def _keep(self, topic: str, message: Message | None) -> None:
        """The in-memory side of a write: the message by topic, and the tree of topics."""
        previous = self._messages.get(topic)
        if previous is not None:
            self.payload_bytes -= len(previous.payload)
        if message is None:
            self._messages.pop(topic, None)
            self._tree.discard(topic)
        else:
            self._messages[topic] = message
            self._tree.add(topic)
            self.payload_bytes += len(message.payload)

    def _changed_elsewhere(self, topic: str, value: bytes | None) -> None:
        if topic in self._local:
            return  # another node's value of a topic each node has its own of
        try:
            message = None if value is None else decode_message(value)
        except (ValueError, KeyError, TypeError):
            log.error("retained message of %r written elsewhere is unreadable; ignoring it", topic)
            return
        self._keep(topic, message)

    def __len__(self) -> int:
        return len(self._messages)

    @property
    def shared(self) -> int:
        """The retained messages of the deployment: the node's own (`keep_local`) apart."""
        return len(self._messages) - sum(1 for topic in self._local if topic in self._messages)

    @property
    def shared_payload_bytes(self) -> int:
        """The payload bytes of the deployment's retained messages (`shared`)."""
        own = (self._messages.get(topic) for topic in self._local)
        return self.payload_bytes - sum(len(message.payload) for message in own if message)

    async def set(self, topic: str, message: Message | None) -> None:
        """Retain `message` for `topic`; None (an empty retained payload) clears it."""
        if message is None and topic not in self._messages:
            return
        await self._table.put(topic, None if message is None else encode_message(message))
        self._keep(topic, message)  # (another node may have cleared it meanwhile)

    def keep_local(self, topic: str, message: Message | None) -> None:
        """Retain `message` for `topic` on this node only (not in the shared table): the
        node's own value, which no other node's write replaces."""
        self._local.add(topic)
        self._keep(topic, message)

    async def clear_shared(self, topic_filter: str) -> None:
        """Delete from the shared table the retained messages of topics matching the filter
        (topics that became node-local; values kept with `keep_local` stay)."""
        for topic in list(self._tree.match_filter(topic_filter)):
            if topic in self._local:
                continue
            await self._table.put(topic, None)
            self._keep(topic, None)

    def get(self, topic: str) -> Message | None:
        """The unexpired retained message of `topic`, if any."""
        message = self._messages.get(topic)
        if message is None or (message.expires_at and message.expires_at <= now_ms()):
            return None
        return message

    def is_local(self, topic: str) -> bool:
        """Whether this node retains `topic` for itself alone (`keep_local`)."""
        return topic in self._local

    def match(self, topic_filter: str) -> Iterator[Retained]:
        """Every unexpired retained message on a topic matching the filter."""
        now = now_ms()
        for topic in list(self._tree.match_filter(topic_filter)):
            message = self._messages[topic]
            if message.expires_at and message.expires_at <= now:
                continue  # expired: no longer delivered; removed on the next write to it
            yield Retained(topic, message)


def encode_message(message: Message) -> bytes:
    return json.dumps(
        {
            "payload": base64.b64encode(message.payload).decode(),
            "properties": [list(pair) for pair in message.properties],
            "key": message.key,
            "producer": message.producer,
            "publish_time": message.publish_time,
            "event_time": message.event_time,
            "qos": message.qos,
            "expires_at": message.expires_at,
        },
        separators=(",", ":"),
    ).encode()


def decode_message(data: bytes) -> Message:
    doc = json.loads(data)
    return Message(
        payload=base64.b64decode(doc["payload"]),
        properties=tuple((k, v) for k, v in doc["properties"]),
        key=doc["key"],
        producer=doc["producer"],
        publish_time=doc["publish_time"],
        event_time=doc["event_time"],
        qos=doc["qos"],
        expires_at=doc["expires_at"],
    )
