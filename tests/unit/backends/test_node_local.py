"""Node-local (`$SYS`) topics of a separated proxy: recognised by their Pulsar name, delivered
in memory to the consumers that follow them, one consumer per subscription."""

from __future__ import annotations

from mop.backends.node_local import LocalTopics
from mop.message import Delivery, Message
from mop.topic_names import mqtt_to_pulsar

UPTIME = mqtt_to_pulsar("$SYS/broker/uptime")


class Sink:
    def __init__(self) -> None:
        self.got: list[Delivery] = []

    def deliver_local(self, delivery: Delivery) -> None:
        self.got.append(delivery)


def test_only_sys_topics_of_the_namespace_are_local() -> None:
    local = LocalTopics()
    assert local.owns(UPTIME)
    assert local.owns(mqtt_to_pulsar("$SYS"))
    assert not local.owns(mqtt_to_pulsar("$SYSTEM/x"))
    assert not local.owns(mqtt_to_pulsar("a/$SYS"))
    assert not local.owns(mqtt_to_pulsar("$SYS/x", namespace="other"))
    assert LocalTopics(namespace="other").owns(mqtt_to_pulsar("$SYS/x", namespace="other"))


def test_deliveries_follow_the_selectors() -> None:
    local = LocalTopics()
    everything, uptime, other = Sink(), Sink(), Sink()
    local.follow(everything, "a", ["$SYS/#"])
    local.follow(uptime, "b", ["$SYS/broker/uptime", "$SYS/broker/+"])
    local.follow(other, "c", ["$SYS/other/#"])
    result = local.publish(UPTIME, Message(b"1 seconds"))
    assert result.subscriptions == 2
    assert [d.message.payload for d in everything.got] == [b"1 seconds"]
    assert [d.topic for d in uptime.got] == [UPTIME]  # once, though two selectors match
    assert other.got == []
    local.follow(everything, "a", ())
    local.publish(UPTIME, Message(b"2 seconds"))
    assert len(everything.got) == 1 and len(uptime.got) == 2


def test_consumers_of_one_subscription_take_turns() -> None:
    local = LocalTopics()
    members = [Sink(), Sink()]
    for member in members:
        local.follow(member, "$share/g/$SYS/#", ["$SYS/#"])
    for index in range(4):
        local.publish(UPTIME, Message(b"%d" % index))
    assert [len(m.got) for m in members] == [2, 2]
