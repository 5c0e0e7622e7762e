"""The protocol-neutral core: the processor and the backend contract it delegates to."""

from mop.processor.backend import (
    Backend,
    BackendCapabilities,
    BackendError,
    BatchPublisher,
    ClientLease,
    Consumer,
    ConsumerClosed,
    CursorPosition,
    DropNotifier,
    FenceNotifier,
    Producer,
    ProducerAccess,
    ProducerBusy,
    ProducerFenced,
    ProducerSpec,
    PublishResult,
    QuotaExceeded,
    StartPosition,
    SubscriptionKind,
    SubscriptionSpec,
    Table,
)
from mop.processor.processor import (
    ClientContext,
    ConnectionLimitReached,
    CountedProducer,
    MessagingProcessor,
    ProcessorStats,
)

__all__ = [
    "Backend", "BackendCapabilities", "BackendError", "BatchPublisher", "ClientContext",
    "ClientLease",
    "ConnectionLimitReached", "Consumer", "ConsumerClosed", "CountedProducer", "CursorPosition",
    "DropNotifier", "FenceNotifier", "MessagingProcessor",
    "ProcessorStats", "Producer", "ProducerAccess", "ProducerBusy", "ProducerFenced",
    "ProducerSpec", "PublishResult", "QuotaExceeded", "StartPosition", "SubscriptionKind",
    "SubscriptionSpec", "Table",
]
