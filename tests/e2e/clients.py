"""A thin synchronous wrapper around paho-mqtt for end-to-end tests: every call waits for its
acknowledgement (bounded), received messages land in a queue."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

TIMEOUT = 10.0
VERSIONS = {
    5: MQTTProtocolVersion.MQTTv5,
    4: MQTTProtocolVersion.MQTTv311,
    3: MQTTProtocolVersion.MQTTv31,
}


@dataclass
class Received:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    properties: Any
    mid: int


@dataclass
class Connack:
    reason_code: int
    session_present: bool
    properties: Any


@dataclass
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    result: Any = None


def props(packet_type: int = PacketTypes.PUBLISH, **values: Any) -> Properties:
    p = Properties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


# Every client made by a test, closed by the `close_clients` fixture after the test.
OPEN_CLIENTS: list[Client] = []


def session_present(client: Client) -> bool:
    """Whether the server resumed a session (the CONNECT must have succeeded)."""
    assert client.connack is not None and client.connack.reason_code == 0, client.connack
    return client.connack.session_present


def close_all() -> None:
    while OPEN_CLIENTS:
        OPEN_CLIENTS.pop().close()


class Client:
    def __init__(
        self,
        port: int,
        client_id: str = "",
        *,
        version: int = 5,
        clean: bool = True,
        keepalive: int = 60,
        will: tuple[str, bytes, int, bool] | None = None,
        will_properties: Properties | None = None,
        connect_properties: Properties | None = None,
        username: str | None = None,
        password: str | None = "secret",
        transport: str = "tcp",
        host: str = "127.0.0.1",
        connect: bool = True,
        manual_ack: bool = False,
        tls: dict[str, Any] | None = None,
    ) -> None:
        self.port = port
        self.host = host
        self.version = version
        self.messages: queue.Queue[Received] = queue.Queue()
        self.disconnects: queue.Queue[int] = queue.Queue()
        self._connack: _Waiter = _Waiter()
        self._acks: dict[int, _Waiter] = {}
        self._lock = threading.Lock()
        kwargs: dict[str, Any] = {}
        if version != 5:
            kwargs["clean_session"] = clean
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=VERSIONS[version],
            transport=transport,  # type: ignore[arg-type]
            reconnect_on_failure=False,
            manual_ack=manual_ack,
            **kwargs,
        )
        if tls is not None:
            self.client.tls_set(**tls)
        if username is not None:
            self.client.username_pw_set(username, password)
        if will is not None:
            self.client.will_set(*will, properties=will_properties)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = self._on_unsubscribe
        self.client.on_publish = self._on_publish
        self.client.on_disconnect = self._on_disconnect
        self.clean = clean
        self.keepalive = keepalive
        self.connect_properties = connect_properties
        self.connack: Connack | None = None
        OPEN_CLIENTS.append(self)
        if connect:
            self.connect()

    # -- callbacks (paho's network thread) ---------------------------------------------------

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, properties: Any) -> None:
        self._connack.result = Connack(int(rc.value), bool(flags.session_present), properties)
        self._connack.event.set()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        self.messages.put(
            Received(
                msg.topic,
                msg.payload,
                msg.qos,
                bool(msg.retain),
                bool(msg.dup),
                getattr(msg, "properties", None),
                msg.mid,
            )
        )

    def _ack(self, mid: int, result: Any) -> None:
        with self._lock:
            waiter = self._acks.setdefault(mid, _Waiter())
        waiter.result = result
        waiter.event.set()

    def _on_subscribe(
        self, client: Any, userdata: Any, mid: int, codes: Any, properties: Any
    ) -> None:
        self._ack(mid, [int(c.value) for c in codes])

    def _on_unsubscribe(
        self, client: Any, userdata: Any, mid: int, codes: Any, properties: Any
    ) -> None:
        self._ack(mid, [int(c.value) for c in codes] if codes else [])

    def _on_publish(self, client: Any, userdata: Any, mid: int, rc: Any, properties: Any) -> None:
        self._ack(mid, int(rc.value))

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, rc: Any, properties: Any
    ) -> None:
        self.disconnects.put(int(rc.value))

    def _wait(self, mid: int) -> Any:
        with self._lock:
            waiter = self._acks.setdefault(mid, _Waiter())
        assert waiter.event.wait(TIMEOUT), f"no acknowledgement for message id {mid}"
        return waiter.result

    # -- API --------------------------------------------------------------------------------

    def connect(self) -> Connack:
        kwargs: dict[str, Any] = {
            "keepalive": self.keepalive,
            "properties": self.connect_properties,
        }
        if self.version == 5:
            kwargs["clean_start"] = self.clean
        self._connack = _Waiter()
        self.client.connect(self.host, self.port, **kwargs)
        self.client.loop_start()
        assert self._connack.event.wait(TIMEOUT), "no CONNACK"
        self.connack = self._connack.result
        return self.connack  # type: ignore[return-value]

    def subscribe(
        self, topic: str, qos: int = 0, *, properties: Properties | None = None, **options: Any
    ) -> list[int]:
        if self.version == 5:
            opts = SubscribeOptions(qos=qos, **options)
            _, mid = self.client.subscribe(topic, options=opts, properties=properties)
        else:
            _, mid = self.client.subscribe(topic, qos)
        return self._wait(mid)  # type: ignore[no-any-return]

    def unsubscribe(self, topic: str) -> list[int]:
        _, mid = self.client.unsubscribe(topic)
        return self._wait(mid)  # type: ignore[no-any-return]

    def publish(
        self,
        topic: str,
        payload: bytes | str = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> int:
        """Publish and wait for the flow to complete; the v5 reason code (0 for QoS 0)."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        if qos == 0:
            info.wait_for_publish(TIMEOUT)
            return 0
        return self._wait(info.mid)  # type: ignore[no-any-return]

    def reason_code(self, mid: int) -> int:
        """The v5 reason code of the acknowledgement of QoS 1 message `mid` (waited for)."""
        return self._wait(mid)  # type: ignore[no-any-return]

    def expect(self, count: int = 1, timeout: float = TIMEOUT) -> list[Received]:
        got = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"expected {count} messages, got {len(got)}: {got}"
            try:
                got.append(self.messages.get(timeout=remaining))
            except queue.Empty:
                continue
        return got

    def expect_none(self, wait: float = 0.3) -> None:
        try:
            extra = self.messages.get(timeout=wait)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {extra}")

    def disconnect(self, reason_code: int = 0, properties: Properties | None = None) -> None:
        if self.version == 5:
            from paho.mqtt.reasoncodes import ReasonCode

            self.client.disconnect(
                ReasonCode(PacketTypes.DISCONNECT, identifier=reason_code), properties
            )
        else:
            self.client.disconnect()
        self.client.loop_stop()

    def close(self) -> None:
        """Stop the network loop and close the socket (quietly; for test teardown)."""
        self.client.loop_stop()
        # paho keeps its socket and a wake-up socket pair until garbage collection; close them
        # now so no test leaks descriptors into the next one.
        self.client._reset_sockets()

    def drop(self) -> None:
        """Close the socket without DISCONNECT (an abnormal disconnect)."""
        sock = self.client.socket()
        self.client.loop_stop()
        if sock is not None:
            sock.close()
