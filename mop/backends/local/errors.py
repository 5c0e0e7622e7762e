"""How the local backend turns broker and storage errors into the errors of the backend
contract."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mop.broker import BrokerError
from mop.broker import ProducerBusy as BrokerProducerBusy
from mop.broker import ProducerFenced as BrokerProducerFenced
from mop.broker.storage import StorageError, StorageFull
from mop.processor.backend import BackendError, ProducerBusy, ProducerFenced, QuotaExceeded

__all__ = ["translate", "translated"]


def translate(exc: StorageError | BrokerError) -> BackendError:
    """The error of the backend contract for a broker or storage error."""
    if isinstance(exc, StorageFull):
        return QuotaExceeded(str(exc))
    if isinstance(exc, StorageError):
        return BackendError(str(exc), reason="storage_error")
    if isinstance(exc, BrokerProducerBusy):
        return ProducerBusy(str(exc))
    if isinstance(exc, BrokerProducerFenced):
        return ProducerFenced(str(exc))
    return BackendError(str(exc), reason=exc.reason)


@contextmanager
def translated() -> Iterator[None]:
    """Turn broker and storage errors into the errors of the backend contract (hot paths
    call `translate` in a plain try statement instead: a context manager costs more)."""
    try:
        yield
    except (StorageError, BrokerError) as exc:
        raise translate(exc) from exc
