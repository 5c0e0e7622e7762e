"""Declaring the partitioned topics of `pulsar.partitioned_topics` at start: each is created
when missing and grown when it has fewer partitions (never shrunk). Several nodes may declare
the same topic at once (a deployment starts two separated proxies together): the one that
loses the race reads the count again and is content with any count at least its own."""

from __future__ import annotations

import logging
from typing import Final

import trio

from mop.messaging import BackendError
from mop.partitioned import PartitionedTopics

__all__ = ["RETRY_DELAYS", "declare_count", "declare_until_done"]

log = logging.getLogger(__name__)

# Why a declaration may succeed when asked again: a racing declaration, or brokers that are
# not there yet (a proxy may start before them).
_RACED: Final = frozenset({"already_exists", "fewer_partitions", "not_found"})
_NOT_YET: Final = frozenset({"unavailable", "closed", "timeout"})
# Seconds between the attempts of a declaration in the background, the last one repeated.
RETRY_DELAYS: Final = (1.0, 2.0, 5.0, 10.0, 30.0)
_RACE_ATTEMPTS: Final = 3


async def declare_count(partitioned: PartitionedTopics, topic: str, count: int) -> None:
    """Give `topic` at least `count` partitions. A change refused because another node changed
    the topic meanwhile is settled by reading the count again: at least `count` is fine.
    BackendError when the change cannot be made."""
    for attempt in range(_RACE_ATTEMPTS):
        current = await partitioned.partitions(topic)
        if current > count:
            log.warning(
                "pulsar.partitioned_topics: %s has %d partitions, more than %d: kept",
                topic,
                current,
                count,
            )
            return
        if current == count:
            return
        try:
            if current:
                await partitioned.grow(topic, count)
            else:
                await partitioned.create(topic, count)
            return
        except BackendError as exc:
            if exc.reason not in _RACED or attempt == _RACE_ATTEMPTS - 1:
                raise


async def declare_until_done(
    partitioned: PartitionedTopics,
    declared: dict[str, int],
    *,
    delays: tuple[float, ...] = RETRY_DELAYS,
) -> None:
    """Declare every topic of `declared` (full name -> count), asking again while the brokers
    cannot answer: a proxy starts (and serves) without waiting for them. A refusal that asking
    again cannot change is logged and that topic left as it is."""
    pending = dict(declared)
    attempt = 0
    while pending:
        for topic, count in list(pending.items()):
            try:
                await declare_count(partitioned, topic, count)
            except BackendError as exc:
                if exc.reason in _NOT_YET:
                    continue
                log.error("pulsar.partitioned_topics: %s: %s (not declared)", topic, exc)
            else:
                log.info("pulsar.partitioned_topics: %s has at least %d partitions", topic, count)
            del pending[topic]
        if pending:
            delay = delays[min(attempt, len(delays) - 1)]
            log.warning(
                "pulsar.partitioned_topics: %s not declared yet (the brokers cannot answer);"
                " asking again in %g s",
                ", ".join(sorted(pending)),
                delay,
            )
            attempt += 1
            await trio.sleep(delay)
