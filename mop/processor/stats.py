"""The node's counters, kept by the processor and the adapters (`ProcessorStats`): plain
integers the hot path adds to, read by `$SYS` and by the metrics when they are collected."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mop.counters import LatencyHistogram, ProtocolStats

__all__ = ["AdapterCounts", "ProcessorStats"]


@dataclass(frozen=True, slots=True)
class AdapterCounts:
    """What a protocol adapter holds now, counted when metrics are collected (not kept up to
    date by the hot path)."""

    sessions: int = 0  # sessions attached to a connection of this node
    offline_sessions: int = 0  # sessions without a connection whose timers run here
    subscriptions: int = 0  # of those sessions, shared subscriptions apart
    shared_subscriptions: int = 0
    retained: int = 0  # retained messages, the node's own (`$SYS`) apart
    inflight: int = 0  # deliveries sent and not yet acknowledged by their client
    queued: int = 0  # deliveries waiting for room in their client's window


@dataclass(slots=True, eq=False)
class ProcessorStats:
    """Counters by protocol (`protocol(name)`, selected once by each adapter), drops by reason,
    and the latency of publishes. The totals `$SYS`, the admin API and the dashboard show are
    sums over the protocols, but for `connections_peak`, the node's own."""

    started_at: float
    protocols: dict[str, ProtocolStats] = field(default_factory=dict)
    # Messages not published or not delivered, by reason (`mop.counters.Drop`). Those
    # published where no subscription took them are the backend's to count (the broker knows).
    dropped: dict[str, int] = field(default_factory=dict)
    # From the processor receiving a publish to its PublishResult (sampled).
    publish_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    # What each adapter holds now, by protocol: read when metrics are collected.
    adapters: dict[str, Callable[[], AdapterCounts]] = field(default_factory=dict)
    # One publish or delivery in this many is timed (see `sample_every`).
    sampling: int = 1
    # The most connections open at once since the node started, every protocol together
    # (`note_peak`): not the sum of the protocols' peaks, which need not have coincided.
    connections_peak: int = 0

    def protocol(self, name: str) -> ProtocolStats:
        """The counters of protocol `name` (made on first use)."""
        stats = self.protocols.get(name)
        if stats is None:
            stats = self.protocols[name] = ProtocolStats(name)
            stats.delivery_latency.sample_every(self.sampling)
        return stats

    def sample_every(self, every: int) -> None:
        """Time one publish (or delivery batch) in `every` for the latency histograms."""
        self.sampling = max(1, every)
        self.publish_latency.sample_every(self.sampling)
        for stats in self.protocols.values():
            stats.delivery_latency.sample_every(self.sampling)

    def note_peak(self) -> None:
        """A connection was admitted: raise `connections_peak` if the node has never had so
        many open at once."""
        self.connections_peak = max(self.connections_peak, self.connections)

    def drop(self, reason: str, messages: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + messages

    @property
    def uptime(self) -> float:
        return time.monotonic() - self.started_at

    @property
    def connections(self) -> int:
        return sum(stats.connections for stats in self.protocols.values())

    @property
    def connections_total(self) -> int:
        return sum(stats.opened for stats in self.protocols.values())

    @property
    def messages_received(self) -> int:
        return sum(stats.messages_received for stats in self.protocols.values())

    @property
    def messages_sent(self) -> int:
        return sum(stats.messages_sent for stats in self.protocols.values())

    @property
    def bytes_received(self) -> int:
        return sum(stats.bytes_received for stats in self.protocols.values())

    @property
    def bytes_sent(self) -> int:
        return sum(stats.bytes_sent for stats in self.protocols.values())

    @property
    def payload_bytes_received(self) -> int:
        return sum(stats.payload_bytes_received for stats in self.protocols.values())

    @property
    def payload_bytes_sent(self) -> int:
        return sum(stats.payload_bytes_sent for stats in self.protocols.values())

    @property
    def messages_dropped(self) -> int:
        return sum(self.dropped.values())
