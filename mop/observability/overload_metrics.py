"""Overload protection's counters as OpenTelemetry instruments, read when a scrape or an export
asks (the hot path only adds to the plain integers of `OverloadStats`)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Observation

from mop.observability.telemetry import Telemetry
from mop.overload.guard import OverloadGuard

__all__ = ["register_overload_metrics"]


def register_overload_metrics(telemetry: Telemetry, guard: OverloadGuard) -> None:
    """Instruments over `guard.stats`, on the node's meter."""
    meter = telemetry.meter
    stats = guard.stats

    def refused_connections(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.connections_refused_rate, {"reason": "rate"})
        yield Observation(stats.connections_refused_busy, {"reason": "memory"})

    def refused_publishes(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.publishes_refused)

    def throttled(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.throttled_seconds)

    def pauses(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.throttled_reads, {"reason": "rate"})
        yield Observation(stats.memory_pauses, {"reason": "memory"})

    def memory(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.memory_used)

    def releases(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.memory_releases)

    def released(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(stats.memory_released)

    def overloaded(_options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(1 if guard.memory_high else 0)

    meter.create_observable_counter(
        "mop.overload.connections.refused",
        [refused_connections],
        unit="{connection}",
        description="Connections refused over a listener's connection rate or the memory mark",
    )
    meter.create_observable_counter(
        "mop.overload.messages.refused",
        [refused_publishes],
        unit="{message}",
        description="Messages refused while over the memory high-water mark",
    )
    meter.create_observable_counter(
        "mop.overload.read.pauses",
        [pauses],
        unit="{pause}",
        description="Pauses in reading from a client over its rates or while over the memory mark",
    )
    meter.create_observable_counter(
        "mop.overload.throttled",
        [throttled],
        unit="s",
        description="Seconds clients over their rates were not read from",
    )
    meter.create_observable_gauge(
        "mop.overload.memory",
        [memory],
        unit="By",
        description="Resident memory of the node at the last sample (when a mark is set)",
    )
    meter.create_observable_counter(
        "mop.overload.memory.releases",
        [releases],
        unit="{release}",
        description="Times the node gave freed memory back to the system before judging a"
        " sample over a memory mark",
    )
    meter.create_observable_counter(
        "mop.overload.memory.released",
        [released],
        unit="By",
        description="Bytes the node's memory went down by when it gave freed memory back",
    )
    meter.create_observable_gauge(
        "mop.overload.active",
        [overloaded],
        description="1 while the node is over its memory high-water mark",
    )
