"""What the hot path counts with: plain integers on objects it touches anyway, and latency
histograms that are a list of integers. Nothing here knows OpenTelemetry: `mop.observability`
reads these objects when a scrape or an export asks, so counting costs a few integer adds.

Also the names of the reasons counted (why a connection was refused or closed, why a message
was dropped), shared by every adapter so that each reason means one thing in the metrics.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from mop.messaging import QUEUE_FULL
from mop.security.identity import AuthFailure

__all__ = [
    "LATENCY_BOUNDS",
    "Closing",
    "Drop",
    "LatencyHistogram",
    "ProtocolStats",
    "Refusal",
    "drop_reason",
    "refusal_of",
]


class Refusal(StrEnum):
    """Why a client's connection was refused before it was admitted."""

    BAD_CREDENTIALS = "bad_credentials"  # wrong, unknown or expired credentials
    NOT_AUTHORIZED = "not_authorized"  # no credentials and anonymous refused, or denied
    BANNED = "banned"  # a ban, or too many failures lately
    LIMIT_REACHED = "limit_reached"  # the node serves its maximum of clients (or quota)
    RATE_LIMITED = "rate_limited"  # over its listener's connection rate
    PROTOCOL_ERROR = "protocol_error"  # a bad first packet, an unsupported version, ...
    UNAVAILABLE = "unavailable"  # the node cannot serve it now (brokers unreachable)
    TIMEOUT = "timeout"  # nothing usable arrived within the connect timeout


class Closing(StrEnum):
    """Why an admitted connection ended."""

    NORMAL = "normal"  # the client disconnected, or the connection was lost
    TAKEOVER = "takeover"  # another connection took the client id
    KEEP_ALIVE = "keep_alive"  # nothing arrived within the keep alive
    PROTOCOL_ERROR = "protocol_error"
    NOT_AUTHORIZED = "not_authorized"  # its credential expired or re-authentication failed
    ADMINISTRATIVE = "administrative"  # closed by the node (a ban)
    ERROR = "error"  # anything else (a session that could not be stored, ...)


class Drop(StrEnum):
    """Why a message was not published or not delivered."""

    NO_SUBSCRIBERS = "no_subscribers"  # published where no subscription took it
    QUEUE_FULL = "queue_full"  # a subscription's bounded queue was full
    EXPIRED = "expired"  # its message expiry passed before delivery
    TOO_LARGE = "too_large"  # larger than the client accepts
    DENIED = "denied"  # the ACL does not let the client publish there
    REFUSED = "refused"  # the backend refused it (disk full, quota)
    OVERLOADED = "overloaded"  # refused while the node is over its memory high-water mark
    ENCRYPTED = "encrypted"  # end-to-end encrypted by a Pulsar producer: not for MQTT clients


# A backend's reason for a drop (`DropNotifier`) -> the name counted.
_BACKEND_DROPS: Final = {QUEUE_FULL: Drop.QUEUE_FULL}


def drop_reason(backend_reason: str) -> str:
    """The name under which a drop a backend reports is counted."""
    return _BACKEND_DROPS.get(backend_reason, backend_reason.replace(" ", "_"))


_AUTH_REFUSALS: Final = {
    AuthFailure.BAD_CREDENTIALS: Refusal.BAD_CREDENTIALS,
    AuthFailure.EXPIRED: Refusal.BAD_CREDENTIALS,
    AuthFailure.NOT_AUTHORIZED: Refusal.NOT_AUTHORIZED,
    AuthFailure.BANNED: Refusal.BANNED,
}


def refusal_of(failure: AuthFailure) -> Refusal:
    """The refusal counted for a client the processor did not authenticate."""
    return _AUTH_REFUSALS[failure]


# Upper bounds (seconds) of the latency buckets: 0.25 ms to 10 s, about 2.5x apart.
LATENCY_BOUNDS: Final = (
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class LatencyHistogram:
    """Durations in fixed buckets: `counts[i]` holds those <= `bounds[i]` (and above the bound
    before), the last one those above every bound; with their `total` and extremes.

    `record` costs a bisect and a few adds. Where even that is too much per event, the caller
    samples: `due(events)` is true once every `every` events (a countdown, not a random draw),
    and only then does the caller take the time and record it.
    """

    __slots__ = ("_countdown", "bounds", "count", "counts", "every", "high", "low", "total")

    def __init__(self, bounds: Sequence[float] = LATENCY_BOUNDS, *, every: int = 1) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError("bucket bounds must increase")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0
        self.low = 0.0
        self.high = 0.0
        self.every = max(1, every)
        self._countdown = self.every

    def due(self, events: int = 1) -> bool:
        """Whether to time one of the `events` that just happened: true once per `every`
        events counted here."""
        countdown = self._countdown - events
        if countdown > 0:
            self._countdown = countdown
            return False
        self._countdown = self.every
        return True

    def sample_every(self, every: int) -> None:
        """Time one event in `every` from now on."""
        self.every = self._countdown = max(1, every)

    def record(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        if not self.count or seconds < self.low:
            self.low = seconds
        if seconds > self.high:
            self.high = seconds
        self.count += 1
        self.total += seconds

    def record_age(self, now_ms: int, since_ms: int) -> None:
        """Record how long ago (both in ms since the epoch) something happened; nothing when
        `since_ms` is unknown (0). Clocks of different hosts may disagree: a negative age
        counts as 0."""
        if since_ms:
            self.record(max(0, now_ms - since_ms) / 1000)


@dataclass(slots=True, eq=False)
class ProtocolStats:
    """What the clients of one protocol did on this node. The adapter of that protocol holds
    it (selected once) and adds to it; the processor adds connection and publish counts."""

    protocol: str
    connections: int = 0  # admitted and open now
    opened: int = 0  # admitted since the node started
    connections_peak: int = 0  # the most open at once since the node started
    # By reason (`Refusal`, `Closing`).
    refused: dict[str, int] = field(default_factory=dict)
    closed: dict[str, int] = field(default_factory=dict)
    requests: int = 0  # packets or commands received from clients
    messages_received: int = 0
    messages_sent: int = 0
    bytes_received: int = 0  # read from and written to the connections
    bytes_sent: int = 0
    # The payloads alone of the messages received from and sent to clients.
    payload_bytes_received: int = 0
    payload_bytes_sent: int = 0
    # From a message's publish time to its delivery to a client of this protocol (sampled).
    delivery_latency: LatencyHistogram = field(default_factory=LatencyHistogram)

    def record_sent(self, messages: int, nbytes: int, payload_bytes: int = 0) -> None:
        """Count messages sent to clients: `nbytes` on the wire, `payload_bytes` of them
        their payloads."""
        self.messages_sent += messages
        self.bytes_sent += nbytes
        self.payload_bytes_sent += payload_bytes

    def record_received_bytes(self, nbytes: int) -> None:
        self.bytes_received += nbytes

    def refuse(self, reason: str) -> None:
        """Count a connection refused before it was admitted."""
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def close(self, reason: str) -> None:
        """Count an admitted connection that ended."""
        self.connections -= 1
        self.closed[reason] = self.closed.get(reason, 0) + 1
