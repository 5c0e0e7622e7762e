"""A blocking MQTT client built on mop's own codec, for tests that need exact control over
the bytes on the wire (hostile input, missing acks, precise packet ids)."""

from __future__ import annotations

import socket
import time
from typing import Any

from mop.protocols.mqtt.codec import NeedData, PacketDecoder, encode
from mop.protocols.mqtt.packets import Connack, Connect, Packet

TIMEOUT = 10.0


OPEN_RAW_CLIENTS: list[RawClient] = []


class RawClient:
    def __init__(self, port: int, *, level: int = 5, host: str = "127.0.0.1") -> None:
        OPEN_RAW_CLIENTS.append(self)
        self.level = level
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.decoder = PacketDecoder(protocol_level=level)
        self.eof = False

    def send(self, packet: Packet) -> None:
        self.sock.sendall(encode(packet, self.level))

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, client_id: str = "raw", **fields: Any) -> Connack:
        self.send(Connect(client_id, protocol_level=self.level, **fields))
        packet = self.recv()
        assert isinstance(packet, Connack), packet
        return packet

    def recv(self, timeout: float = TIMEOUT) -> Packet | None:
        """The next packet, or None at end of stream; AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            packet = self.decoder.next_packet()
            if not isinstance(packet, NeedData):
                return packet
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            assert remaining > 0, "no packet in time"
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise AssertionError("no packet in time") from None
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
            else:
                self.decoder.feed(data)

    def recv_until_closed(self, timeout: float = TIMEOUT) -> list[Packet]:
        """Every packet up to the server closing the connection (which must happen in time)."""
        packets = []
        while True:
            packet = self.recv(timeout)
            if packet is None:
                return packets
            packets.append(packet)

    def close(self) -> None:
        self.sock.close()
