"""How the local backend turns broker and storage errors into the errors of the backend
contract (a refused producer is told with the shared `ProducerBusy` / `ProducerFenced`, which
need no translation)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from mop.broker import BrokerError
from mop.broker.storage import StorageError, StorageFull
from mop.messaging import BackendError, QuotaExceeded

__all__ = ["translate", "translated"]


def translate(exc: StorageError | BrokerError) -> BackendError:
    """The error of the backend contract for a broker or storage error."""
    if isinstance(exc, StorageFull):
        return QuotaExceeded(str(exc))
    if isinstance(exc, StorageError):
        return BackendError(str(exc), reason="storage_error")
    return BackendError(str(exc), reason=exc.reason)


@contextmanager
def translated() -> Iterator[None]:
    """Turn broker and storage errors into the errors of the backend contract (hot paths
    call `translate` in a plain try statement instead: a context manager costs more)."""
    try:
        yield
    except (StorageError, BrokerError) as exc:
        raise translate(exc) from exc
