"""Backlog quotas (`mop.backlog_quota`): producers refused or held while a topic's
unacknowledged backlog is over a limit, the slowest subscriptions skipped by eviction, the
system namespace exempt, and run-time overrides kept across a restart."""

from __future__ import annotations

import pytest

from mop.backlog_quota import BacklogQuota, BacklogQuotas, QuotaKind, QuotaPolicy
from mop.broker import Broker
from mop.broker.quotas import BacklogQuotaExceeded, BacklogQuotaHold
from mop.broker.storage import MemoryStorage
from mop.messaging import StartPosition
from mop.topic_names import table_topic

from .support import Clock, msg, payloads, subscribe, take_all, topic

SIZE = len(b"m00")


def broker_with(
    quotas: BacklogQuotas, storage: MemoryStorage | None = None
) -> tuple[Broker, Clock]:
    clock = Clock()
    storage = storage or MemoryStorage()
    storage.clock = lambda: clock.now / 1000
    return Broker(storage, clock=clock, backlog_quotas=quotas), clock


def size_quota(policy: QuotaPolicy, messages: int = 3) -> BacklogQuotas:
    return BacklogQuotas({QuotaKind.SIZE: BacklogQuota(messages * SIZE, policy)})


async def fill(broker: Broker, count: int, name: str = "t") -> None:
    for n in range(count):
        await broker.publish(topic(name), msg(f"m{n:02d}"))


async def test_producer_exception_refuses_until_the_backlog_shrinks() -> None:
    broker, _ = broker_with(size_quota(QuotaPolicy.PRODUCER_EXCEPTION))
    slow = await subscribe(broker, "slow", ["t"])
    await fill(broker, 3)
    broker.trim_acknowledged()
    await broker.publish(topic("t"), msg("m03"))  # the check runs on trimming passes
    broker.trim_acknowledged()
    with pytest.raises(BacklogQuotaExceeded):
        await broker.publish(topic("t"), msg("refused"))
    with pytest.raises(BacklogQuotaExceeded):
        broker.store_many(topic("t"), [msg("refused")])
    await broker.publish(topic("other"), msg("fine"))  # other topics are not concerned
    broker.ack(slow, take_all(broker, slow)[:2])
    broker.trim_acknowledged()
    await broker.publish(topic("t"), msg("m04"))


async def test_producer_request_hold_refuses_until_there_is_room() -> None:
    broker, _ = broker_with(size_quota(QuotaPolicy.PRODUCER_REQUEST_HOLD))
    slow = await subscribe(broker, "slow", ["t"])
    await fill(broker, 4)
    broker.trim_acknowledged()
    with pytest.raises(BacklogQuotaHold):
        broker.store(topic("t"), msg("held"))
    broker.store(topic("other"), msg("fine"))  # only the topic over its quota is held
    broker.ack(slow, take_all(broker, slow))
    broker.trim_acknowledged()
    broker.store(topic("t"), msg("m04"))


async def test_eviction_skips_the_oldest_backlog_of_the_slowest_subscription() -> None:
    broker, _ = broker_with(size_quota(QuotaPolicy.CONSUMER_BACKLOG_EVICTION))
    slow = await subscribe(broker, "slow", ["t"])
    fast = await subscribe(broker, "fast", ["t"])
    await fill(broker, 6)
    broker.ack(fast, take_all(broker, fast))
    broker.trim_acknowledged()
    # "slow" keeps 90% of the limit (the newest 2 messages' worth), as in Pulsar, so the
    # next message does not evict again at once.
    assert payloads(take_all(broker, slow)) == ["m04", "m05"]
    await broker.publish(topic("t"), msg("m06"))  # producers are never refused
    broker.trim_acknowledged()
    assert payloads(take_all(broker, slow)) == ["m06"]


@pytest.mark.parametrize(
    "policy", [QuotaPolicy.PRODUCER_EXCEPTION, QuotaPolicy.CONSUMER_BACKLOG_EVICTION]
)
async def test_readers_are_no_backlog(policy: QuotaPolicy) -> None:
    # A reader (non-durable) at the earliest kept message of a topic with history: the
    # history is what it came to read, not a backlog that blocks producers or gets skipped.
    broker, _ = broker_with(size_quota(policy))
    await fill(broker, 6)
    reader = await subscribe(broker, "reader", ["t"], durable=False, start=StartPosition.EARLIEST)
    broker.trim_acknowledged()
    await broker.publish(topic("t"), msg("m06"))
    broker.trim_acknowledged()
    await broker.publish(topic("t"), msg("m07"))
    assert payloads(take_all(broker, reader)) == [f"m{n:02d}" for n in range(8)]


async def test_age_quota() -> None:
    quotas = BacklogQuotas({QuotaKind.AGE: BacklogQuota(60, QuotaPolicy.PRODUCER_EXCEPTION)})
    broker, clock = broker_with(quotas)
    await subscribe(broker, "slow", ["t"])
    await fill(broker, 1)
    broker.trim_acknowledged()
    await broker.publish(topic("t"), msg("young enough"))
    clock.now += 120_000
    broker.trim_acknowledged()
    with pytest.raises(BacklogQuotaExceeded):
        await broker.publish(topic("t"), msg("refused"))


async def test_the_system_namespace_and_unsubscribed_topics_have_no_quota() -> None:
    quotas = BacklogQuotas({QuotaKind.SIZE: BacklogQuota(0, QuotaPolicy.PRODUCER_EXCEPTION)})
    broker, _ = broker_with(quotas)
    table = table_topic("public", "default", "retained")
    att = await subscribe(broker, "tables", [table])
    await broker.publish(table, msg("k", key="k"))
    await fill(broker, 3)  # no subscription: no backlog
    broker.trim_acknowledged()
    await broker.publish(table, msg("k2", key="k2"))
    await fill(broker, 1)
    broker.close(att)


async def test_overrides_apply_per_namespace_and_survive_a_restart() -> None:
    storage = MemoryStorage()
    broker, _ = broker_with(BacklogQuotas(), storage)
    await broker.recover()
    quota = BacklogQuota(SIZE, QuotaPolicy.PRODUCER_EXCEPTION)
    await broker.set_backlog_quota("public/default", QuotaKind.SIZE, quota)
    assert broker.quota.quotas.for_namespace("public/default") == {QuotaKind.SIZE: quota}
    assert broker.quota.quotas.for_namespace("public/other") == {}
    again, _ = broker_with(BacklogQuotas(), storage)
    await again.recover()
    assert again.quota.quotas.for_namespace("public/default") == {QuotaKind.SIZE: quota}
    await again.set_backlog_quota("public/default", QuotaKind.SIZE, None)
    assert again.quota.quotas.for_namespace("public/default") == {}
    assert not again.quota.quotas.any


class FailingSync(MemoryStorage):
    async def sync(self) -> None:
        raise OSError("disk gone")


async def test_an_override_applies_only_once_it_is_durable() -> None:
    broker, _ = broker_with(BacklogQuotas(), FailingSync())
    quota = BacklogQuota(SIZE, QuotaPolicy.PRODUCER_EXCEPTION)
    with pytest.raises(OSError):
        await broker.set_backlog_quota("public/default", QuotaKind.SIZE, quota)
    assert broker.quota.quotas.for_namespace("public/default") == {}
