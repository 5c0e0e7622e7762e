"""Topic discovery for wildcard subscriptions in separated mode: one poller per namespace.

A proxy follows an MQTT filter by subscribing to each topic of the namespace it matches. Which
topics exist comes from the namespace's listing (GET_TOPICS_OF_NAMESPACE), and a proxy asks for
it once per period and namespace however many consumers follow filters there: the poller
matches each topic that appeared or went against the filters of every watching consumer at
once (a `SubscriptionTrie` on MQTT names, so the cost follows the topic, not the number of
watchers) and tells only the watchers it matches. (pulsar-client's own pattern consumers each
poll on their own timer, which is why they are not used.)

A poller starts with the first watcher of its namespace, which waits for the first listing, and
stops with the last one. A watcher that comes while the poller runs starts from its current
list: a topic created less than a period before it is found by the next poll, like one created
after it (consumers start discovered topics at their earliest message, so nothing is lost).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Protocol

import trio

from mop.processor.backend import BackendError
from mop.topic_names import pulsar_to_mqtt
from mop.topics import SubscriptionTrie, TopicTree

__all__ = ["Lister", "NamespaceDiscovery", "TopicWatcher", "Watch"]

log = logging.getLogger("mop.cluster")


class Lister(Protocol):
    """Lists the persistent topics of a namespace (`admin.TopicLister`)."""

    async def topics(self, namespace: str) -> list[str]: ...

    async def aclose(self) -> None: ...


class TopicWatcher(Protocol):
    """Who is told of topics that its filters match (a consumer). Called on the trio thread;
    it must not block."""

    def topics_found(self, topics: list[str]) -> None: ...

    def topics_gone(self, topics: list[str]) -> None: ...


class _Namespace:
    """One namespace's poller state: the known topics and the filters of its watchers."""

    def __init__(self, tenant: str, namespace: str) -> None:
        self.tenant = tenant
        self.namespace = namespace
        self.name = f"{tenant}/{namespace}"
        self.trie: SubscriptionTrie[int, TopicWatcher] = SubscriptionTrie()
        self.watches: dict[int, Watch] = {}
        # Pulsar name -> MQTT name of every topic of the last listing; None before the first.
        self.known: dict[str, str] | None = None
        self.by_mqtt: dict[str, str] = {}  # the other way round
        self.tree = TopicTree()  # the MQTT names, to answer "which topics match a filter"
        self.error: BackendError | None = None  # why the latest listing failed
        self.attempted = trio.Event()  # set (and replaced) after each listing
        self.scope = trio.CancelScope()

    def mqtt_name(self, topic: str) -> str:
        return pulsar_to_mqtt(topic, tenant=self.tenant, namespace=self.namespace)

    def matching(self, filters: Iterable[str]) -> list[str]:
        """The known topics that any of `filters` matches (Pulsar names)."""
        if self.known is None:
            return []
        found: dict[str, None] = {}
        for topic_filter in filters:
            for mqtt in self.tree.match_filter(topic_filter):
                found[self.by_mqtt[mqtt]] = None
        return list(found)

    def update(self, topics: Iterable[str]) -> None:
        """Take a new listing and tell the watchers what appeared and went."""
        first = self.known is None
        known = self.known if self.known is not None else {}
        listed = [t for t in dict.fromkeys(topics) if t.startswith("persistent://")]
        present = set(listed)
        # Only names not seen before are decoded: a big namespace changes little per period.
        added = [(t, self.mqtt_name(t)) for t in listed if t not in known]
        removed = [(t, known.pop(t)) for t in [t for t in known if t not in present]]
        for _topic, mqtt in removed:
            self.tree.discard(mqtt)
            self.by_mqtt.pop(mqtt, None)
        for topic, mqtt in added:
            known[topic] = mqtt
            self.by_mqtt[mqtt] = topic
            self.tree.add(mqtt)
        self.known = known
        if first:
            return  # every watcher so far waits for this listing and reads `matching` itself
        self._tell(added, found=True)
        self._tell(removed, found=False)

    def _tell(self, topics: list[tuple[str, str]], *, found: bool) -> None:
        """Tell each watcher which of `topics` ((Pulsar name, MQTT name) pairs) it matches."""
        if not topics or not self.watches:
            return
        by_watcher: dict[int, tuple[TopicWatcher, dict[str, None]]] = {}
        for topic, mqtt in topics:
            for _filter, key, watcher in self.trie.match(mqtt):
                by_watcher.setdefault(key, (watcher, {}))[1][topic] = None
        for watcher, matched in by_watcher.values():
            try:
                if found:
                    watcher.topics_found(list(matched))
                else:
                    watcher.topics_gone(list(matched))
            except Exception:
                log.exception("a consumer failed to take discovered topics")


