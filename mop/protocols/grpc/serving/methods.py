"""Every method the gRPC server serves, by path: the node's own services (the Pulsar service),
the health service and server reflection describing them all."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from mop.processor import MessagingProcessor
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.health import HEALTH_SERVICE, health_methods
from mop.protocols.grpc.serving.pulsar_service import pulsar_methods
from mop.protocols.grpc.serving.reflection import reflection_methods
from mop.settings import Settings

__all__ = ["grpc_methods", "services_of"]


def services_of(methods: Mapping[str, MethodHandler]) -> list[str]:
    """The full names of the services of `methods` ("/pkg.Service/Method" paths)."""
    return sorted({path.split("/")[1] for path in methods})


def grpc_methods(
    processor: MessagingProcessor,
    settings: Settings,
    serving: Callable[[], bool],
) -> dict[str, MethodHandler]:
    """The server's methods: PulsarGrpcService's, health's and reflection's; `serving()`
    says whether the node serves now (health)."""
    methods = pulsar_methods(processor, settings)
    services = services_of(methods)
    methods.update(health_methods(serving, [*services, HEALTH_SERVICE]))
    methods.update(reflection_methods([*services, HEALTH_SERVICE]))
    return methods
