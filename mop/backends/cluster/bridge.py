"""The bridge between pulsar-client's threads and trio (DESIGN.md section 6).

pulsar-client runs its own I/O and listener threads and reports completions through callbacks
on them. Nothing here blocks the trio thread: operations are started with the client's `*_async`
methods, and each callback only hands its result to the trio thread with
`TrioToken.run_sync_soon`, where trio-side state (events, buffers) is updated.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import _pulsar
import trio

from mop.processor.backend import BackendError, ProducerBusy, ProducerFenced, QuotaExceeded

__all__ = ["Bridge", "error_for", "ignore_result"]

log = logging.getLogger("mop.cluster")

Callback = Callable[..., None]

# pulsar-client results -> BackendError.reason (the ones with a class of their own are below).
_REASONS: Final[dict[Any, str]] = {
    _pulsar.Result.ConsumerBusy: "consumer_busy",
    _pulsar.Result.AlreadyClosed: "closed",
    _pulsar.Result.Timeout: "unavailable",
    _pulsar.Result.ConnectError: "unavailable",
    _pulsar.Result.NotConnected: "unavailable",
    _pulsar.Result.ServiceUnitNotReady: "unavailable",
    _pulsar.Result.LookupError: "unavailable",
    _pulsar.Result.TooManyLookupRequestException: "unavailable",
    _pulsar.Result.BrokerPersistenceError: "storage_error",
    _pulsar.Result.BrokerMetadataError: "storage_error",
    _pulsar.Result.ProducerQueueIsFull: "busy",
    _pulsar.Result.MemoryBufferIsFull: "busy",
    _pulsar.Result.MessageTooBig: "too_large",
    _pulsar.Result.InvalidTopicName: "invalid_topic",
    _pulsar.Result.TopicNotFound: "invalid_topic",
    _pulsar.Result.TopicTerminated: "closed",
    _pulsar.Result.AuthenticationError: "not_authorized",
    _pulsar.Result.AuthorizationError: "not_authorized",
    _pulsar.Result.SubscriptionNotFound: "not_found",
    _pulsar.Result.ConsumerNotFound: "not_found",
    _pulsar.Result.OperationNotSupported: "not_supported",
    _pulsar.Result.NotAllowedError: "not_supported",
    _pulsar.Result.CumulativeAcknowledgementNotAllowedError: "not_supported",
}
_QUOTA: Final = frozenset(
    {
        _pulsar.Result.ProducerBlockedQuotaExceededError,
        _pulsar.Result.ProducerBlockedQuotaExceededException,
    }
)


def error_for(result: Any, what: str) -> BackendError:
    """The BackendError for a failed pulsar-client operation described by `what`."""
    message = f"{what}: {getattr(result, 'name', result)}"
    if result in _QUOTA:
        return QuotaExceeded(message)
    if result == _pulsar.Result.ProducerBusy:
        return ProducerBusy(message)
    if result == _pulsar.Result.ProducerFenced:
        return ProducerFenced(message)
    return BackendError(message, reason=_REASONS.get(result, "unspecified"))


def ignore_result(*_: object) -> None:
    """A completion callback for operations whose outcome changes nothing (acks, closes)."""


class _Completion:
    __slots__ = ("abandoned", "cleanup", "event", "result", "value")

    def __init__(self, cleanup: Callable[[Any], None] | None) -> None:
        self.event = trio.Event()
        self.cleanup = cleanup
        self.abandoned = False
        self.result: Any = None
        self.value: Any = None

    def complete(self, result: Any, value: Any = None) -> None:
        self.result, self.value = result, value
        if self.abandoned and value is not None and self.cleanup is not None:
            # Its caller was cancelled: what it asked for (a consumer, say) is let go of.
            try:
                self.cleanup(value)
            except Exception:  # pragma: no cover - cleanup of an abandoned object
                log.debug("cleanup after a cancelled operation failed", exc_info=True)
        self.event.set()


class Bridge:
    """Runs pulsar-client completions and listener callbacks on one trio thread.

    Callbacks queue up and one `run_sync_soon` runs all that are waiting, so that a burst of
    completions (a batch of receipts, say) wakes the trio thread once, not once each.
    """

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._pending: deque[tuple[Callable[..., object], tuple[object, ...]]] = deque()
        self._scheduled = False

    def soon(self, fn: Callable[..., object], *args: object) -> None:
        """Run `fn(*args)` on the trio thread (callable from any thread); dropped once the
        trio run has ended."""
        # Append first, then look at the flag, which the trio side clears before it empties
        # the queue: whatever the interleaving, an appended call is run.
        self._pending.append((fn, args))
        if not self._scheduled:
            self._scheduled = True
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._run_pending)

    def _run_pending(self) -> None:
        self._scheduled = False
        pending = self._pending
        while pending:
            fn, args = pending.popleft()
            try:
                fn(*args)
            except Exception:  # an error here would take the whole trio run down
                log.exception("a pulsar-client callback failed")

    async def call(
        self,
        start: Callable[[Callback], object],
        what: str,
        *,
        cleanup: Callable[[Any], None] | None = None,
    ) -> Any:
        """Start an operation with `start(callback)` and wait for its completion.

        pulsar-client calls `callback(result)` or `callback(result, value)`; this returns the
        value, or raises the BackendError for a result that is not Ok. If the waiting task is
        cancelled, a value that arrives later is passed to `cleanup`.
        """
        done = _Completion(cleanup)

        def callback(result: Any, value: Any = None) -> None:
            self.soon(done.complete, result, value)

        try:
            start(callback)
        except _pulsar.PulsarException as exc:
            raise BackendError(f"{what}: {exc}") from exc
        try:
            await done.event.wait()
        except BaseException:
            done.abandoned = True
            raise
        # pulsar-client may keep `callback` (and so `done`) as long as the object it made
        # lives, e.g. a reader keeps its creation callback: a value left in `done` would be a
        # cycle through C++ that keeps the reader, and the client's threads, alive for good.
        value, done.value = done.value, None
        if done.result != _pulsar.Result.Ok:
            raise error_for(done.result, what)
        return value
