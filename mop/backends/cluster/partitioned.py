"""`ClusterPartitionedTopics`: a separated proxy's view of the brokers' partitioned topics. The
count is the brokers' answer to PARTITIONED_METADATA (asked through the proxy's Pulsar client,
so Apache Pulsar answers as well as mop brokers); changes go to the brokers' HTTP admin, at
Pulsar's own paths (`.../{topic}/partitions`), through `cluster.admin_url`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import httpx

from mop.backends.cluster.topic_admin import BrokerAdmin, answer_reason
from mop.messaging import BackendError, TopicBusy
from mop.partitioned import (
    PartitionsExist,
    PartitionsRefused,
    check_count,
    partitions_of,
)
from mop.topic_names import namespace_of

__all__ = ["ClusterPartitionedTopics", "MemberAdmin"]

_EXISTS: Final = 409
_BUSY: Final = 412
_FEWER: Final = 422  # Pulsar's answer to a count that is not more than there are


class ClusterPartitionedTopics:
    """See `mop.partitioned.PartitionedTopics`. `count` asks the brokers' metadata of a topic,
    `admin` gives the brokers' HTTP admin (BackendError when none is configured), `topics`
    lists a namespace and `delete_topic` deletes one ordinary topic, as the backend does."""

    def __init__(
        self,
        count: Callable[[str], Awaitable[int]],
        admin: Callable[[], BrokerAdmin],
        topics: Callable[[str], Awaitable[list[str]]],
        delete_topic: Callable[[str, bool], Awaitable[bool]],
    ) -> None:
        self._count = count
        self._admin = admin
        self._topics = topics
        self._delete_topic = delete_topic

    async def partitions(self, topic: str) -> int:
        return await self._count(topic)

    async def create(self, topic: str, count: int) -> None:
        check_count(topic, count)
        response = await self._admin().partitions("PUT", topic, count=count)
        _check(topic, response)

    async def grow(self, topic: str, count: int) -> None:
        check_count(topic, count)
        response = await self._admin().partitions("POST", topic, count=count)
        if response is None:
            raise BackendError(f"partitioned topic {topic} does not exist", reason="not_found")
        _check(topic, response)

    async def delete(self, topic: str, *, force: bool = False) -> bool:
        count = await self._count(topic)
        if not count:
            return False
        partitions = partitions_of(topic, count)
        try:
            listed = set(await self._topics(namespace_of(topic)))
            existing = [partition for partition in partitions if partition in listed]
        except BackendError:
            existing = partitions  # brokers that cannot list: each partition is asked
        if not force:
            # Every partition idle first: a busy one refuses the delete before the metadata
            # or any partition is gone, so it can be asked again.
            admin = self._admin()
            for partition in existing:
                stats = await admin.stats(partition)
                if stats is not None and (stats.consumers or stats.producers):
                    raise TopicBusy(f"{topic}: partition {partition} has consumers or producers")
        params = {"force": "true"} if force else {}
        response = await self._admin().partitions("DELETE", topic, params=params)
        if response is not None:
            _check(topic, response)
        # In a mop broker cluster the partitions live on several members, and the member
        # that keeps the metadata deletes only its own: each of the others is deleted at
        # its owner (Apache Pulsar has deleted them all already: none is left then).
        for partition in existing:
            await self._delete_topic(partition, force)
        return True

    async def names(self, namespace: str, domain: str = "persistent") -> list[str]:
        return await self._admin().partitioned(namespace, domain)


class MemberAdmin:
    """`mop.partitioned.OtherMembers` through the members' HTTP admin (`cluster.admin_url` of
    a mop broker cluster's members): each question goes to the member that owns the topic
    (the others answer 421, and the next URL is asked)."""

    def __init__(self, admin: BrokerAdmin) -> None:
        self._admin = admin

    async def in_use(self, topic: str) -> bool:
        stats = await self._admin.stats(topic)
        return stats is not None and bool(stats.consumers or stats.producers)

    async def delete(self, topic: str, *, force: bool) -> bool:
        return await self._admin.delete(topic, force=force)

    async def aclose(self) -> None:
        await self._admin.aclose()


def _check(topic: str, response: httpx.Response | None) -> None:
    """Raise what a refusal of the brokers' admin means."""
    if response is None or response.status_code in (200, 204):
        return
    status, why = response.status_code, answer_reason(response)
    if status == _EXISTS:
        raise PartitionsExist(f"{topic}: {why}")
    if status == _BUSY:
        raise TopicBusy(f"{topic}: {why}")
    reason = "fewer_partitions" if status == _FEWER else "invalid_partitions"
    raise PartitionsRefused(f"{topic}: {why} (HTTP {status})", reason=reason)
