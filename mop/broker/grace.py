"""The grace of unsubscribed data: a topic that no subscription holds, or a new topic, keeps
what is written to it for a few seconds before trimming takes it.

Consumers that find topics by polling (Pulsar pattern consumers, the proxy tier's wildcard
subscriptions) subscribe to a new topic from its earliest message a moment after it appears;
without a grace the broker would already have dropped what was published in that moment.
"""

from __future__ import annotations

from collections import deque

from mop.broker.topic import Topic
from mop.message import MessageId

__all__ = ["UnsubscribedGrace"]


class UnsubscribedGrace:
    """Holds trimming of unsubscribed topics back by `seconds` (0: no grace).

    Each trimming pass notes, per topic, the last id it saw and when; data may go only up to
    the last id noted at least `seconds` ago, so everything stays for `seconds` at least (and
    one trimming interval at most on top). The caller supplies a monotonic clock in seconds.
    """

    __slots__ = ("_born", "_marks", "seconds")

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self._marks: dict[Topic, deque[tuple[float, MessageId]]] = {}
        # When trimming first looked at each topic: a young topic keeps its data for
        # `seconds` even when subscriptions acknowledge it, because consumers that poll for
        # new topics (wildcard subscriptions of other proxies) arrive up to a poll later.
        self._born: dict[Topic, float] = {}

    def limit_held(self, topic: Topic, through: MessageId | None, now: float) -> MessageId | None:
        """Like `limit`, for a topic that subscriptions hold: only while it is young."""
        if self.seconds <= 0:
            return through
        born = self._born.setdefault(topic, now)
        if now - born >= self.seconds:
            self._marks.pop(topic, None)
            return through
        return self.limit(topic, through, now)

    def limit(self, topic: Topic, through: MessageId | None, now: float) -> MessageId | None:
        """How far `topic`, held by no subscription and trimmable through `through`, may be
        trimmed at `now` (None: not at all yet)."""
        if self.seconds <= 0:
            return through
        marks = self._marks.get(topic)
        if through is not None and (marks is None or marks[-1][1] != through):
            if marks is None:
                marks = self._marks[topic] = deque()
            marks.append((now, through))
        if marks is None:
            return None
        allowed = None
        while marks and marks[0][0] <= now - self.seconds:
            allowed = marks.popleft()[1]
        if not marks:
            del self._marks[topic]
        return allowed

    def waiting(self, topic: Topic) -> bool:
        """Whether `topic` has data whose grace is still running (look at it again later)."""
        return topic in self._marks

    def forget(self, topic: Topic) -> None:
        """The topic is gone."""
        self._marks.pop(topic, None)
        self._born.pop(topic, None)
