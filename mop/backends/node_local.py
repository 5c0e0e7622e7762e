"""Node-local topics: `$SYS/...`, which each node publishes about itself, in both modes.

An MQTT broker's `$SYS` describes the server a client is connected to (DESIGN.md section 4:
served by the node itself). Proxies share the brokers' topics, so `$SYS` sent through them
would interleave every proxy's values in one topic. Both backends keep these topics to the node
instead: a publish reaches this process's consumers at once, in memory, and is never stored
nor sent to a broker, so a client sees under `$SYS/...` what the node it is connected to says,
in merged mode and through a separated proxy alike. (The MQTT retained store keeps `$SYS`
values in memory on each node too, see `mop.protocols.mqtt.serving.sys_topics`.) Nothing is
kept per topic either: client events (`$SYS/brokers/{node}/clients/{clientid}/...`) name a
topic per client id, which a broker would keep, with its storage, for every client that ever
connected. Like any `$SYS` message they are notifications: a consumer that is not connected,
or whose buffer is full, misses them.

Node-specific Pulsar topics (the node's id in the name) were the alternative: they would let a
Pulsar application read every proxy's numbers, but would turn each statistic of each proxy into
a durable topic, route every update through a broker and back, and make `$SYS/#` a wildcard that
the topic poller must follow; per-proxy numbers are what each proxy's metrics endpoint is for.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable
from typing import Final, Protocol

from mop.message import Delivery, Message, MessageId
from mop.processor.backend import PublishResult
from mop.topic_names import FULL_NAME_SCHEMES, mqtt_to_pulsar, pulsar_to_mqtt
from mop.topics import SubscriptionTrie

__all__ = [
    "LOCAL_ROOT",
    "LocalSink",
    "LocalTopics",
    "is_local",
    "is_local_selector",
    "local_selectors",
]

# The first level of the MQTT topics a node describes itself under (DESIGN.md section 4).
LOCAL_ROOT: Final = "$SYS"


def is_local(mqtt_topic: str) -> bool:
    """Whether an MQTT topic name or filter is node-local (`$SYS` or below it)."""
    return mqtt_topic.partition("/")[0] == LOCAL_ROOT


def _mqtt_form(selector: str, tenant: str, namespace: str) -> str:
    # An exact selector may name its topic in Pulsar form.
    if selector.startswith(FULL_NAME_SCHEMES):
        return pulsar_to_mqtt(selector, tenant=tenant, namespace=namespace)
    return selector


def is_local_selector(selector: str, *, tenant: str = "public", namespace: str = "default") -> bool:
    """Whether a consumer's selector (an MQTT name or filter, or a Pulsar name) is node-local."""
    return is_local(_mqtt_form(selector, tenant, namespace))


def local_selectors(
    selectors: Iterable[str], *, tenant: str = "public", namespace: str = "default"
) -> frozenset[str]:
    """The node-local ones among a consumer's `selectors`, as MQTT names and filters."""
    forms = (_mqtt_form(selector, tenant, namespace) for selector in selectors)
    return frozenset(form for form in forms if is_local(form))


class LocalSink(Protocol):
    """A consumer that takes node-local deliveries (it may drop them when it is full)."""

    def deliver_local(self, delivery: Delivery) -> None: ...


class LocalTopics:
    """The node-local topics of one proxy and the consumers that follow them."""

    def __init__(self, *, tenant: str = "public", namespace: str = "default") -> None:
        self._tenant = tenant
        self._namespace = namespace
        # The Pulsar names of `$SYS` and of the topics below it start with these.
        self._root = mqtt_to_pulsar(LOCAL_ROOT, tenant=tenant, namespace=namespace)
        self._below = mqtt_to_pulsar(f"{LOCAL_ROOT}/", tenant=tenant, namespace=namespace)
        self._trie: SubscriptionTrie[int, LocalSink] = SubscriptionTrie()
        self._followers: dict[int, tuple[str, frozenset[str]]] = {}  # sink -> (name, filters)
        self._turns: dict[str, int] = {}  # subscription name -> deliveries so far
        self._members: Counter[str] = Counter()  # subscription name -> its sinks here
        self._sequence = itertools.count()

    def owns(self, topic: str) -> bool:
        """Whether `topic` (a full Pulsar name) is node-local."""
        return topic == self._root or topic.startswith(self._below)

    def follow(self, sink: LocalSink, subscription: str, selectors: Iterable[str]) -> None:
        """Deliver to `sink`, a consumer of `subscription`, what matches `selectors` (MQTT
        names and filters under `$SYS`); no selector at all ends it."""
        key = id(sink)
        _, before = self._followers.get(key, (subscription, frozenset()))
        selectors = frozenset(selectors)
        for selector in before - selectors:
            self._trie.remove(selector, key)
        for selector in selectors - before:
            self._trie.add(selector, key, sink)
        if selectors:
            if key not in self._followers:
                self._members[subscription] += 1
            self._followers[key] = (subscription, selectors)
        elif self._followers.pop(key, None) is not None:
            self._members[subscription] -= 1
            if not self._members[subscription]:
                del self._members[subscription]
                self._turns.pop(subscription, None)

    def publish(self, topic: str, message: Message) -> PublishResult:
        """Hand `message` to one consumer of each subscription that follows `topic`."""
        message_id = MessageId(0, next(self._sequence))
        mqtt = pulsar_to_mqtt(topic, tenant=self._tenant, namespace=self._namespace)
        groups: dict[str, dict[int, LocalSink]] = {}
        for _selector, key, sink in self._trie.match(mqtt):
            groups.setdefault(self._followers[key][0], {})[key] = sink
        for subscription, sinks in groups.items():
            # Consumers of one subscription (a shared group) take turns, as on a broker.
            turn = self._turns.get(subscription, 0)
            self._turns[subscription] = turn + 1
            chosen = list(sinks.values())[turn % len(sinks)]
            chosen.deliver_local(Delivery(topic, message_id, message))
        return PublishResult(message_id, len(groups))
