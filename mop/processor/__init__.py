"""The protocol-neutral core: the processor and the backend contract it delegates to."""

from mop.processor.backend import (
    Backend,
    BackendError,
    ClientLease,
    Consumer,
    ConsumerClosed,
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
    MessagingProcessor,
    ProcessorStats,
)

__all__ = [
    "Backend", "BackendError", "ClientContext", "ClientLease", "ConnectionLimitReached",
    "Consumer", "ConsumerClosed", "MessagingProcessor", "ProcessorStats", "PublishResult",
    "QuotaExceeded", "StartPosition", "SubscriptionKind", "SubscriptionSpec", "Table",
]
