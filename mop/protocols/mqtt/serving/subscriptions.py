"""The subscriptions of one MQTT session and the processor consumers that serve them.

Normal filters share one consumer named after the client id (so overlapping filters give one
delivery per message); each `$share/{group}/{filter}` has its own consumer in the shared
subscription `group`. `plan` decides per message the QoS, retain flag and subscription ids.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import trio

from mop.message import Message
from mop.processor import BackendError, ClientContext, Consumer, SubscriptionKind, SubscriptionSpec
from mop.protocols.mqtt.errors import ProtocolViolation
from mop.protocols.mqtt.mapping import was_retained
from mop.protocols.mqtt.packets import Subscribe
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.session import SessionState, SubscriptionOptions
from mop.security.acl import Access
from mop.security.authorization import ClientPermissions
from mop.topics import SubscriptionTrie, TopicError, parse_shared, validate_topic_filter
from mop.transport import ConnectionTasks

log = logging.getLogger("mop.mqtt")

Deliver = Callable[[Consumer, SubscriptionOptions | None], Awaitable[None]]

if TYPE_CHECKING:  # the server module imports this one
    from mop.protocols.mqtt.serving.server import MqttServer


@dataclass(frozen=True, slots=True)
class RetainedDelivery:
    topic: str
    message: Message
    qos: int
    sub_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Route:
    """The session's filters that match one topic. A `simple` route has no No Local and no
    Retain As Published filter among them, so every message of the topic is delivered alike:
    at `qos` (-1: not at all) with `sub_ids`."""

    options: tuple[SubscriptionOptions, ...]
    simple: bool
    qos: int
    sub_ids: tuple[int, ...]
    # For a simple route, the plan of a message by its QoS (0, 1, 2).
    plans: tuple[tuple[int, bool, tuple[int, ...]] | None, ...]


# Topics whose route a session remembers; past this the memory starts again.
_MAX_ROUTES = 4096


def shared_subscription_name(group: str, topic_filter: str) -> str:
    return f"$share/{group}/{topic_filter}"


class SessionSubscriptions:
    __slots__ = (
        "_ctx",
        "_deliver",
        "_normal",
        "_permissions",
        "_routes",
        "_routes_generation",
        "_server",
        "_shared",
        "_state",
        "_tasks",
        "_trie",
    )

    def __init__(
        self,
        server: MqttServer,
        ctx: ClientContext,
        state: SessionState,
        permissions: ClientPermissions,
    ) -> None:
        self._server = server
        self._ctx = ctx
        self._state = state
        # What the client may read is checked once per topic, as its route is worked out;
        # the routes are worked out again when the rules change (their generation).
        self._permissions = permissions
        self._routes_generation = permissions.generation
        self._trie: SubscriptionTrie[str, SubscriptionOptions] = SubscriptionTrie()
        # Topic -> how its messages are delivered; emptied whenever the filters change.
        self._routes: dict[str, _Route] = {}
        self._normal: Consumer | None = None
        self._shared: dict[str, tuple[Consumer, trio.CancelScope]] = {}
        self._tasks: ConnectionTasks | None = None
        self._deliver: Deliver | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def restore(self) -> None:
        """Attach consumers for the subscriptions a resumed session already has."""
        normal = []
        for topic_filter, options in self._state.subscriptions.items():
            shared = parse_shared(topic_filter)
            if shared.group is None:
                self._trie.add(topic_filter, topic_filter, options)
                self._routes.clear()
                normal.append(topic_filter)
            else:
                consumer = await self._subscribe_shared(shared.group, shared.topic_filter)
                self._shared[topic_filter] = (consumer, trio.CancelScope())
        if normal:
            self._normal = await self._subscribe_normal(frozenset(normal))

    def start(self, tasks: ConnectionTasks, deliver: Deliver) -> None:
        self._tasks, self._deliver = tasks, deliver
        if self._normal is not None:
            self._run(self._normal, None, trio.CancelScope())
        for topic_filter, (consumer, scope) in self._shared.items():
            self._run(consumer, self._state.subscriptions[topic_filter], scope)

    def _run(
        self, consumer: Consumer, options: SubscriptionOptions | None, scope: trio.CancelScope
    ) -> None:
        assert self._tasks is not None and self._deliver is not None
        self._tasks.start_soon(partial(self._deliver, consumer, options), scope)

    async def detach(self, *, unsubscribe: bool) -> None:
        """The connection ends: close the consumers, or delete them when the session ends.
        Every one is closed even when one cannot be (the first error is raised after)."""
        consumers = [c for c, _ in self._shared.values()]
        if self._normal is not None:
            consumers.append(self._normal)
        failed: BackendError | None = None
        for consumer in consumers:
            try:
                if unsubscribe:
                    await consumer.unsubscribe()
                else:
                    await consumer.close()
            except BackendError as exc:
                log.warning("%s: a subscription could not be left: %s", self._ctx.client_id, exc)
                failed = failed or exc
        if failed is not None:
            raise failed

    # -- SUBSCRIBE / UNSUBSCRIBE -----------------------------------------------------------

    async def subscribe(
        self, packet: Subscribe, *, v5: bool, bridge: bool = False
    ) -> tuple[list[int], list[RetainedDelivery]]:
        """Add or replace the packet's subscriptions: their SUBACK codes, and the retained
        messages to send. A mosquitto `bridge` (MQTT 3.1/3.1.1, which has no subscription
        options) gets No Local and Retain As Published on every filter that is not shared,
        as mosquitto gives it: its own messages do not come back (they would loop between the
        brokers), and what it forwards keeps its retain flag."""
        settings = self._server.settings
        ids = packet.properties.subscription_identifiers
        identifier = ids[0] if ids else None
        codes: list[int] = []
        retained: list[RetainedDelivery] = []
        for request in packet.subscriptions:
            topic_filter = request.topic_filter
            try:
                validate_topic_filter(
                    topic_filter,
                    max_length=settings.max_topic_length,
                    max_levels=settings.max_topic_levels,
                )
            except TopicError as exc:
                codes.append(exc.reason_code if v5 else 0x80)
                continue
            shared = parse_shared(topic_filter)
            if shared.group is not None and request.no_local and v5:
                raise ProtocolViolation("No Local on a shared subscription")
            acl_name = self._server.acl_name(shared.topic_filter)
            if self._server.is_system(acl_name) or not self._permissions.may(
                Access.SUBSCRIBE, acl_name
            ):
                codes.append(ReasonCode.NOT_AUTHORIZED if v5 else 0x80)
                continue
            existed = topic_filter in self._state.subscriptions
            if (
                not existed
                and len(self._state.subscriptions) >= settings.max_subscriptions_per_client
            ):
                codes.append(ReasonCode.QUOTA_EXCEEDED if v5 else 0x80)
                continue
            granted = min(request.qos, 2)
            bridged = bridge and shared.group is None
            options = SubscriptionOptions(
                qos=granted,
                no_local=request.no_local or bridged,
                retain_as_published=request.retain_as_published or bridged,
                retain_handling=request.retain_handling,
                identifier=identifier,
            )
            self._state.subscriptions[topic_filter] = options
            if shared.group is None:
                self._trie.add(topic_filter, topic_filter, options)
                self._routes.clear()
                try:
                    await self._add_normal(topic_filter)
                except BackendError as exc:
                    self._trie.remove(topic_filter, topic_filter)
                    self._routes.clear()
                    codes.append(self._refuse(topic_filter, exc, v5=v5))
                    continue
                if request.retain_handling == 0 or (request.retain_handling == 1 and not existed):
                    sub_ids = (identifier,) if identifier else ()
                    may = self._permissions.may
                    retained.extend(
                        RetainedDelivery(r.topic, r.message, min(granted, r.message.qos), sub_ids)
                        for r in self._server.retained.match(topic_filter)
                        if may(Access.READ, r.topic)
                    )
            elif not existed:
                try:
                    consumer = await self._subscribe_shared(shared.group, shared.topic_filter)
                except BackendError as exc:
                    codes.append(self._refuse(topic_filter, exc, v5=v5))
                    continue
                scope = trio.CancelScope()
                self._shared[topic_filter] = (consumer, scope)
                self._run(consumer, options, scope)
            codes.append(granted)
        await self._server.sessions.save(self._state)
        return codes, retained

    def _refuse(self, topic_filter: str, exc: BackendError, *, v5: bool) -> int:
        """The SUBACK code for a new filter the backend cannot follow (its brokers lack a
        feature, or do not answer): this filter alone is refused, the session goes on."""
        log.warning("%s: subscribing %r failed: %s", self._ctx.client_id, topic_filter, exc)
        del self._state.subscriptions[topic_filter]
        return ReasonCode.UNSPECIFIED_ERROR if v5 else 0x80

    async def unsubscribe(self, filters: tuple[str, ...]) -> list[int]:
        codes: list[int] = []
        for topic_filter in filters:
            if self._state.subscriptions.pop(topic_filter, None) is None:
                codes.append(ReasonCode.NO_SUBSCRIPTION_EXISTED)
                continue
            codes.append(ReasonCode.SUCCESS)
            shared = self._shared.pop(topic_filter, None)
            if shared is not None:
                consumer, scope = shared
                scope.cancel()
                await consumer.unsubscribe()
            else:
                self._trie.remove(topic_filter, topic_filter)
                self._routes.clear()
                if self._normal is not None:
                    await self._normal.remove_selector(topic_filter)
        await self._server.sessions.save(self._state)
        return codes

    # -- deliveries ------------------------------------------------------------------------

    def plan(
        self, topic: str, message: Message, shared: SubscriptionOptions | None
    ) -> tuple[int, bool, tuple[int, ...]] | None:
        """QoS, retain flag and subscription ids for delivering `message`, or None to skip it.

        Overlapping filters give one delivery with the highest granted QoS and every matching
        subscription identifier (MQTT 5 section 3.3.4); No Local filters skip own messages.
        """
        if shared is not None:
            if not self._permissions.may(Access.READ, topic):
                return None
            retain = shared.retain_as_published and was_retained(message)
            ids = (shared.identifier,) if shared.identifier else ()
            return min(shared.qos, message.qos), retain, ids
        route = self._routes.get(topic)
        permissions = self._permissions
        if route is None or (
            permissions.restricted and self._routes_generation != permissions.generation
        ):
            route = self._route(topic)
        if route.simple:
            return route.plans[message.qos]
        qos = -1
        retain = False
        sub_ids: list[int] = []
        own = message.producer == self._ctx.client_id
        for options in route.options:
            if options.no_local and own:
                continue
            qos = max(qos, options.qos)
            if options.retain_as_published and was_retained(message):
                retain = True
            if options.identifier:
                sub_ids.append(options.identifier)
        if qos < 0:
            return None
        return min(qos, message.qos), retain, tuple(sub_ids)

    def _route(self, topic: str) -> _Route:
        """Match `topic` against the session's filters once; `plan` reuses the result until
        the subscriptions change."""
        routes = self._routes
        generation = self._permissions.generation
        if len(routes) >= _MAX_ROUTES or generation != self._routes_generation:
            routes.clear()
            self._routes_generation = generation
        options = tuple(options for _f, _k, options in self._trie.match(topic))
        if options and not self._permissions.may(Access.READ, topic):
            options = ()  # subscribed, but not allowed to read this topic: nothing delivered
        simple = not any(o.no_local or o.retain_as_published for o in options)
        qos = max((o.qos for o in options), default=-1)
        ids = tuple(o.identifier for o in options if o.identifier)
        plans = tuple(None if qos < 0 else (min(qos, wanted), False, ids) for wanted in range(3))
        route = routes[topic] = _Route(options, simple, qos, ids, plans)
        return route

    # -- consumers -------------------------------------------------------------------------

    def _spec(
        self, name: str, selectors: frozenset[str], kind: SubscriptionKind
    ) -> SubscriptionSpec:
        return SubscriptionSpec(
            name=name,
            selectors=selectors,
            kind=kind,
            durable=self._state.expiry_interval > 0,
            member=self._ctx.client_id,
            max_backlog=self._server.settings.max_queued_messages,
            # QoS 0 is delivered at most once: no acknowledgement to track per message.
            auto_ack_qos0=True,
        )

    async def _subscribe_normal(self, selectors: frozenset[str]) -> Consumer:
        spec = self._spec(self._ctx.client_id, selectors, SubscriptionKind.EXCLUSIVE)
        return await self._server.processor.subscribe(self._ctx, spec)

    async def _subscribe_shared(self, group: str, topic_filter: str) -> Consumer:
        # The subscription is named after group and filter: `$share/g/a` and `$share/g/b` are
        # two shared subscriptions (MQTT 5 section 4.8.2), not one with two filters.
        name = shared_subscription_name(group, topic_filter)
        spec = self._spec(name, frozenset([topic_filter]), SubscriptionKind.SHARED)
        return await self._server.processor.subscribe(self._ctx, spec)

    async def _add_normal(self, topic_filter: str) -> None:
        if self._normal is None:
            self._normal = await self._subscribe_normal(frozenset([topic_filter]))
            if self._tasks is not None:
                self._run(self._normal, None, trio.CancelScope())
        else:
            await self._normal.add_selector(topic_filter)
