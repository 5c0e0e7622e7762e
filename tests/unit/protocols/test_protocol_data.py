"""What protocol handlers advertise (PIP-41's protocol data), with the ports bound for the URLs
whose settings said 0."""

from __future__ import annotations

import ssl
from typing import Any, cast

from mop.protocols.base import ProtocolHandler, protocol_data
from mop.transport import BoundListener, ListenerSpec


class Advertising:
    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls

    def advertised_data(self) -> dict[str, str]:
        return self.urls


def handlers(**urls: dict[str, str]) -> dict[str, ProtocolHandler]:
    return {name: cast(Any, Advertising(data)) for name, data in urls.items()}


def bound(name: str, kind: str, port: int) -> BoundListener:
    context = ssl.create_default_context() if kind in ("tls", "wss") else None
    spec = ListenerSpec(name, kind, "127.0.0.1", 0, ssl_context=context)
    return BoundListener(spec, "127.0.0.1", port)


def test_port_zero_becomes_the_port_bound_by_the_listener_of_the_url_kind() -> None:
    data = protocol_data(
        handlers(
            grpc={"grpc": "grpc://127.0.0.1:0", "grpc+tls": "grpc+tls://127.0.0.1:0"},
            mqtt={"mqtt": "mqtt://127.0.0.1:0", "ws": "ws://127.0.0.1:0/mqtt"},
        ),
        [
            bound("grpc", "tcp", 4001),
            bound("grpc", "tls", 4002),
            bound("mqtt", "tcp", 4003),
            bound("mqtt", "ws", 4004),
        ],
    )
    assert data == {
        "grpc": {"grpc": "grpc://127.0.0.1:4001", "grpc+tls": "grpc+tls://127.0.0.1:4002"},
        "mqtt": {"mqtt": "mqtt://127.0.0.1:4003", "ws": "ws://127.0.0.1:4004/mqtt"},
    }


def test_configured_ports_and_unbound_listeners_are_left_as_they_are() -> None:
    data = protocol_data(
        handlers(pulsar={"pulsar": "pulsar://[::1]:6650", "pulsar+ssl": "pulsar+ssl://h:0"}),
        [bound("pulsar", "tcp", 5000)],
    )
    assert data == {"pulsar": {"pulsar": "pulsar://[::1]:6650", "pulsar+ssl": "pulsar+ssl://h:0"}}
