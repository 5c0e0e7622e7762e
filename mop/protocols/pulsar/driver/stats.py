"""What a `PulsarClient` counts about its links to the brokers, by broker address: plain
integers and latency histograms (`mop.counters`) that the metrics read when they are collected.
The clients of one process share one `LinkStats` (`ClientOptions.stats`)."""

from __future__ import annotations

from mop.counters import LatencyHistogram

__all__ = ["BrokerLink", "LinkStats"]


class BrokerLink:
    """The connections to one broker: kept across reconnections, so its counts only grow."""

    __slots__ = (
        "address",
        "bytes_received",
        "bytes_sent",
        "commands",
        "connections",
        "receive_latency",
        "send_latency",
    )

    def __init__(self, address: str, *, sampling: int = 1) -> None:
        self.address = address
        self.connections = 0  # open now
        self.commands = 0  # commands sent (a SEND carries a batch)
        self.bytes_sent = 0
        self.bytes_received = 0
        # From a SEND to its receipt (sampled by message).
        self.send_latency = LatencyHistogram(every=sampling)
        # From a message's publish time (as its producer set it) to its arrival here.
        self.receive_latency = LatencyHistogram(every=sampling)


class LinkStats:
    """Lookups, and a `BrokerLink` per broker address (as many as there are brokers)."""

    __slots__ = ("links", "lookups", "sampling")

    def __init__(self, *, sampling: int = 1) -> None:
        self.lookups = 0  # LOOKUP requests sent (a redirect makes two)
        self.links: dict[str, BrokerLink] = {}
        self.sampling = sampling

    def link(self, address: str) -> BrokerLink:
        """The counts of the broker at `address` (made on first use)."""
        link = self.links.get(address)
        if link is None:
            link = self.links[address] = BrokerLink(address, sampling=self.sampling)
        return link

    def sample_every(self, every: int) -> None:
        """Time one message in `every` sent or received, from now on."""
        self.sampling = max(1, every)
        for link in self.links.values():
            link.send_latency.sample_every(self.sampling)
            link.receive_latency.sample_every(self.sampling)