class Watch:
    """One watcher's filters in one namespace, until `close()`."""

    def __init__(
        self,
        namespace: _Namespace,
        key: int,
        watcher: TopicWatcher,
        on_empty: Callable[[_Namespace], None],
    ) -> None:
        self._namespace = namespace
        self._key = key
        self._watcher = watcher
        self._on_empty = on_empty
        self._filters: frozenset[str] = frozenset()
        self.closed = False

    @property
    def filters(self) -> frozenset[str]:
        return self._filters

    def update(self, filters: Iterable[str]) -> list[str]:
        """Follow `filters` from now on; the known topics they match (Pulsar names)."""
        filters = frozenset(filters)
        self.follow(filters)
        return self._namespace.matching(filters)

    def follow(self, filters: Iterable[str]) -> None:
        """Follow `filters` from now on (without listing what they match)."""
        filters = frozenset(filters)
        trie = self._namespace.trie
        for topic_filter in self._filters - filters:
            trie.remove(topic_filter, self._key)
        for topic_filter in filters - self._filters:
            trie.add(topic_filter, self._key, self._watcher)
        self._filters = filters

    def matching(self, filters: Iterable[str]) -> list[str]:
        """The known topics that any of `filters` matches (Pulsar names), whether this watch
        follows them or not (a watcher asks for the filters it just added, say)."""
        return self._namespace.matching(filters)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.update(())
        namespace = self._namespace
        namespace.watches.pop(self._key, None)
        if not namespace.watches:
            self._on_empty(namespace)


class NamespaceDiscovery:
    """The topic pollers of one proxy. Run `serve` (with `nursery.start`) before `watch`."""

    def __init__(self, lister: Callable[[], Lister], period: float) -> None:
        self._new_lister = lister
        self.period = period
        self._namespaces: dict[str, _Namespace] = {}
        self._keys = itertools.count()
        self._nursery: trio.Nursery | None = None
        self._closed = False

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the pollers until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._closed = True
            for namespace in self._namespaces.values():
                namespace.error = BackendError("backend is closed", reason="closed")
                namespace.attempted.set()

    def polling(self) -> list[str]:
        """The namespaces polled now ("tenant/namespace")."""
        return list(self._namespaces)

    async def watch(
        self, tenant: str, namespace: str, filters: Iterable[str], watcher: TopicWatcher
    ) -> tuple[Watch, list[str]]:
        """Follow `filters` in a namespace for `watcher`: the watch and the topics they match
        now (after the namespace's first listing). Raises BackendError when the namespace was
        never listed and its listing fails."""
        if self._closed or self._nursery is None:
            raise BackendError("backend is not running", reason="closed")
        name = f"{tenant}/{namespace}"
        state = self._namespaces.get(name)
        if state is None:
            state = self._namespaces[name] = _Namespace(tenant, namespace)
            self._nursery.start_soon(self._poll, state)
        key = next(self._keys)
        watch = Watch(state, key, watcher, self._stop)
        state.watches[key] = watch
        try:
            watch.update(filters)
            while state.known is None:
                attempted = state.attempted
                await attempted.wait()
                if state.known is None and state.error is not None:
                    raise state.error
        except BaseException:
            watch.close()
            raise
        return watch, state.matching(watch.filters)

    def _stop(self, state: _Namespace) -> None:
        if self._namespaces.get(state.name) is state:
            del self._namespaces[state.name]
        state.scope.cancel()

    async def _poll(self, state: _Namespace) -> None:
        lister = self._new_lister()
        failing = False
        try:
            with state.scope:
                while True:
                    try:
                        topics = await lister.topics(state.name)
                    except BackendError as exc:
                        state.error = exc
                        if not failing:
                            log.warning("discovering topics of %s: %s", state.name, exc)
                        failing = True
                    else:
                        if failing:
                            log.info("discovering topics of %s works again", state.name)
                        failing = False
                        state.error = None
                        state.update(topics)
                    attempted, state.attempted = state.attempted, trio.Event()
                    attempted.set()
                    await trio.sleep(self.period)
        finally:
            await lister.aclose()
