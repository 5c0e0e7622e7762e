"""Retention and backlog-quota cuts of a topic's index (`TopicIndex.expired_through` and
`over_through`), found by bisection: the same answers as a walk over every kept message,
across runs, trimmed prefixes (compacted arrays), voided tails and a clock that stepped back."""

from __future__ import annotations

import random

from mop.broker.storage.index import LogIndex, Run, TopicIndex
from mop.message import MessageId


def walk_expired(kept: list[tuple[MessageId, int, int]], cutoff: int) -> MessageId | None:
    last = None
    for message_id, _, seconds in kept:
        if seconds >= cutoff:
            break
        last = message_id
    return last


def walk_over(kept: list[tuple[MessageId, int, int]], limit: int) -> MessageId | None:
    excess, last = sum(size for _, size, _ in kept) - limit, None
    for message_id, size, _ in kept:
        if excess <= 0:
            break
        excess -= size
        last = message_id
    return last


def kept_of(topic: TopicIndex) -> list[tuple[MessageId, int, int]]:
    return [
        (MessageId(run.ledger, run.first + i), run.sizes[i], run.times[i])
        for run in topic.runs
        for i in range(run.head, len(run.sizes))
    ]


def test_cuts_match_a_walk_over_every_message() -> None:
    rng = random.Random(7)
    index = LogIndex()
    index.add_segment(0)
    topic = TopicIndex("t")
    seconds, position = 100_000, 0
    for ledger in range(3):
        run = Run(ledger, 0)
        topic.runs.append(run)
        for _ in range(3000):
            seconds += rng.choice((0, 1, 2, 3, -5))  # the clock may step back
            size = rng.randint(1, 500)
            if rng.random() < 0.1:
                sizes = [rng.randint(1, 500) for _ in range(rng.randint(2, 20))]
                positions = list(range(position, position + len(sizes)))
                index.add_messages(topic, run, positions, sizes, seconds)
                position += len(sizes)
            else:
                index.add_message(topic, run, position, size, seconds)
                position += 1
    run = topic.runs[1]
    index.void_messages(topic, run, 2500, 2700)  # a tail that was never written
    for step in range(40):
        kept = kept_of(topic)
        assert topic.bytes == sum(size for _, size, _ in kept)
        times = [t for _, _, t in kept]
        for cutoff in (times[0], times[len(times) // 2], times[-1] + 1, 0):
            assert topic.expired_through(cutoff) == walk_expired(kept, cutoff)
        for limit in (0, 1, topic.bytes // 3, topic.bytes - 1, topic.bytes, topic.bytes + 5):
            assert topic.over_through(limit) == walk_over(kept, limit)
        # Trim a little (past 1024 entries the arrays drop their prefix).
        index.trim_topic(topic, kept[min(len(kept) - 1, rng.randint(50, 400))][0])
        if not topic.count or step == 39:
            break
