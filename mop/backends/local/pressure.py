"""`SubscriberPressure`: publishers wait for the subscribers their messages queue for, instead
of those subscribers' QoS 0 messages being dropped.

A message that finds a subscription's consumers with full receive queues waits in the
subscription's backlog. While that backlog holds at most `max_bytes` (of payloads), the publish
that put it there returns only once the subscriber took it down to nothing; the publisher's
connection is not read meanwhile, so TCP pushes back on the client. A subscriber that takes
nothing for `stall_timeout` seconds while publishers wait, and is not waiting to (its consumer
busy with what it took: its client does not read), is stalled: nobody waits for it until it
takes messages again, and its backlog is bounded by the subscription's `max_backlog` rule
as before (the drops are counted there). So a stalled subscriber holds publishers back once,
for `stall_timeout`, and a subscriber that disconnects releases them at once. A publisher never
waits for its own subscriptions: it would not read the acknowledgements they wait for.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import trio

from mop.broker import Subscription

__all__ = ["DEFAULT_SUBSCRIBER_MAX_BYTES", "DEFAULT_SUBSCRIBER_STALL_TIMEOUT", "SubscriberPressure"]

log = logging.getLogger("mop.local")

# The defaults of `limits.subscriber_backlog_bytes` and `limits.subscriber_stall_timeout`.
DEFAULT_SUBSCRIBER_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_SUBSCRIBER_STALL_TIMEOUT = 1.0


class SubscriberPressure:
    __slots__ = ("_drained", "_progress", "_stalled", "max_bytes", "stall_timeout")

    def __init__(self, max_bytes: int, stall_timeout: float) -> None:
        self.max_bytes = max_bytes  # 0: nobody waits (the backlog rule alone bounds it)
        self.stall_timeout = stall_timeout
        # Of the subscriptions publishers wait for: set once nobody needs to wait any more
        # (backlog taken, stalled, or a consumer gone), and when each last took messages.
        self._drained: dict[Subscription, trio.Event] = {}
        self._progress: dict[Subscription, float] = {}
        self._stalled: set[Subscription] = set()

    def may_hold_back(self, sub: Subscription, producer: str) -> bool:
        """Whether the publisher `producer` (a client id) of a message that queues for `sub`
        is to wait for it: `sub` has consumers, none of them the publisher's own, is not
        stalled, and its backlog is within `max_bytes`."""
        attachments = sub.attachments
        if not attachments or sub in self._stalled:
            return False
        if producer and any(att.member == producer for att in attachments):
            return False
        return sub.queued_bytes() <= self.max_bytes

    def _holds_back(self, sub: Subscription) -> bool:
        """Whether a publisher still waits for `sub`: consumers, not stalled, and a backlog
        within `max_bytes`."""
        if not sub.attachments or sub in self._stalled:
            return False
        queued = sub.queued_bytes()
        return 0 < queued <= self.max_bytes

    async def wait_for(self, subs: Iterable[Subscription]) -> None:
        """Return once none of `subs` holds a publisher back; one that takes nothing for
        `stall_timeout` meanwhile is marked stalled."""
        for sub in subs:
            while self._holds_back(sub):
                drained = self._drained.get(sub)
                if drained is None:
                    drained = self._drained[sub] = trio.Event()
                    self._progress[sub] = trio.current_time()
                with trio.move_on_at(self._progress[sub] + self.stall_timeout):
                    await drained.wait()
                if drained.is_set():
                    continue
                now = trio.current_time()
                if now < self._progress[sub] + self.stall_timeout:
                    continue  # it took messages meanwhile
                if any(att.receiving for att in sub.attachments):
                    # Woken for its messages, but not run yet: the loop is busy (with the
                    # publishers of one round, say), the subscriber is not stalled.
                    self._progress[sub] = now
                    continue
                self._stalled.add(sub)
                self._release(sub)
                # Once per stall (it ends with a take), not per message: its drops are
                # counted and logged where the backlog rule drops.
                log.info(
                    "subscription %r took nothing for %.1f s: stalled, publishers no longer "
                    "wait for it",
                    sub.name,
                    self.stall_timeout,
                )

    def taken(self, sub: Subscription) -> None:
        """`sub`'s consumer took messages: it is not stalled, and who waits for it goes on
        once its backlog is empty."""
        if not self._drained and not self._stalled:
            return  # nobody waits for anyone: the usual case, once per take
        self._stalled.discard(sub)
        if sub in self._drained:
            if sub.queued_bytes():
                self._progress[sub] = trio.current_time()
            else:
                self._release(sub)

    def detached(self, sub: Subscription) -> None:
        """A consumer of `sub` left: whoever waits for it looks again (it may have none)."""
        self._release(sub)
        if not sub.attachments:
            self._stalled.discard(sub)

    def _release(self, sub: Subscription) -> None:
        drained = self._drained.pop(sub, None)
        self._progress.pop(sub, None)
        if drained is not None:
            drained.set()
