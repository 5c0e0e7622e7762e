"""The helper tasks of one connection (deliveries, on-demand writers, watchers), run in the
nursery its own task runs in rather than in a nursery of its own.

A nursery per connection costs about a kilobyte (its cancel status and task sets) on every
connection, also on the many idle ones that never start a helper task. `ConnectionTasks` keeps
the nursery's rules at a fraction of that, and nothing at all until a first task starts: the
tasks end before the connection goes on once `aclose` returns, and a task that fails ends its
connection (it cancels the connection's `cancel_on_error` scope, then `error` says why)
instead of reaching the shared nursery, which serves other connections too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

__all__ = ["ConnectionTasks"]


class ConnectionTasks:
    __slots__ = ("_cancel_on_error", "_closing", "_ended", "_nursery", "_scopes", "error")

    def __init__(self, cancel_on_error: trio.CancelScope) -> None:
        """Tasks of the calling task's connection, started beside it (in its parent
        nursery); `cancel_on_error` (the connection's own work) is cancelled when the first
        of them fails. A scope rather than a callback: no bound method per connection."""
        nursery = trio.lowlevel.current_task().parent_nursery
        assert nursery is not None, "a connection task runs in a nursery"
        self._nursery = nursery
        self._cancel_on_error = cancel_on_error
        # The scope of each task still running; made with the first task.
        self._scopes: set[trio.CancelScope] | None = None
        # Set once none are left, for `aclose`; made when it waits.
        self._ended: trio.Event | None = None
        # What the first task that failed raised.
        self.error: Exception | None = None
        # Set by `cancel`: a task started later starts cancelled, as in a nursery whose scope
        # is cancelled, so that none outlives the connection in the shared nursery.
        self._closing = False

    def start_soon(
        self, async_fn: Callable[[], Awaitable[object]], scope: trio.CancelScope | None = None
    ) -> None:
        """Run `async_fn()` in `scope` (its own when None), which cancelling ends it."""
        if scope is None:
            scope = trio.CancelScope()
        if self._scopes is None:
            self._scopes = set()
        self._scopes.add(scope)
        if self._closing:  # the connection is ending: nothing new runs
            scope.cancel()
        # Named after what it runs (a delivery, a writer), not after this wrapper.
        self._nursery.start_soon(self._run, async_fn, scope, name=async_fn)

    async def _run(
        self, async_fn: Callable[[], Awaitable[object]], scope: trio.CancelScope
    ) -> None:
        try:
            with scope:
                await async_fn()
        except Exception as exc:
            if self.error is None:
                self.error = exc
                self.cancel()
                self._cancel_on_error.cancel()
        finally:
            scopes = self._scopes
            assert scopes is not None
            scopes.discard(scope)
            if not scopes and self._ended is not None:
                self._ended.set()

    def cancel(self) -> None:
        """Cancel every task still running, and any started from now on."""
        self._closing = True
        for scope in self._scopes or ():
            scope.cancel()

    async def aclose(self) -> None:
        """Cancel every task and return once none is left (as a nursery's end does)."""
        self.cancel()
        while self._scopes:
            self._ended = trio.Event()
            await self._ended.wait()
        self._ended = None
