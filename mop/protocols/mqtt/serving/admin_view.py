"""The MQTT adapter as the admin API sees it (`mop.protocols.introspection`): its connected
clients, the deployment's sessions and retained messages, and publishing as an MQTT client would.

Sessions and retained messages live in processor tables every node reads, so a separated proxy
shows those of the whole deployment; its clients are its own.
"""

from __future__ import annotations

from collections.abc import Iterator

from mop.processor import ClientContext
from mop.protocols.introspection import (
    BadTopic,
    ClientInfo,
    PublishRequest,
    RetainedInfo,
    SessionInfo,
    SubscriptionInfo,
    TooLarge,
)
from mop.protocols.mqtt.codec import encode_publish
from mop.protocols.mqtt.errors import LocalProtocolError
from mop.protocols.mqtt.packets import NO_PROPERTIES, Properties, Publish
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.serving import session_registry
from mop.protocols.mqtt.serving.handler import ClientHandler
from mop.protocols.mqtt.serving.server import MqttServer
from mop.protocols.mqtt.session import SessionState
from mop.topics import TopicError, parse_shared, validate_topic_filter, validate_topic_name

# Who publishes what an operator sends through the admin API (the producer of its messages).
ADMIN_CONTEXT = ClientContext(client_id="$admin", protocol="mqtt")
_KICKED = "disconnected by an administrator"


class MqttAdminView:
    """What `MqttProtocol.admin_view()` returns."""

    def __init__(self, server: MqttServer) -> None:
        self._server = server
        self.sessions = MqttSessions(server)
        self.retained = MqttRetained(server)
        self.publisher = MqttPublisher(server)

    def connected(self) -> int:
        return len(self._server.clients)

    def clients(self) -> list[ClientInfo]:
        return [client.describe() for client in list(self._server.clients)]

    def client(self, client_id: str) -> ClientInfo | None:
        client = find_client(self._server, client_id)
        return client.describe() if client is not None else None

    def subscriptions(self, client_id: str) -> list[SubscriptionInfo] | None:
        client = find_client(self._server, client_id)
        if client is None:
            return None
        return list(subscription_infos(client.state)) if client.state is not None else []

    def kick(self, client_id: str) -> bool:
        client = find_client(self._server, client_id)
        if client is None:
            return False
        client.close_for(ReasonCode.ADMINISTRATIVE_ACTION, _KICKED)
        return True


def find_client(server: MqttServer, client_id: str) -> ClientHandler | None:
    """The connection of `client_id` on this node (the latest, during a takeover)."""
    found = [client for client in server.clients if client.ctx.client_id == client_id]
    return max(found, key=lambda client: client.connected_at) if found else None


def subscription_infos(state: SessionState) -> Iterator[SubscriptionInfo]:
    for topic_filter, options in state.subscriptions.items():
        shared = parse_shared(topic_filter)
        yield SubscriptionInfo(state.client_id, shared.topic_filter, options.qos, shared.group)


def session_info(state: SessionState, *, connected: bool) -> SessionInfo:
    disconnected_at = None if connected else state.disconnected_at
    expires_at = None if connected else state.expires_at
    return SessionInfo(
        client_id=state.client_id,
        connected=connected,
        expiry_interval=state.expiry_interval,
        disconnected_at=disconnected_at / 1000 if disconnected_at is not None else None,
        expires_at=expires_at / 1000 if expires_at is not None else None,
        subscriptions=tuple(subscription_infos(state)),
        inflight=len(state.outbound),
        will=state.will is not None,
    )


