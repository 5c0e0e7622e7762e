"""A blocking MQTT client built on mop's own codec, for tests that need exact control over
the bytes on the wire (hostile input, missing acks, precise packet ids), and the checks the
tests make on what it receives."""

from __future__ import annotations

import socket
import time
from typing import Any, Generic, TypeVar

from mop.protocols.mqtt.codec import NeedData, PacketDecoder, encode
from mop.protocols.mqtt.packets import Connack, Connect, Disconnect, Packet, Publish

TIMEOUT = 10.0


OPEN_RAW_CLIENTS: list[RawClient] = []

T = TypeVar("T")


class BlockingPeer(Generic[T]):
    """A blocking socket peer that decodes what it receives with one of mop's sans-IO
    decoders: subclasses say how to decode one item (None: more bytes needed) and feed bytes."""

    # What one decoded item is called in timeout messages.
    item_name = "item"

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.eof = False

    def _decode(self) -> T | None:
        raise NotImplementedError

    def _feed(self, data: bytes) -> None:
        raise NotImplementedError

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = TIMEOUT) -> T | None:
        """The next item, or None at end of stream; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            item = self._decode()
            if item is not None:
                return item
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {self.item_name} in time"
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no {self.item_name} in time") from None
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
            else:
                self._feed(data)

    def recv_until_closed(self, timeout: float = TIMEOUT) -> list[T]:
        """Everything up to the server closing the connection (which must happen in time)."""
        items = []
        while True:
            item = self.recv(timeout)
            if item is None:
                return items
            items.append(item)

    def close(self) -> None:
        self.sock.close()


class RawClient(BlockingPeer[Packet]):
    item_name = "packet"

    def __init__(self, port: int, *, level: int = 5, host: str = "127.0.0.1") -> None:
        super().__init__(socket.create_connection((host, port), timeout=TIMEOUT))
        OPEN_RAW_CLIENTS.append(self)
        self.level = level
        self.decoder = PacketDecoder(protocol_level=level)

    def _decode(self) -> Packet | None:
        packet = self.decoder.next_packet()
        return None if isinstance(packet, NeedData) else packet

    def _feed(self, data: bytes) -> None:
        self.decoder.feed(data)

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.level))

    def connect(self, client_id: str = "raw", **fields: Any) -> Connack:
        self.send(Connect(client_id, protocol_level=self.level, **fields))
        packet = self.recv()
        assert isinstance(packet, Connack), packet
        return packet


def recv_publish(client: RawClient) -> Publish:
    packet = client.recv()
    assert isinstance(packet, Publish), packet
    return packet


def assert_quiet(client: RawClient, wait: float = 0.5) -> None:
    """Nothing arrives from the server for `wait` seconds (and the connection stays open)."""
    try:
        packet = client.recv(timeout=wait)
    except AssertionError:
        return
    raise AssertionError(f"unexpected packet {packet!r}")


def closed_with(raw: RawClient, reason: int | None, timeout: float = 5.0) -> None:
    """The server closes the connection after a DISCONNECT with `reason` (None: nothing at all)."""
    packets = raw.recv_until_closed(timeout)
    if reason is None:
        assert packets == [], packets
    else:
        assert [type(p) for p in packets] == [Disconnect], packets
        disconnect = packets[0]
        assert isinstance(disconnect, Disconnect)
        assert disconnect.reason_code == reason, f"0x{disconnect.reason_code:02X}"
