"""CONSUMER_STATS: what one Pulsar consumer of a connection has been sent, and the
CommandConsumerStatsResponse made of it with its subscription's backlog (`ConsumerMeter`,
`stats_response`). Plain objects: the caller supplies the time."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from mop.protocols.pulsar.commands import ConsumerStatsResponse, SubType
from mop.rates import RateMeter

__all__ = ["ConsumerMeter", "stats_response", "wall_clock_text"]


def wall_clock_text(seconds: float) -> str:
    """A wall-clock time as Pulsar's stats write it: ISO 8601, milliseconds, UTC."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(slots=True)
class ConsumerMeter:
    """Counts of one consumer since it subscribed (at `since`, wall-clock seconds), and the
    permits its FLOW commands granted that no message used yet.

    Rates are those of the last `RATE_WINDOW` seconds or more, whoever asks and however often
    (Pulsar's cover its last stats period): two clients asking in turn see the same rates."""

    since: float
    messages_out: int = 0
    bytes_out: int = 0
    redelivered: int = 0
    acked: int = 0
    permits: int = 0
    _meter: RateMeter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._meter = RateMeter(self.since, 4)

    def granted(self, permits: int) -> None:
        self.permits += permits

    def sent(self, messages: int, nbytes: int) -> None:
        self.messages_out += messages
        self.bytes_out += nbytes
        self.permits = max(0, self.permits - messages)

    def redelivering(self, messages: int) -> None:
        self.redelivered += messages

    def acknowledged(self, messages: int) -> None:
        self.acked += messages

    def rates(self, now: float) -> tuple[float, float, float, float]:
        """Messages out, bytes out, messages redelivered and acknowledged per second."""
        out, nbytes, redelivered, acked = self._meter.read(
            now, (self.messages_out, self.bytes_out, self.redelivered, self.acked)
        )
        return out, nbytes, redelivered, acked


def stats_response(
    request_id: int,
    meter: ConsumerMeter,
    now: float,
    *,
    name: str,
    sub_type: SubType,
    address: str,
    unacked: int,
    backlog: int,
) -> ConsumerStatsResponse:
    """The answer for one consumer: `unacked` messages sent to it and not acknowledged,
    `backlog` its subscription's messages not acknowledged (Pulsar's msgBacklog)."""
    rate_out, throughput_out, rate_redeliver, rate_ack = meter.rates(now)
    return ConsumerStatsResponse(
        request_id=request_id,
        msg_rate_out=rate_out,
        msg_throughput_out=throughput_out,
        msg_rate_redeliver=rate_redeliver,
        consumer_name=name,
        available_permits=meter.permits,
        unacked_messages=unacked,
        # mop sets no limit of unacknowledged messages per consumer: it is never blocked.
        blocked_consumer_on_unacked_msgs=False,
        address=address,
        connected_since=wall_clock_text(meter.since),
        type=sub_type.name,
        # Expired messages are dropped as dispatch reaches them, not counted per consumer.
        msg_rate_expired=0.0,
        msg_backlog=backlog,
        message_ack_rate=rate_ack,
    )
