"""Topics as the broker holds them: a name, its MQTT form, its last id, the cursors of the
subscriptions attached to it, and what was published to it since the broker loaded it.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

from mop.message import Message, MessageId, PackedBatch
from mop.rates import RateMeter
from mop.topic_names import is_exact_selector, is_system_topic, mqtt_to_pulsar, pulsar_to_mqtt
from mop.topics import TopicTree

if TYPE_CHECKING:
    from mop.broker.cursor import Cursor

__all__ = ["NON_PERSISTENT", "Topic", "Topics", "payload_size"]

NON_PERSISTENT = "non-persistent://"


_payload = attrgetter("payload")
_batch = attrgetter("batch")


def payload_size(message: Message) -> int:
    """The bytes of a message's payload, or of its batch's payloads, as the stats count them."""
    batch = message.batch
    if isinstance(batch, PackedBatch):
        return batch.payload_bytes  # without unpacking a stored batch
    if batch:
        return sum(len(member.payload) for member in batch)
    return len(message.payload)


class Topic:
    """A topic. A non-persistent one (`non-persistent://...`) keeps nothing in storage: its
    ids come from a counter of this process, and only attached consumers see its messages.

    `messages_in` and `bytes_in` count what was published since the broker loaded the topic
    (at `loaded_at`, wall-clock seconds), for its stats; `meter` measures their rates.
    `declared` marks a persistent topic recorded as existing before it held a message (a
    producer opened it), so that it outlives a restart and its subscriptions."""

    __slots__ = (
        "batched",
        "bytes_in",
        "cursors",
        "declared",
        "last_id",
        "loaded_at",
        "messages_in",
        "meter",
        "mqtt",
        "name",
        "persistent",
        "routed_id",
        "trimmed",
    )

    def __init__(self, name: str, mqtt: str, last_id: MessageId | None) -> None:
        self.name = name
        self.mqtt = mqtt
        self.last_id = last_id
        # The last id routing has passed (a QoS >= 1 message once written): every message up
        # to it was offered to the cursors that follow the topic live, so a cursor catching up
        # reads its stored backlog through it and no further; what comes after is routed to
        # it. What a store held when it was opened is written.
        self.routed_id = last_id
        self.persistent = not name.startswith(NON_PERSISTENT)
        # What publish walks: one cursor per attached subscription, kept up to date when
        # subscriptions or selectors change so that a publish never searches for them.
        self.cursors: list[Cursor] = []
        self.trimmed: MessageId | None = None
        self.messages_in = 0
        self.bytes_in = 0
        self.loaded_at = 0.0
        # Whether a batch of messages (an entry of several) was stored or read here: only then
        # do the stats count a backlog's messages one by one rather than by its entries.
        self.batched = False
        self.meter: RateMeter | None = None  # made when the stats are first read
        self.declared = False

    def __repr__(self) -> str:
        return f"Topic({self.name!r})"

    def count_in(self, messages: Sequence[Message]) -> None:
        """Count `messages` as published (a batch entry as its messages and their payloads).
        Iterated in C: no Python call per message."""
        self.messages_in += len(messages)
        self.bytes_in += sum(map(len, map(_payload, messages)))
        if any(map(_batch, messages)):
            self.batched = True
            for message in messages:
                if message.batch:
                    self.messages_in += len(message.batch) - 1
                    self.bytes_in += payload_size(message) - len(message.payload)

    def next_transient_id(self) -> MessageId:
        """The id of the next message of a non-persistent topic."""
        last = self.last_id
        return MessageId(0, 0 if last is None else last.entry + 1)


class Topics:
    """The topics a broker knows, by name and by MQTT name (in a tree, for MQTT filters)."""

    def __init__(self, *, tenant: str, namespace: str) -> None:
        self.tenant = tenant
        self.namespace = namespace
        self._by_name: dict[str, Topic] = {}
        self._by_mqtt: dict[str, Topic] = {}
        self._tree = TopicTree()

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def get(self, name: str) -> Topic | None:
        return self._by_name.get(name)

    def values(self) -> list[Topic]:
        return list(self._by_name.values())

    def add(self, name: str, last_id: MessageId | None) -> Topic:
        mqtt = pulsar_to_mqtt(name, tenant=self.tenant, namespace=self.namespace)
        topic = self._by_name[name] = self._by_mqtt[mqtt] = Topic(name, mqtt, last_id)
        if self.wildcards_reach(name):
            self._tree.add(mqtt)
        return topic

    def wildcards_reach(self, name: str) -> bool:
        """Whether MQTT filters with wildcards may match topic `name`: not a topic of the
        system namespace (the deployment's tables), which only its exact name reaches, as
        `$` topics are reached by no filter starting with a wildcard."""
        return not is_system_topic(name, self.tenant)

    def discard(self, topic: Topic) -> None:
        if self._by_name.get(topic.name) is topic:
            del self._by_name[topic.name]
            del self._by_mqtt[topic.mqtt]
            self._tree.discard(topic.mqtt)

    def name_for(self, selector: str) -> str:
        """The topic an exact selector names, given in MQTT or Pulsar form."""
        return mqtt_to_pulsar(selector, tenant=self.tenant, namespace=self.namespace)

    def filter_for(self, selector: str) -> str:
        """The MQTT filter of a selector: an exact one may name its topic either way."""
        if not is_exact_selector(selector):
            return selector
        return pulsar_to_mqtt(self.name_for(selector), tenant=self.tenant, namespace=self.namespace)

    def matching(self, topic_filter: str) -> list[Topic]:
        """The topics whose MQTT names match an MQTT filter."""
        return [self._by_mqtt[mqtt] for mqtt in self._tree.match_filter(topic_filter)]

    def in_namespace(self, namespace: str) -> list[str]:
        """The names of the topics of `namespace` ("tenant/namespace"), of either domain."""
        return [
            name
            for name in self._by_name
            if "/".join(name.partition("://")[2].split("/", 2)[:2]) == namespace
        ]
