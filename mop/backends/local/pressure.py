"""`SubscriberPressure`: publishers wait for the subscribers their messages queue for, instead
of those subscribers' QoS 0 messages being dropped.

A message that finds a subscription's consumers with full receive queues waits in the
subscription's backlog. While that backlog holds at most `max_bytes` (of payloads), the publish
that put it there returns only once the subscriber took it down to nothing; the publisher's
connection is not read meanwhile, so TCP pushes back on the client. A subscriber that takes
nothing for `stall_timeout` seconds while publishers wait is stalled: nobody waits for it any
more until its backlog is empty again, and its backlog is bounded by the subscription's
`max_backlog` rule as before (the drops are counted there). So one stalled subscriber holds each
publisher back once, for `stall_timeout`, and a subscriber that disconnects releases everyone.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from mop.broker import Subscription

__all__ = ["DEFAULT_SUBSCRIBER_MAX_BYTES", "DEFAULT_SUBSCRIBER_STALL_TIMEOUT", "SubscriberPressure"]

# The defaults of `limits.subscriber_backlog_bytes` and `limits.subscriber_stall_timeout`.
DEFAULT_SUBSCRIBER_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_SUBSCRIBER_STALL_TIMEOUT = 1.0


class SubscriberPressure:
    __slots__ = ("_progress", "_stalled", "max_bytes", "stall_timeout")

    def __init__(self, max_bytes: int, stall_timeout: float) -> None:
        self.max_bytes = max_bytes  # 0: nobody waits (the backlog rule alone bounds it)
        self.stall_timeout = stall_timeout
        # Set when a subscription somebody waits for takes messages, or loses a consumer.
        self._progress: dict[Subscription, trio.Event] = {}
        self._stalled: set[Subscription] = set()

    def may_hold_back(self, sub: Subscription) -> bool:
        """Whether a publisher whose messages queue for `sub` is to wait for it: it has
        consumers, is not stalled and its backlog is within `max_bytes`."""
        if not sub.attachments or sub in self._stalled:
            return False
        return sub.queued_bytes() <= self.max_bytes

    def holds_back(self, sub: Subscription) -> bool:
        """Whether a publisher still waits for `sub`: as `may_hold_back`, with a backlog."""
        if not sub.attachments or sub in self._stalled:
            return False
        queued = sub.queued_bytes()
        return 0 < queued <= self.max_bytes

    async def wait_for(self, subs: Iterable[Subscription]) -> None:
        """Return once none of `subs` holds a publisher back (`holds_back`); a subscription
        that takes nothing for `stall_timeout` meanwhile is marked stalled."""
        for sub in subs:
            while self.holds_back(sub):
                event = self._progress.get(sub)
                if event is None:
                    event = self._progress[sub] = trio.Event()
                with trio.move_on_after(self.stall_timeout):
                    await event.wait()
                if not event.is_set():
                    self._stalled.add(sub)
                    if self._progress.get(sub) is event:
                        del self._progress[sub]
                    event.set()  # the others waiting for it go on as well

    def taken(self, sub: Subscription) -> None:
        """`sub`'s consumer took messages: wake who waits for it; an empty backlog ends a
        stall."""
        if not self._progress and not self._stalled:
            return  # nobody waits for anyone: the usual case, once per take
        event = self._progress.pop(sub, None)
        if event is not None:
            event.set()
        if self._stalled and sub in self._stalled and not sub.queued_bytes():
            self._stalled.discard(sub)

    def detached(self, sub: Subscription) -> None:
        """A consumer of `sub` left: whoever waits for it looks again (it may have none)."""
        event = self._progress.pop(sub, None)
        if event is not None:
            event.set()
        if not sub.attachments:
            self._stalled.discard(sub)
