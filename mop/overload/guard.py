"""The node's overload state as the adapters see it: the budgets of each client, whether the
node is over its memory high-water mark (and a way to wait until it is not), and counters of
what was refused or held back, for metrics and the log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from mop.log_limit import LimitedLog
from mop.overload.buckets import ClientBudgets, ClientLimits, ClientRates, Rate
from mop.overload.watermark import MemoryPressure, Watermarks
from mop.settings import LimitsSettings

__all__ = ["OverloadGuard", "OverloadStats", "client_limits"]

log = logging.getLogger("mop.overload")
# One line per kind of refusal per interval: a connection storm refuses thousands a second.
_refusals = LimitedLog(log)


@dataclass(slots=True)
class OverloadStats:
    # Connections refused for a listener's connection rate, and while over the memory mark.
    connections_refused_rate: int = 0
    connections_refused_busy: int = 0
    # Messages refused while over the memory mark (MQTT 5 0x97, Pulsar TooManyRequests).
    publishes_refused: int = 0
    # Pauses in reading from a client over its rates, and their seconds in all.
    throttled_reads: int = 0
    throttled_seconds: float = 0.0
    # Pauses in reading from a publisher while over the memory mark.
    memory_pauses: int = 0
    # Times the node went over its memory mark, and its memory at the last sample (bytes).
    memory_high_events: int = 0
    memory_used: int = 0
    # Times the node gave freed memory back to the system before judging a sample that was
    # over a mark, and the bytes its memory went down by then.
    memory_releases: int = 0
    memory_released: int = 0


def client_limits(limits: LimitsSettings) -> ClientLimits:
    """The per-client rates `limits` set."""
    return ClientLimits(
        messages=Rate(limits.client_message_rate, limits.client_message_burst)
        if limits.client_message_rate > 0
        else None,
        nbytes=Rate(limits.client_byte_rate, limits.client_byte_burst)
        if limits.client_byte_rate > 0
        else None,
    )


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.0f} MiB"


class OverloadGuard:
    """What overload protection asks of the adapters. Without limits and watermarks (the
    default) nothing is ever refused or held back."""

    def __init__(
        self, limits: LimitsSettings | None = None, *, watermarks: Watermarks | None = None
    ) -> None:
        self.clients = ClientBudgets(client_limits(limits or LimitsSettings()))
        self.stats = OverloadStats()
        self._pressure = MemoryPressure(watermarks) if watermarks is not None else None
        # Set while the memory is below the mark; a new one, unset, each time it goes over.
        self._memory_ok = trio.Event()
        self._memory_ok.set()

    # -- per-client rates ------------------------------------------------------------------

    def client_rates(self, key: str) -> ClientRates | None:
        """The budgets of a connection of client `key` that starts sending now (None: no
        per-client rates): what its last connection left, if that is not full again yet."""
        return self.clients.start(key, trio.current_time())

    def client_left(self, key: str, rates: ClientRates | None) -> None:
        """The connection of client `key`, whose budgets were `rates`, ended."""
        self.clients.end(key, rates, trio.current_time())

    async def throttle(self, seconds: float, who: str) -> None:
        """Stop reading from client `who`, over its rates, for `seconds`."""
        self.stats.throttled_reads += 1
        self.stats.throttled_seconds += seconds
        _refusals.warning(
            "throttled",
            "%s is over its rate (limits.client_message_rate, limits.client_byte_rate):"
            " not read from for %.3f s",
            who,
            seconds,
        )
        await trio.sleep(seconds)

    # -- memory ----------------------------------------------------------------------------

    @property
    def watches_memory(self) -> bool:
        return self._pressure is not None

    @property
    def memory_high(self) -> bool:
        """Whether the node is over its memory high-water mark (and not yet below the low)."""
        pressure = self._pressure
        return pressure is not None and pressure.over

    async def wait_memory(self, who: str) -> None:
        """Return once the node is below its memory mark: publisher `who` is not read from
        meanwhile (at once when it is below already)."""
        if not self.memory_high:
            return
        self.stats.memory_pauses += 1
        _refusals.warning(
            "memory-pause",
            "%s: not read from until memory is below limits.memory_low_watermark",
            who,
        )
        while self.memory_high:
            await self._memory_ok.wait()

    def memory_pressing(self, used: int) -> bool:
        """Whether a sample of `used` bytes would put the node over its memory mark or keep it
        there (False without marks)."""
        pressure = self._pressure
        return pressure is not None and pressure.pressing(used)

    def released_memory(self, before: int, after: int) -> None:
        """The node gave freed memory back to the system: its memory went from `before` to
        `after` bytes."""
        self.stats.memory_releases += 1
        self.stats.memory_released += max(0, before - after)
        log.debug("memory given back to the system: %s -> %s", _mib(before), _mib(after))

    def observe_memory(self, used: int) -> None:
        """A sample of the node's memory (bytes), from the watch that `mop.node` runs."""
        self.stats.memory_used = used
        pressure = self._pressure
        if pressure is None or not pressure.observe(used):
            return
        marks = pressure.marks
        if pressure.over:
            self.stats.memory_high_events += 1
            self._memory_ok = trio.Event()
            log.warning(
                "memory %s is over the high-water mark %s (limits.memory_high_watermark):"
                " publishers are held back and new MQTT clients refused until it is below %s",
                _mib(used),
                _mib(marks.high),
                _mib(marks.low),
            )
        else:
            self._memory_ok.set()
            log.warning(
                "memory %s is below the low-water mark %s: publishers and new clients are"
                " served again",
                _mib(used),
                _mib(marks.low),
            )

    def not_ready(self) -> list[str]:
        """Why the node should take no new clients now (empty: no overload)."""
        pressure = self._pressure
        if pressure is None or not pressure.over:
            return []
        return [
            f"memory {_mib(pressure.used)} is over the high-water mark {_mib(pressure.marks.high)}"
            f" (limits.memory_high_watermark) until below {_mib(pressure.marks.low)}"
        ]

    # -- refusals --------------------------------------------------------------------------

    def refused_connection(self, listener: str) -> None:
        """A connection to `listener` was refused for its connection rate."""
        self.stats.connections_refused_rate += 1
        _refusals.warning(
            f"rate/{listener}",
            "%s: refusing new connections over limits.connection_rate",
            listener,
        )

    def refused_busy(self, who: str) -> None:
        """A new client `who` was refused while over the memory mark."""
        self.stats.connections_refused_busy += 1
        _refusals.warning("busy", "%s: refused, memory is over limits.memory_high_watermark", who)

    def refused_publishes(self, who: str, count: int = 1) -> None:
        """`count` messages of `who` were refused while over the memory mark."""
        self.stats.publishes_refused += count
        _refusals.warning(
            "publish",
            "%s: messages refused, memory is over limits.memory_high_watermark",
            who,
        )
