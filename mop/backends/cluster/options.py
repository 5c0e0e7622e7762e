"""The options of the separated-mode backend's producers and consumers (`ClusterBackend`'s
`producers` and `consumers` arguments)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConsumerOptions", "ProducerOptions"]


@dataclass(frozen=True, slots=True)
class ProducerOptions:
    send_timeout: float = 30.0
    # Messages sent within this delay share one batch (one broker write); 0 turns batching off.
    batching_delay: float = 0.001
    batching_max_messages: int = 1000
    max_pending: int = 1000
    idle_timeout: float = 60.0


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    # Messages received from the brokers and not yet taken before the legs pause.
    buffer: int = 1000
    # Permits each leg gives its broker (messages sent ahead per topic).
    receiver_queue: int = 500
    # Seconds between the listings of a namespace that find topics for wildcard selectors.
    pattern_discovery: float = 1.0
    # How long a subscribe retries while the subscription is held by a consumer that is going.
    busy_timeout: float = 10.0
    # Non-durable exclusive subscriptions share one reader per topic per proxy
    # (`fanout`) instead of a consumer per subscription and topic.
    fanout: bool = True