class MqttSessions:
    """The deployment's sessions: those connected here as they are now, the offline ones
    whose timers run here as this node has them, the others as the session table has them."""

    def __init__(self, server: MqttServer) -> None:
        self._server = server
        self._table = server.processor.table(session_registry.TABLE)
        # Table records as last read, by client id: a record is parsed again only once it
        # changed (a page polls the totals every few seconds).
        self._read: dict[str, tuple[bytes, SessionInfo]] = {}

    def sessions(self) -> list[SessionInfo]:
        found: dict[str, SessionInfo] = {}
        for client in list(self._server.clients):
            if client.state is not None:
                found[client.ctx.client_id] = session_info(client.state, connected=True)
        for client_id, state in self._server.sessions.offline_here().items():
            if client_id not in found:
                found[client_id] = session_info(state, connected=False)
        read: dict[str, tuple[bytes, SessionInfo]] = {}
        for client_id, data in self._table.items():
            if client_id in found:
                continue
            hit = self._read.get(client_id)
            if hit is None or hit[0] != data:
                parsed = _parsed(data)
                if parsed is None:
                    continue
                hit = (data, session_info(parsed, connected=parsed.disconnected_at is None))
            read[client_id] = hit
            found[client_id] = hit[1]
        self._read = read
        return sorted(found.values(), key=lambda session: session.client_id)

    def session(self, client_id: str) -> SessionInfo | None:
        client = find_client(self._server, client_id)
        if client is not None and client.state is not None:
            return session_info(client.state, connected=True)
        state = self._server.sessions.offline_here().get(client_id)
        if state is not None:
            return session_info(state, connected=False)
        data = self._table.get(client_id)
        parsed = _parsed(data) if data is not None else None
        if parsed is None:
            return None
        return session_info(parsed, connected=parsed.disconnected_at is None)

    async def delete(self, client_id: str) -> bool:
        client = find_client(self._server, client_id)
        if client is not None:
            await client.end_session(ReasonCode.ADMINISTRATIVE_ACTION, "session deleted")
            return True
        return await self._server.sessions.discard(client_id)


def _parsed(data: bytes) -> SessionState | None:
    try:
        return SessionState.from_bytes(data)
    except (ValueError, KeyError, TypeError):
        return None


class MqttRetained:
    def __init__(self, server: MqttServer) -> None:
        self._server = server

    def __len__(self) -> int:
        return len(self._server.retained)

    def matching(self, topic_filter: str) -> Iterator[RetainedInfo]:
        settings = self._server.settings
        try:
            validate_topic_filter(
                topic_filter,
                max_length=settings.max_topic_length,
                max_levels=settings.max_topic_levels,
            )
        except TopicError as exc:
            raise BadTopic(str(exc)) from None
        if parse_shared(topic_filter).group is not None:
            raise BadTopic("a shared subscription filter matches no retained message")
        for retained in self._server.retained.match(topic_filter):
            message = retained.message
            yield RetainedInfo(
                retained.topic, message.payload, message.qos, message.publish_time / 1000
            )

    def get(self, topic: str) -> RetainedInfo | None:
        message = self._server.retained.get(topic)
        if message is None:
            return None
        return RetainedInfo(topic, message.payload, message.qos, message.publish_time / 1000)

    async def delete(self, topic: str) -> bool:
        store = self._server.retained
        if store.is_local(topic):
            raise BadTopic(f"{topic!r} is this node's own ($SYS)", reserved=True)
        if store.get(topic) is None:
            return False
        await store.set(topic, None)
        return True


class MqttPublisher:
    def __init__(self, server: MqttServer) -> None:
        self._server = server

    async def publish(self, request: PublishRequest) -> str:
        server = self._server
        settings = server.settings
        topic = request.topic
        try:
            validate_topic_name(
                topic, max_length=settings.max_topic_length, max_levels=settings.max_topic_levels
            )
        except TopicError as exc:
            raise BadTopic(str(exc)) from None
        if server.reserved(server.acl_name(topic)):
            raise BadTopic(f"publishing to {topic!r} is not allowed", reserved=True)
        if request.qos not in (0, 1, 2):
            raise ValueError("qos must be 0, 1 or 2")
        if request.retain and not settings.retain_available:
            raise ValueError("retained messages are disabled (mqtt.retain_available)")
        properties = (
            Properties(user_properties=request.user_properties)
            if request.user_properties
            else NO_PROPERTIES
        )
        # The limit of what a client may publish here counts the whole packet (MQTT 5's,
        # with the properties), as it does for a client's PUBLISH.
        try:
            packet = encode_publish(
                topic,
                request.payload,
                qos=request.qos,
                retain=request.retain,
                dup=False,
                packet_id=1 if request.qos else None,
                properties=properties,
                protocol_level=5,
            )
        except LocalProtocolError as exc:
            raise ValueError(f"the message is not one MQTT can carry: {exc}") from None
        size = len(packet)
        if size > settings.max_packet_size:
            raise TooLarge(
                f"the message makes an MQTT PUBLISH of {size} bytes, more than"
                f" mqtt.max_packet_size ({settings.max_packet_size})"
            )
        publish = Publish(
            topic, request.payload, request.qos, request.retain, properties=properties
        )
        result = await server.publish(ADMIN_CONTEXT, publish)
        return str(result.message_id)
