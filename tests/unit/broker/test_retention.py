"""Retention of acknowledged history (`mop.retention`): kept by time and size per namespace,
never at the cost of a backlog, changed at run time and kept across a restart."""

from __future__ import annotations

import pytest

from mop.broker import Broker
from mop.broker.storage import MemoryStorage
from mop.message import MessageId
from mop.messaging import StartPosition
from mop.retention import NO_RETENTION, RetentionPolicies, RetentionPolicy
from mop.topic_names import namespace_of, table_topic

from .support import Clock, msg, payloads, subscribe, take_all, topic

DAY = RetentionPolicy(86400, -1)


def broker_with(
    policies: RetentionPolicies, storage: MemoryStorage | None = None
) -> tuple[Broker, MemoryStorage, Clock]:
    clock = Clock()
    storage = storage or MemoryStorage()
    storage.clock = lambda: clock.now / 1000
    broker = Broker(storage, clock=clock, retention=policies, retention_check=5.0)
    return broker, storage, clock


async def history(broker: Broker, name: str) -> list[str]:
    """What a new subscription from the earliest message reads of topic `name`."""
    att = await subscribe(
        broker, f"reader-{name}", [name], start=StartPosition.EARLIEST, durable=False
    )
    read = payloads(take_all(broker, att))
    broker.close(att)
    return read


def test_policies_resolve_override_then_settings_then_default() -> None:
    policies = RetentionPolicies(DAY, {"public/short": RetentionPolicy(60, -1)})
    assert policies.for_topic("persistent://public/default/a") == DAY
    assert policies.for_topic("persistent://public/short/a%2Fb") == RetentionPolicy(60, -1)
    policies.override("public/short", RetentionPolicy(-1, 1024))
    assert policies.for_namespace("public/short") == RetentionPolicy(-1, 1024)
    policies.override("public/short", None)
    assert policies.for_namespace("public/short") == RetentionPolicy(60, -1)
    # The system namespace's tables hold its state: its log keeps nothing acknowledged.
    assert policies.for_topic(table_topic("public", "default", "retained")) == NO_RETENTION
    assert namespace_of("non-persistent://t/n/x") == "t/n"
    with pytest.raises(ValueError, match="-1"):
        RetentionPolicy(-2, 0)


async def test_a_topic_without_subscriptions_keeps_its_history_for_the_time_limit() -> None:
    broker, storage, clock = broker_with(RetentionPolicies(RetentionPolicy(60, -1)))
    await broker.publish(topic("t"), msg("old"))
    clock.now += 30_000
    await broker.publish(topic("t"), msg("new"))
    broker.trim_acknowledged(now=0.0)
    assert await history(broker, topic("t")) == ["old", "new"]
    clock.now += 40_000  # "old" is 70 s old, "new" 40 s
    broker.trim_acknowledged(now=10.0)
    assert await history(broker, topic("t")) == ["new"]
    clock.now += 30_000
    broker.trim_acknowledged(now=20.0)
    assert storage.stats().messages == 0
    # Trimmed idle topics are not looked at again for nothing.
    assert not broker._history


async def test_acknowledged_messages_stay_until_the_size_limit_and_backlogs_always() -> None:
    size = len(b"m00")
    broker, storage, _ = broker_with(RetentionPolicies(RetentionPolicy(-1, 4 * size)))
    slow = await subscribe(broker, "slow", ["t"])
    fast = await subscribe(broker, "fast", ["t"])
    for n in range(6):
        await broker.publish(topic("t"), msg(f"m{n:02d}"))
    broker.ack(fast, take_all(broker, fast))
    broker.trim_acknowledged(now=0.0)
    # Over the size, but "slow" acknowledged nothing: its backlog stays whole.
    assert storage.stats().messages == 6
    broker.ack(slow, take_all(broker, slow)[:5])
    broker.trim_acknowledged(now=1.0)
    # The 4 newest stay (one of them still owed to "slow"); the oldest acknowledged went.
    assert await history(broker, topic("t")) == ["m02", "m03", "m04", "m05"]


async def test_no_retention_trims_on_acknowledgement_and_infinite_keeps_all() -> None:
    policies = RetentionPolicies(NO_RETENTION, {"public/archive": RetentionPolicy(-1, -1)})
    broker, _, clock = broker_with(policies)
    await broker.publish(topic("gone"), msg("1"))
    await broker.publish("persistent://public/archive/kept", msg("2"))
    clock.now += 10**9
    broker.trim_acknowledged(now=0.0)
    assert await history(broker, topic("gone")) == []
    assert await history(broker, "persistent://public/archive/kept") == ["2"]


async def test_a_run_time_override_applies_at_once_and_survives_a_restart() -> None:
    broker, storage, _ = broker_with(RetentionPolicies(DAY))
    await broker.recover()
    await broker.publish(topic("t"), msg("1"))
    broker.trim_acknowledged(now=0.0)
    assert storage.stats().messages == 1
    await broker.set_retention("public/default", NO_RETENTION)
    broker.trim_acknowledged(now=1.0)
    assert storage.stats().messages == 0
    again, _, _ = broker_with(RetentionPolicies(DAY), storage)
    await again.recover()
    assert again.retention.for_namespace("public/default") == NO_RETENTION
    await again.set_retention("public/default", None)
    assert again.retention.for_namespace("public/default") == DAY


class CountingStorage(MemoryStorage):
    """Counts the topics a trimming pass looks at (one retention cut each)."""

    def __init__(self) -> None:
        super().__init__()
        self.cuts: list[str] = []

    def retention_cut(
        self, topic: str, *, appended_before: int | None, keep_bytes: int | None
    ) -> MessageId | None:
        self.cuts.append(topic)
        return super().retention_cut(topic, appended_before=appended_before, keep_bytes=keep_bytes)


async def test_passes_look_only_at_topics_whose_history_may_have_aged_out() -> None:
    policies = RetentionPolicies(
        RetentionPolicy(-1, 1024), {"public/aging": RetentionPolicy(60, -1)}
    )
    storage = CountingStorage()
    broker, _, clock = broker_with(policies, storage)
    sized = [topic(f"s{n}") for n in range(20)]
    aging = "persistent://public/aging/a"
    for name in [*sized, aging]:
        await broker.publish(name, msg("kept"))
    broker.trim_acknowledged(now=0.0)
    assert len(storage.cuts) == 21
    # Idle topics under a size limit only are not looked at again however long it is...
    storage.cuts.clear()
    for step in range(1, 8):
        clock.now += 10_000
        broker.trim_acknowledged(now=10.0 * step)
    assert storage.cuts == [aging]  # ...the time-limited one once its message is 60 s old
    assert await history(broker, aging) == []
    broker.trim_acknowledged(now=75.0)  # the reader's visit
    # An append to a size-limited topic makes it looked at again.
    storage.cuts.clear()
    await broker.publish(sized[0], msg("more"))
    broker.trim_acknowledged(now=80.0)
    assert storage.cuts == [sized[0]]
