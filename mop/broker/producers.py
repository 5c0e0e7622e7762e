"""Producers of a topic: the access-mode rules (shared, exclusive, wait-for-exclusive, exclusive
with fencing) and the last sequence id of each producer name, for deduplication. Plain objects
with no I/O and no trio; callers are told about changes through callbacks.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mop.messaging import ProducerAccess, ProducerBusy, ProducerFenced

__all__ = ["ProducerHandle", "ProducerRegistry", "SequenceBook", "Sequenced"]


class ProducerHandle:
    """One producer registered on a topic.

    `ready` is False while a wait-for-exclusive producer queues for the topic; `fenced` turns
    True when another producer took the topic over. `on_change` is called after either changes.
    `topic_epoch` is the epoch of the topic when this producer got exclusive access (its fencing
    token); `epoch` counts the producer's own reconnections.
    """

    __slots__ = (
        "access",
        "closed",
        "epoch",
        "fenced",
        "name",
        "on_change",
        "ready",
        "topic",
        "topic_epoch",
    )

    def __init__(
        self,
        topic: str,
        name: str,
        access: ProducerAccess,
        epoch: int,
        on_change: Callable[[], None] | None,
    ) -> None:
        self.topic = topic
        self.name = name
        self.access = access
        self.epoch = epoch
        self.on_change = on_change
        self.ready = True
        self.fenced = False
        self.closed = False
        self.topic_epoch: int | None = None

    def __repr__(self) -> str:
        return f"ProducerHandle({self.topic!r}, {self.name!r}, {self.access.value})"

    @property
    def exclusive(self) -> bool:
        return self.access is not ProducerAccess.SHARED

    def _notify(self) -> None:
        if self.on_change is not None:
            self.on_change()


class _TopicProducers:
    __slots__ = ("epoch", "producers", "waiting")

    def __init__(self) -> None:
        self.producers: dict[str, ProducerHandle] = {}
        self.waiting: deque[ProducerHandle] = deque()
        self.epoch = 0

    def has_exclusive(self) -> bool:
        return any(handle.exclusive for handle in self.producers.values())


class ProducerRegistry:
    """Who may produce on which topic."""

    def __init__(self) -> None:
        self._topics: dict[str, _TopicProducers] = {}

    def add(
        self,
        topic: str,
        name: str,
        access: ProducerAccess,
        *,
        epoch: int = 0,
        topic_epoch: int | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> ProducerHandle:
        """Register a producer, or raise ProducerBusy / ProducerFenced.

        As in Pulsar, an `Exclusive` producer that finds the topic taken (by any producer, or
        with exclusive producers queued) is refused with ProducerFenced, and a shared producer
        that finds an exclusive one (holding or queued) with ProducerBusy.

        A wait-for-exclusive producer that cannot have the topic yet comes back with `ready`
        False and is granted it (`on_change`) when the producers before it are gone. A name
        that is taken is refused, unless the new producer is the same one reconnecting with a
        higher `epoch`: then the old registration is dropped. A producer that held exclusive
        access under an older topic epoch (`topic_epoch`) was fenced and stays out.
        """
        state = self._topics.setdefault(topic, _TopicProducers())
        handle = ProducerHandle(topic, name, access, epoch, on_change)
        previous = state.producers.get(name)
        if previous is not None:
            if epoch <= previous.epoch:
                raise ProducerBusy(f"producer {name!r} is already connected to {topic!r}")
            self._drop(state, previous)
        if topic_epoch is not None and topic_epoch < state.epoch:
            raise ProducerFenced(f"producer {name!r} was fenced on {topic!r}")
        others = state.producers.values()
        if access is ProducerAccess.SHARED:
            if state.has_exclusive() or state.waiting:
                raise ProducerBusy(f"{topic!r} has an exclusive producer")
        elif access is ProducerAccess.EXCLUSIVE:
            if others or state.waiting:
                raise ProducerFenced(f"{topic!r} already has producers")
            self._grant(state, handle, topic_epoch)
        elif access is ProducerAccess.WAIT_FOR_EXCLUSIVE:
            if others or state.waiting:
                handle.ready = False
                state.waiting.append(handle)
                return handle
            self._grant(state, handle, topic_epoch)
        else:
            for other in list(others):
                other.fenced = True
                self._drop(state, other)
                other._notify()
            self._grant(state, handle, None)
        state.producers[name] = handle
        return handle

    @staticmethod
    def _grant(state: _TopicProducers, handle: ProducerHandle, topic_epoch: int | None) -> None:
        # A producer coming back with the current epoch keeps it; a new holder starts the next.
        if topic_epoch is None or topic_epoch != state.epoch:
            state.epoch += 1
        handle.topic_epoch = state.epoch

    def _drop(self, state: _TopicProducers, handle: ProducerHandle) -> None:
        handle.closed = True
        if state.producers.get(handle.name) is handle:
            del state.producers[handle.name]

    def remove(self, handle: ProducerHandle) -> None:
        """Unregister a producer; the first producer waiting for exclusive access may get it."""
        state = self._topics.get(handle.topic)
        if state is None or handle.closed:
            return
        handle.closed = True
        if handle in state.waiting:
            state.waiting.remove(handle)
        elif state.producers.get(handle.name) is handle:
            del state.producers[handle.name]
        if not state.producers and state.waiting:
            waiter = state.waiting.popleft()
            if waiter.name in state.producers:
                waiter.closed = True  # its name was taken meanwhile: it stays queued no more
                waiter._notify()
            else:
                self._grant(state, waiter, None)
                waiter.ready = True
                state.producers[waiter.name] = waiter
                waiter._notify()
        if not state.producers and not state.waiting and not state.epoch:
            del self._topics[handle.topic]

    def producers(self, topic: str) -> list[ProducerHandle]:
        state = self._topics.get(topic)
        return [] if state is None else list(state.producers.values())


@dataclass(frozen=True, slots=True)
class Sequenced:
    """Who sent a message, for deduplication: sequence ids `first`..`last` of producer `name`.
    `durable` names (chosen by applications) keep their last sequence id across restarts."""

    name: str
    first: int
    last: int
    durable: bool = False


class SequenceBook:
    """The last sequence id stored for each (topic, producer name).

    Durable names are kept for good, and saved in a table as "{topic}\n{name}" -> decimal;
    other names (assigned by the broker, unique per producer) are kept for the `recent` most
    recently used ones, long enough for a producer to reconnect and resend.
    """

    def __init__(self, *, recent: int = 10_000) -> None:
        self._durable: dict[tuple[str, str], int] = {}
        self._recent: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._limit = recent

    def last(self, topic: str, name: str) -> int:
        key = (topic, name)
        found = self._durable.get(key)
        if found is None:
            found = self._recent.get(key)
        return -1 if found is None else found

    def is_duplicate(self, topic: str, sequence: Sequenced) -> bool:
        return sequence.first <= self.last(topic, sequence.name)

    def record(self, topic: str, sequence: Sequenced) -> tuple[str, bytes] | None:
        """Note a stored message; for a durable name, the table entry to save."""
        key = (topic, sequence.name)
        last = max(sequence.first, sequence.last)
        if sequence.durable:
            self._durable[key] = last
            return f"{topic}\n{sequence.name}", str(last).encode()
        recent = self._recent
        recent[key] = last
        recent.move_to_end(key)
        if len(recent) > self._limit:
            recent.popitem(last=False)
        return None

    def forget(self, topic: str) -> list[str]:
        """Forget the sequence ids of `topic` (deleted); the table keys to delete."""
        durable = [key for key in self._durable if key[0] == topic]
        for key in durable:
            del self._durable[key]
        for key in [key for key in self._recent if key[0] == topic]:
            del self._recent[key]
        return [f"{topic}\n{name}" for _, name in durable]

    def restore(self, saved: Iterable[tuple[str, bytes]]) -> None:
        """Load the table entries `record` returned."""
        for key, raw in saved:
            topic, _, name = key.partition("\n")
            self._durable[(topic, name)] = int(raw)
