"""Token buckets: how many events (connections, messages, bytes) a source may have per second,
with a burst. Pure: the time comes in as a number of seconds from any monotonic clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["MIN_PAUSE", "ClientBudgets", "ClientLimits", "ClientRates", "Rate", "TokenBucket"]

# The read size a byte budget never goes below: a client is never read a few bytes at a time.
_MIN_READ: Final = 1024
# The shortest pause a client's budgets ask for: a smaller debt is carried until it is worth a
# pause, so that a client at a high rate is not put to sleep for each message.
MIN_PAUSE: Final = 0.01
# The most budgets of connections that ended `ClientBudgets` keeps (the oldest go first).
KEPT_BUDGETS: Final = 10_000


class TokenBucket:
    """`rate` tokens a second, at most `burst` saved up; it starts full.

    Two ways to spend: `take` spends only what is there (an event refused when the bucket is
    empty, such as a new connection); `charge` spends what was used already and may go into
    debt, answering how long the source must wait for the debt to be paid back (messages
    that were read, before the next read).
    """

    __slots__ = ("_stamp", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive (got {rate!r})")
        if not burst > 0:
            raise ValueError(f"burst must be positive (got {burst!r})")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._stamp = now

    @property
    def tokens(self) -> float:
        """Tokens left at the last `take` or `charge` (negative: in debt)."""
        return self._tokens

    def _refill(self, now: float) -> None:
        elapsed = now - self._stamp
        if elapsed > 0:
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
            self._stamp = now

    def take(self, now: float, amount: float = 1.0) -> bool:
        """Spend `amount` tokens if the bucket holds them (True); else spend nothing (False)."""
        self._refill(now)
        if self._tokens >= amount:
            self._tokens -= amount
            return True
        return False

    def charge(self, amount: float, now: float) -> float:
        """Spend `amount` tokens, into debt if need be; the seconds until the debt is paid
        back (0.0 when there is none)."""
        self._refill(now)
        self._tokens -= amount
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.rate

    def full_at(self, now: float) -> float:
        """When the bucket will be full again if nothing is spent (`now` when it is)."""
        self._refill(now)
        return now + (self.burst - self._tokens) / self.rate

    def copy(self, now: float) -> TokenBucket:
        """Another bucket with what this one holds at `now`, spent from apart from it."""
        self._refill(now)
        other = TokenBucket(self.rate, self.burst, now)
        other._tokens = self._tokens
        return other


@dataclass(frozen=True, slots=True)
class Rate:
    """`per_second` events a second with bursts of `burst` (0: one second's worth)."""

    per_second: float
    burst: float = 0.0

    def bucket(self, now: float) -> TokenBucket:
        burst = self.burst if self.burst > 0 else max(self.per_second, 1.0)
        return TokenBucket(self.per_second, burst, now)


class ClientRates:
    """One client's budgets of messages and of bytes received; `charge` says how long to hold
    the client back (not read from it, not take what was read) so that it keeps to both."""

    __slots__ = ("_bytes", "_messages")

    def __init__(self, messages: TokenBucket | None, nbytes: TokenBucket | None) -> None:
        self._messages = messages
        self._bytes = nbytes

    def charge(self, messages: int, nbytes: int, now: float) -> float:
        """Count `messages` messages and `nbytes` bytes received; the seconds to hold the
        client back before it goes on (0.0: go on; a debt under `MIN_PAUSE` is carried)."""
        wait = 0.0
        if messages and self._messages is not None:
            wait = self._messages.charge(messages, now)
        if nbytes and self._bytes is not None:
            wait = max(wait, self._bytes.charge(nbytes, now))
        return wait if wait >= MIN_PAUSE else 0.0

    def full_at(self, now: float) -> float:
        """When both budgets will be full again if nothing is spent (`now` when they are)."""
        return max(
            (bucket.full_at(now) for bucket in (self._messages, self._bytes) if bucket is not None),
            default=now,
        )

    def copy(self, now: float) -> ClientRates:
        """Other budgets with what these hold at `now`, spent from apart from them."""
        return ClientRates(
            self._messages.copy(now) if self._messages is not None else None,
            self._bytes.copy(now) if self._bytes is not None else None,
        )

    def read_size(self, largest: int) -> int:
        """How much to read at a time (at most `largest`): no more than the byte burst, so
        that one read never earns a pause much longer than a second."""
        if self._bytes is None:
            return largest
        return max(_MIN_READ, min(largest, int(self._bytes.burst)))


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The per-client rates of a node: messages and bytes a client may send a second."""

    messages: Rate | None = None
    nbytes: Rate | None = None

    @property
    def enabled(self) -> bool:
        return self.messages is not None or self.nbytes is not None

    def start(self, now: float) -> ClientRates | None:
        """The budgets of a new client (None when no rate is set)."""
        if not self.enabled:
            return None
        return ClientRates(
            self.messages.bucket(now) if self.messages is not None else None,
            self.nbytes.bucket(now) if self.nbytes is not None else None,
        )


class ClientBudgets:
    """The budgets of a node's clients, by what the adapter knows each client by (`key`).

    A client that connects again carries on with what its last connection left (its debt
    too) instead of a full budget, so that connecting again is no way around a rate. That
    connection may still be open: a client that gives up on a connection held back over its
    rates is seen to go only once the node reads from it again. The new one then starts
    from what the old one has now. Budgets of connections that ended are kept until they
    would be full again (a fresh one is the same then), `limit` at most, the oldest going
    first.
    """

    __slots__ = ("_kept", "_live", "limit", "limits")

    def __init__(self, limits: ClientLimits, limit: int = KEPT_BUDGETS) -> None:
        self.limits = limits
        self.limit = limit
        # key -> the budgets of its latest connection, while that is open.
        self._live: dict[str, ClientRates] = {}
        # key -> (budgets of its last connection, when they are full again), oldest first.
        self._kept: dict[str, tuple[ClientRates, float]] = {}

    def __len__(self) -> int:
        """Budgets kept of connections that ended."""
        return len(self._kept)

    def start(self, key: str, now: float) -> ClientRates | None:
        """The budgets of a connection of client `key` that starts sending now (None: no
        per-client rates)."""
        live = self._live.get(key)
        kept = self._kept.pop(key, None)
        rates: ClientRates | None
        if live is not None and live.full_at(now) > now:
            rates = live.copy(now)
        elif kept is not None and kept[1] > now:
            rates = kept[0]
        else:
            rates = self.limits.start(now)
            if rates is None:
                return None
        self._live[key] = rates
        return rates

    def end(self, key: str, rates: ClientRates | None, now: float) -> None:
        """The connection of client `key` whose budgets were `rates` ended."""
        if rates is None:
            return
        if self._live.get(key) is rates:
            del self._live[key]
        elif key in self._live:
            return  # a later connection of the client carries on
        kept = self._kept
        kept.pop(key, None)
        full_at = rates.full_at(now)
        if full_at > now:
            kept[key] = (rates, full_at)
        while kept:
            oldest = next(iter(kept))
            if len(kept) <= self.limit and kept[oldest][1] > now:
                break
            del kept[oldest]
