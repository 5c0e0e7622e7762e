"""PulsarGrpcService (`mop_grpc.proto`): the method handlers of its produce, consume and send
paths, each call served as one client of the processor (never of a backend or the broker).
"""

from __future__ import annotations

from typing import Final

from mop.processor import MessagingProcessor
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.clients import PROTOCOL, Namespaces
from mop.protocols.grpc.serving.consuming import Consuming
from mop.protocols.grpc.serving.producing import Producing
from mop.settings import Settings

SERVICE: Final = "mop.grpc.v1.PulsarGrpcService"
PRODUCE: Final = f"/{SERVICE}/produce"
CONSUME: Final = f"/{SERVICE}/consume"
SEND: Final = f"/{SERVICE}/send"


def pulsar_methods(processor: MessagingProcessor, settings: Settings) -> dict[str, MethodHandler]:
    """The handlers of PulsarGrpcService's methods, by path."""
    namespaces = Namespaces(settings.default_tenant, settings.default_namespace)
    stats = processor.stats.protocol(PROTOCOL)
    producing = Producing(processor, namespaces)
    consuming = Consuming(processor, namespaces, stats)
    return {PRODUCE: producing.produce, CONSUME: consuming.consume, SEND: producing.send}


__all__ = ["CONSUME", "PRODUCE", "SEND", "SERVICE", "pulsar_methods"]
