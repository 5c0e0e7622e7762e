"""The `$SYS` tree under mosquitto's names, and client events under EMQX's, as pure functions of
what the node counts: the serving side (`serving.sys_topics`) gathers the numbers and publishes.

`SysTree.values` turns a `SysCounters` snapshot into `{topic: payload}`. The
`load/.../1min|5min|15min` values are mosquitto's: per-minute rates, each an exponentially
decayed moving average over its window, updated at every `$SYS` interval (`LoadAverage`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from operator import attrgetter
from typing import Final

from mop.protocols.mqtt.reason_codes import ReasonCode

SYS_BROKER: Final = "$SYS/broker/"
# The windows of the load averages: the topic's last level and its length in seconds.
LOAD_WINDOWS: Final = (("1min", 60.0), ("5min", 300.0), ("15min", 900.0))


@dataclass(frozen=True, slots=True)
class SysCounters:
    """What one node counts, at one moment (see README, "$SYS topics and events")."""

    uptime: float
    clients_connected: int
    # Persistent sessions whose client is away, among those whose timers run on this node.
    clients_disconnected: int
    clients_maximum: int
    clients_expired: int
    # Client connections admitted since the node started (CONNECT, Pulsar CONNECT).
    connections: int
    messages_received: int
    messages_sent: int
    messages_dropped: int
    bytes_received: int
    bytes_sent: int
    payload_bytes_received: int
    payload_bytes_sent: int
    retained_count: int
    stored_count: int
    stored_bytes: int
    subscriptions: int
    heap_current: int
    heap_maximum: int

    @property
    def clients_total(self) -> int:
        """Connected clients and persistent sessions whose client is away."""
        return self.clients_connected + self.clients_disconnected


# Topic (below `$SYS/broker/`) -> the counter it shows, as an integer.
COUNTER_TOPICS: Final = (
    ("bytes/received", "bytes_received"),
    ("bytes/sent", "bytes_sent"),
    ("clients/connected", "clients_connected"),
    ("clients/disconnected", "clients_disconnected"),
    ("clients/expired", "clients_expired"),
    ("clients/maximum", "clients_maximum"),
    ("clients/total", "clients_total"),
    ("heap/current", "heap_current"),
    ("heap/maximum", "heap_maximum"),
    ("messages/dropped", "messages_dropped"),
    ("messages/received", "messages_received"),
    ("messages/sent", "messages_sent"),
    ("messages/stored", "stored_count"),
    ("publish/bytes/received", "payload_bytes_received"),
    ("publish/bytes/sent", "payload_bytes_sent"),
    ("publish/messages/dropped", "messages_dropped"),
    ("publish/messages/received", "messages_received"),
    ("publish/messages/sent", "messages_sent"),
    ("retained messages/count", "retained_count"),
    ("store/messages/bytes", "stored_bytes"),
    ("store/messages/count", "stored_count"),
    ("subscriptions/count", "subscriptions"),
)
# Topic prefix (below `$SYS/broker/load/`, before the window) -> the counter whose rate it shows.
LOAD_TOPICS: Final = (
    ("bytes/received", "bytes_received"),
    ("bytes/sent", "bytes_sent"),
    ("connections", "connections"),
    ("messages/received", "messages_received"),
    ("messages/sent", "messages_sent"),
    ("publish/dropped", "messages_dropped"),
    ("publish/received", "messages_received"),
    ("publish/sent", "messages_sent"),
)
_COUNTERS: Final = tuple((SYS_BROKER + topic, attrgetter(name)) for topic, name in COUNTER_TOPICS)


class LoadAverage:
    """Moving averages of the per-minute rate of one counter, one per `LOAD_WINDOWS` window.

    Each update measures the rate since the previous one, r = increase x 60 / elapsed seconds,
    and moves each average a towards it: a <- r + (a - r) x exp(-elapsed / window). What was
    measured one window ago weighs 1/e of what it did, a steady rate brings every average to
    it, and an idle counter lets them decay towards 0, the 1 minute one first."""

    __slots__ = ("_at", "_count", "averages")

    def __init__(self, count: int, now: float) -> None:
        self._count = count
        self._at = now
        self.averages: tuple[float, ...] = (0.0,) * len(LOAD_WINDOWS)

    def update(self, count: int, now: float) -> tuple[float, ...]:
        """The averages once the counter reads `count` at `now` (seconds, any monotonic
        clock); nothing changes when no time has passed."""
        elapsed = now - self._at
        if elapsed <= 0:
            return self.averages
        rate = max(0, count - self._count) * 60.0 / elapsed
        self.averages = tuple(
            rate + (average - rate) * math.exp(-elapsed / window)
            for average, (_, window) in zip(self.averages, LOAD_WINDOWS, strict=True)
        )
        self._count = count
        self._at = now
        return self.averages


class SysTree:
    """The `$SYS/broker/...` values of a node: its version, its counters and the load averages
    of the counters, which it keeps from one `values` call to the next."""

    def __init__(self, version: str) -> None:
        self._version = version
        self._loads: dict[str, LoadAverage] = {}

    def values(self, counters: SysCounters, now: float) -> dict[str, str]:
        """Every topic with its payload once the node counts `counters` at `now` (seconds of
        a monotonic clock); call it once per `$SYS` interval, as the loads advance with it."""
        values = {
            SYS_BROKER + "version": self._version,
            SYS_BROKER + "uptime": f"{int(counters.uptime)} seconds",
        }
        values.update((topic, str(read(counters))) for topic, read in _COUNTERS)
        rates: dict[str, tuple[float, ...]] = {}
        for name in dict.fromkeys(name for _, name in LOAD_TOPICS):
            count: int = getattr(counters, name)
            load = self._loads.get(name)
            if load is None:
                load = self._loads[name] = LoadAverage(count, now)
            rates[name] = load.update(count, now)
        for prefix, name in LOAD_TOPICS:
            for (window, _), average in zip(LOAD_WINDOWS, rates[name], strict=True):
                values[f"{SYS_BROKER}load/{prefix}/{window}"] = f"{average:.2f}"
        return values


# --- client events -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientConnected:
    """A client whose CONNECT was accepted."""

    client_id: str
    username: str | None
    address: str  # the client's IP address
    port: int  # the node's port it connected to
    protocol_level: int
    keep_alive: int
    clean_start: bool
    expiry_interval: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class ClientDisconnected:
    """A connected client whose connection ended, and why (`disconnect_reason`)."""

    client_id: str
    username: str | None
    address: str
    port: int
    protocol_level: int
    reason: str
    at_ms: int


ClientEvent = ClientConnected | ClientDisconnected

# The reasons of `ClientDisconnected` that are not an MQTT reason code's name.
CLIENT_DISCONNECTED: Final = "normal"  # the client sent DISCONNECT
CONNECTION_CLOSED: Final = "closed"  # the connection ended without DISCONNECT
NODE_STOPPING: Final = "server_shutting_down"


def disconnect_reason(reason_code: int | None) -> str:
    """The reason of a disconnection the server decided with `reason_code` (the reason code of
    its DISCONNECT, e.g. "keep_alive_timeout", "session_taken_over"); `CONNECTION_CLOSED`
    without one."""
    if reason_code is None:
        return CONNECTION_CLOSED
    try:
        return ReasonCode(reason_code).name.lower()
    except ValueError:
        return f"0x{reason_code:02x}"


def topic_level(text: str) -> str:
    """`text` as one topic level of a topic name: "%", "/", "+" and "#" percent-encoded."""
    if not any(c in text for c in "%/+#"):
        return text
    return text.replace("%", "%25").replace("/", "%2F").replace("+", "%2B").replace("#", "%23")


def event_topic(node: str, event: ClientEvent) -> str:
    """EMQX's topic of a client event: `$SYS/brokers/{node}/clients/{clientid}/connected` (or
    `disconnected`), the client id made one topic level (`topic_level`)."""
    kind = "connected" if isinstance(event, ClientConnected) else "disconnected"
    return f"$SYS/brokers/{node}/clients/{topic_level(event.client_id)}/{kind}"


def event_payload(event: ClientEvent) -> bytes:
    """The JSON document of a client event, with EMQX's field names."""
    document: dict[str, object] = {
        "clientid": event.client_id,
        "username": event.username,
        "ipaddress": event.address,
        "sockport": event.port,
        "proto_name": "MQIsdp" if event.protocol_level == 3 else "MQTT",
        "proto_ver": event.protocol_level,
    }
    if isinstance(event, ClientConnected):
        document |= {
            "keepalive": event.keep_alive,
            "clean_start": event.clean_start,
            "expiry_interval": event.expiry_interval,
            "connected_at": event.at_ms,
        }
    else:
        document |= {"reason": event.reason, "disconnected_at": event.at_ms}
    document["ts"] = event.at_ms
    return json.dumps(document, separators=(",", ":")).encode()
