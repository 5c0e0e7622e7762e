"""The node's totals in one document: connections, messages, bytes, sessions, subscriptions,
retained messages, uptime and memory. Counters are cumulative since the node started; a page
computes rates from two polls. The connection and message counts are the processor's (the sums
of its per-protocol counters, as in `$SYS` and the metrics)."""

from __future__ import annotations

import psutil

from mop.admin.context import AdminContext
from mop.admin.http import Request, Response, Router, json_response

# The protocols every document names, connected or not (a page need not test for keys).
_PROTOCOLS = ("mqtt", "pulsar")


def add_stats_routes(router: Router, context: AdminContext) -> None:
    process = psutil.Process()

    async def stats(_request: Request) -> Response:
        processor = context.processor.stats
        by_protocol = dict.fromkeys(_PROTOCOLS, 0)
        for name, protocol in list(processor.protocols.items()):
            by_protocol[name] = protocol.connections
        sessions = subscriptions = shared = retained = 0
        for view in context.views().values():
            if view.sessions is not None:
                for session in view.sessions.sessions():
                    sessions += 1
                    subscriptions += len(session.subscriptions)
                    shared += sum(1 for s in session.subscriptions if s.group is not None)
            else:
                subscriptions += sum(client.subscriptions for client in view.clients())
            if view.retained is not None:
                retained += len(view.retained)
        return json_response(
            {
                "connections": processor.connections,
                "connections_by_protocol": by_protocol,
                "messages_received": processor.messages_received,
                "messages_sent": processor.messages_sent,
                "messages_dropped": processor.messages_dropped,
                "bytes_received": processor.bytes_received,
                "bytes_sent": processor.bytes_sent,
                "sessions": sessions,
                "subscriptions": subscriptions,
                "shared_subscriptions": shared,
                "retained": retained,
                "uptime": processor.uptime,
                "memory_rss": process.memory_info().rss,
            }
        )

    router.add("GET", "/api/v1/stats", stats)
