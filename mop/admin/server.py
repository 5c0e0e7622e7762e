"""Serving the admin application with hypercorn's trio worker."""

from __future__ import annotations

import logging
import socket
from functools import partial

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import LifespanState

from mop.admin.auth import AdminGuard
from mop.admin.context import AdminContext
from mop.admin.hosts import HostGuard
from mop.admin.http import AsgiApp, Router
from mop.admin.routes_bans import add_bans_routes
from mop.admin.routes_clients import add_clients_routes
from mop.admin.routes_docs import add_docs_routes
from mop.admin.routes_health import add_health_routes
from mop.admin.routes_logging import add_logging_routes
from mop.admin.routes_namespace_policies import add_backlog_quota_routes, add_retention_routes
from mop.admin.routes_page import add_page_routes
from mop.admin.routes_partitioned import add_partitioned_routes
from mop.admin.routes_publish import add_publish_routes
from mop.admin.routes_pulsar import add_pulsar_admin_routes
from mop.admin.routes_retained import add_retained_routes
from mop.admin.routes_schemas import add_schema_routes
from mop.admin.routes_sessions import add_sessions_routes
from mop.admin.routes_stats import add_stats_routes
from mop.admin.routes_topics import add_topic_routes
from mop.membership import Membership
from mop.transport import BoundListener, ListenerSpec

log = logging.getLogger("mop.admin")

ADMIN_LISTENER = "admin"


def build_admin_app(context: AdminContext) -> AsgiApp:
    router = Router()
    add_health_routes(router, context)
    add_stats_routes(router, context)
    add_clients_routes(router, context)
    add_sessions_routes(router, context)
    add_retained_routes(router, context)
    add_publish_routes(router, context)
    add_bans_routes(router, context)
    add_docs_routes(router, context)
    add_logging_routes(router, context)
    add_topic_routes(router, context)
    add_schema_routes(router, context)
    if context.retention is not None:
        # Before the topic routes of Pulsar's API, whose `{domain}/.../{topic}` also matches.
        add_retention_routes(router, context.retention, context.backlog_quotas)
    if context.backlog_quotas is not None:
        add_backlog_quota_routes(router, context.backlog_quotas, context.retention)
    if context.broker is not None:
        add_pulsar_admin_routes(router, context, context.broker)
    # A broker answers for the names it owns; a proxy passes every request on to its brokers.
    add_partitioned_routes(router, context, context.broker or Membership((), ""))
    add_page_routes(router, context)
    guard = AdminGuard(context.settings, context.processor)
    return AsgiApp(router, guard, hosts=HostGuard.of(context.settings.admin))


async def serve_admin(
    context: AdminContext,
    sock: socket.socket | None = None,
    *,
    task_status: trio.TaskStatus[BoundListener] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin API until cancelled on `sock` (from `bind_admin`, which it takes over),
    else on `admin.host`/`admin.port`; `started` gets the bound address (the real port when
    the setting is 0). OSError when it cannot bind.

    Each connection is hypercorn's (HTTP/1.1 with keep-alive, its timeouts), accepted here
    rather than by `hypercorn.trio.serve` so that it is `_AdminConnection`; the application's
    lifespan is a no-op (`AsgiApp`), so nothing runs it."""
    settings = context.settings.admin
    config = Config()
    config.accesslog = None
    config.errorlog = logging.getLogger("mop.admin.http")
    config.keep_alive_timeout = 30.0
    # AsgiApp takes ASGI's events as plain dicts, hypercorn names them as TypedDicts.
    app = ASGIWrapper(build_admin_app(context))  # type: ignore[arg-type]
    # Bound by us rather than by hypercorn, which leaks the socket of a failed bind.
    if sock is None:
        sock = bind_admin(settings.host, settings.port)
    with trio.socket.from_stdlib_socket(sock) as listening:
        listening.listen(config.backlog)
        bound_host, port = listening.getsockname()[:2]
        connection = partial(_AdminConnection, app, config, WorkerContext(None), LifespanState({}))
        spec = ListenerSpec(ADMIN_LISTENER, "tcp", settings.host, settings.port)
        task_status.started(BoundListener(spec, bound_host, port))
        await trio.serve_listeners(connection, [trio.SocketListener(listening)])


class _AdminConnection(TCPServer):
    """One HTTP connection, closed as soon as its client has closed its side. hypercorn's own
    keeps waiting for the next request of an idle connection whose client has gone, until the
    keep-alive timeout: a client that opens a connection per request (most tools do) would
    leave the node that many file descriptors for that long, which the MQTT and Pulsar
    listeners of the process need too."""

    async def _read_data(self) -> None:
        await super()._read_data()
        # Nothing more can be read: a request on its way has been told of the disconnection,
        # and an idle connection has nothing left to wait for.
        await self.idle_task.stop()


def bind_admin(host: str, port: int) -> socket.socket:
    """A socket bound to the admin listener's address (OSError when it cannot be), for
    `serve_admin`: a node binds it before it starts anything else."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock
