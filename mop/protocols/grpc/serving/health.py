"""The standard gRPC health service (grpc.health.v1.Health), for load balancers and Kubernetes
probes: Check answers at once, Watch streams the status and then every change of it.

Service "" is the node; the node's own services answer for themselves (List gives them all);
any other name is NOT_FOUND (Check) or SERVICE_UNKNOWN (Watch), as the protocol says. The node
serves while the processor is ready (`processor.not_ready()` is empty: a separated proxy has
reached its brokers) and it is not closing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Final

import trio
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from mop.protocols.grpc.serving.calls import Call, MethodHandler
from mop.protocols.grpc.status import GrpcError, StatusCode

__all__ = ["HEALTH_SERVICE", "health_methods"]

HEALTH_SERVICE: Final = "grpc.health.v1.Health"
_SERVING: Final[int] = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING: Final[int] = health_pb2.HealthCheckResponse.NOT_SERVING
_UNKNOWN_SERVICE: Final[int] = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
# How often Watch looks again at the node's readiness, which has no change notification.
WATCH_INTERVAL: Final = 0.5


def health_methods(
    serving: Callable[[], bool], services: Collection[str]
) -> dict[str, MethodHandler]:
    """The Health service's handlers: `serving()` says whether the node serves now;
    `services` are the names (besides "") that are known."""
    known = frozenset(services) | {""}

    def status_of(service: str) -> int:
        if service not in known:
            return _UNKNOWN_SERVICE
        return _SERVING if serving() else _NOT_SERVING

    async def check(call: Call) -> None:
        request = await _request(call)
        status = status_of(request.service)
        if status == _UNKNOWN_SERVICE:
            raise GrpcError(StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        await call.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())

    async def watch(call: Call) -> None:
        request = await _request(call)
        last = None
        while True:
            status = status_of(request.service)
            if status != last:
                await call.send(health_pb2.HealthCheckResponse(status=status).SerializeToString())
                last = status
            await trio.sleep(WATCH_INTERVAL)

    async def list_all(call: Call) -> None:
        data = await call.receive()
        if data is None:
            raise GrpcError(StatusCode.INVALID_ARGUMENT, "no HealthListRequest")
        response = health_pb2.HealthListResponse()
        for service in sorted(known):
            response.statuses[service].status = status_of(service)
        await call.send(response.SerializeToString())

    return {
        f"/{HEALTH_SERVICE}/Check": check,
        f"/{HEALTH_SERVICE}/Watch": watch,
        f"/{HEALTH_SERVICE}/List": list_all,
    }


async def _request(call: Call) -> health_pb2.HealthCheckRequest:
    data = await call.receive()
    if data is None:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, "no HealthCheckRequest")
    try:
        return health_pb2.HealthCheckRequest.FromString(data)
    except DecodeError as exc:
        raise GrpcError(StatusCode.INVALID_ARGUMENT, f"bad HealthCheckRequest: {exc}") from None
