"""The topic poller of separated mode: one listing per namespace and period however many
consumers watch it, each told only of the topics its filters match, and no polling once no
consumer watches (a fake lister on trio's autojumping clock: no broker, no real waiting)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.lowlevel

from mop.backends.cluster.discovery import NamespaceDiscovery
from mop.processor.backend import BackendError
from mop.topic_names import mqtt_to_pulsar

PERIOD = 1.0


class FakeLister:
    """The namespace's topics, as tests set them; counts the listings and closes."""

    def __init__(self) -> None:
        self.topics: list[str] = []
        self.calls = 0
        self.failing = False
        self.closed = 0

    async def topics_of(self, namespace: str) -> list[str]:
        await trio.sleep(0.01)
        self.calls += 1
        if self.failing:
            raise BackendError("down", reason="unavailable")
        return [t for t in self.topics if t.startswith(f"persistent://{namespace}/")]


class Handle:
    """What the poller holds: one per poller, on the shared `FakeLister`."""

    def __init__(self, lister: FakeLister) -> None:
        self._lister = lister

    async def topics(self, namespace: str) -> list[str]:
        return await self._lister.topics_of(namespace)

    async def aclose(self) -> None:
        self._lister.closed += 1


class Watcher:
    def __init__(self) -> None:
        self.found: list[str] = []
        self.gone: list[str] = []

    def topics_found(self, topics: list[str]) -> None:
        self.found.extend(topics)

    def topics_gone(self, topics: list[str]) -> None:
        self.gone.extend(topics)


def topic(name: str) -> str:
    return mqtt_to_pulsar(name)


@pytest.fixture
def lister() -> FakeLister:
    return FakeLister()


@pytest.fixture
async def discovery(
    lister: FakeLister,
) -> AsyncIterator[NamespaceDiscovery]:
    found = NamespaceDiscovery(lambda: Handle(lister), PERIOD)
    async with trio.open_nursery() as nursery:
        await nursery.start(found.serve)
        yield found
        nursery.cancel_scope.cancel()


async def test_many_watchers_share_one_listing_per_period(
    discovery: NamespaceDiscovery, lister: FakeLister, autojump_clock: trio.abc.Clock
) -> None:
    lister.topics = [topic("a/1"), topic("b/1")]
    watchers = [Watcher() for _ in range(50)]
    watches = []
    for index, watcher in enumerate(watchers):
        watch, known = await discovery.watch("public", "default", [f"{'ab'[index % 2]}/+"], watcher)
        assert known == [topic(f"{'ab'[index % 2]}/1")]
        watches.append(watch)
    before = lister.calls
    await trio.sleep(10 * PERIOD)
    assert 9 <= lister.calls - before <= 11
    assert discovery.polling() == ["public/default"]
    for watch in watches:
        watch.close()


async def test_new_topics_reach_only_the_watchers_they_match(
    discovery: NamespaceDiscovery, lister: FakeLister, autojump_clock: trio.abc.Clock
) -> None:
    a, b, both = Watcher(), Watcher(), Watcher()
    await discovery.watch("public", "default", ["a/+"], a)
    await discovery.watch("public", "default", ["b/#"], b)
    await discovery.watch("public", "default", ["a/+", "+/x"], both)
    lister.topics = [topic("a/x"), topic("b/y/z"), topic("c"), topic("$SYS/x")]
    await trio.sleep(1.5 * PERIOD)
    assert a.found == [topic("a/x")]
    assert b.found == [topic("b/y/z")]
    assert both.found == [topic("a/x")]  # once, though two filters match
    lister.topics = [topic("b/y/z")]
    await trio.sleep(PERIOD)
    assert a.gone == [topic("a/x")] and both.gone == [topic("a/x")] and not b.gone


async def test_a_later_watcher_starts_from_the_known_topics(
    discovery: NamespaceDiscovery, lister: FakeLister, autojump_clock: trio.abc.Clock
) -> None:
    first = Watcher()
    await discovery.watch("public", "default", ["x/#"], first)
    lister.topics = [topic("y/1")]
    await trio.sleep(1.5 * PERIOD)
    calls = lister.calls
    _, known = await discovery.watch("public", "default", ["y/+"], Watcher())
    assert known == [topic("y/1")]
    assert lister.calls == calls  # answered from the poller's list, no listing of its own


async def test_the_poller_stops_with_its_last_watcher(
    discovery: NamespaceDiscovery, lister: FakeLister, autojump_clock: trio.abc.Clock
) -> None:
    one, _ = await discovery.watch("public", "default", ["a/+"], Watcher())
    two, _ = await discovery.watch("public", "default", ["b/+"], Watcher())
    one.close()
    await trio.sleep(2 * PERIOD)
    assert discovery.polling() == ["public/default"]
    two.close()
    await trio.lowlevel.checkpoint()
    calls = lister.calls
    await trio.sleep(5 * PERIOD)
    assert lister.calls == calls
    assert discovery.polling() == []
    assert lister.closed == 1
    # A new watcher starts a new poller, with a listing of its own.
    _, known = await discovery.watch("public", "default", ["a/+"], Watcher())
    assert lister.calls == calls + 1 and known == []


async def test_namespaces_are_polled_apart(
    discovery: NamespaceDiscovery, lister: FakeLister, autojump_clock: trio.abc.Clock
) -> None:
    lister.topics = [topic("a"), mqtt_to_pulsar("a", namespace="other")]
    _, here = await discovery.watch("public", "default", ["#"], Watcher())
    _, there = await discovery.watch("public", "other", ["#"], Watcher())
    assert here == [topic("a")]
    assert there == [mqtt_to_pulsar("a", namespace="other")]
    assert sorted(discovery.polling()) == ["public/default", "public/other"]


async def test_a_first_listing_that_fails_fails_the_watch(
    discovery: NamespaceDiscovery, lister: FakeLister, autojump_clock: trio.abc.Clock
) -> None:
    lister.failing = True
    with pytest.raises(BackendError):
        await discovery.watch("public", "default", ["a/+"], Watcher())
    assert discovery.polling() == []
    # Once it has listed, a failing listing keeps the last list.
    lister.failing = False
    lister.topics = [topic("a/1")]
    watcher = Watcher()
    await discovery.watch("public", "default", ["a/+"], watcher)
    lister.failing = True
    await trio.sleep(3 * PERIOD)
    _, known = await discovery.watch("public", "default", ["a/+"], Watcher())
    assert known == [topic("a/1")] and not watcher.gone
