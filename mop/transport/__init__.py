"""Transports: TCP, TLS and WebSocket listeners that hand protocol adapters a plain
``trio.abc.Stream`` and a ``ConnectionInfo``; the only layer that deals with sockets.
"""

from mop.transport.connection_tasks import ConnectionTasks
from mop.transport.direct import Receive, Send, read_ready, receiver, sender
from mop.transport.listeners import (
    BoundListener,
    ConnectionInfo,
    Handler,
    ListenerSpec,
    OpenListeners,
    open_listeners,
    serve_listener,
    serve_listeners,
    serve_open_listeners,
)
from mop.transport.outbound import OutboundBuffer
from mop.transport.tls import (
    listener_ssl_context,
    peer_certificate_info,
    server_ssl_context,
)
from mop.transport.websocket import WebSocketHandshakeError, WebSocketStream, accept_websocket

__all__ = [
    "BoundListener",
    "ConnectionInfo",
    "ConnectionTasks",
    "Handler",
    "ListenerSpec",
    "OpenListeners",
    "OutboundBuffer",
    "Receive",
    "Send",
    "WebSocketHandshakeError",
    "WebSocketStream",
    "accept_websocket",
    "peer_certificate_info",
    "read_ready",
    "receiver",
    "sender",
    "serve_listener",
    "serve_listeners",
    "listener_ssl_context",
    "open_listeners",
    "serve_open_listeners",
    "server_ssl_context",
]
