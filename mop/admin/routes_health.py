"""Liveness, readiness, node information and the Prometheus scrape endpoint."""

from __future__ import annotations

import time

from mop.admin.context import AdminContext
from mop.admin.http import Request, Response, Router, json_response
from mop.protocols.base import protocol_data
from mop.version import VERSION


def add_health_routes(router: Router, context: AdminContext) -> None:
    async def healthz(_request: Request) -> Response:
        # The event loop answered: the process is alive.
        return json_response({"status": "ok"})

    async def readyz(_request: Request) -> Response:
        problems = context.not_ready()
        if problems:
            return json_response({"status": "not ready", "problems": problems}, 503)
        return json_response({"status": "ready"})

    async def metrics(_request: Request) -> Response:
        page = context.telemetry.prometheus()
        return Response(200, page.body, page.content_type)

    async def node(_request: Request) -> Response:
        settings = context.settings
        return json_response(
            {
                "version": VERSION,
                "mode": settings.mode,
                "protocols": list(context.protocols),
                "started_at": context.started_at,
                "uptime": time.time() - context.started_at,
                "tenant": settings.default_tenant,
                "namespace": settings.default_namespace,
                "listeners": [
                    {
                        "protocol": bound.spec.name,
                        "kind": bound.spec.kind,
                        "host": bound.host,
                        "port": bound.port,
                    }
                    for bound in context.listeners()
                ],
                # What each protocol advertises to clients (PIP-41's protocol data).
                "protocol_data": protocol_data(context.protocols, context.listeners()),
            }
        )

    # Load balancers and orchestrators ask with whatever Host they like.
    router.add("GET", "/healthz", healthz, public=True, any_host=True)
    router.add("GET", "/readyz", readyz, public=True, any_host=True)
    router.add("GET", "/metrics", metrics, public=True)
    router.add("GET", "/api/v1/node", node)
