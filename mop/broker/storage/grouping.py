"""Whether a write of the log waits one turn of the event loop for other publishers' records.

Waiting lets the publishers that are ready in the same turn add their records to the same write
(group commit): under many publishers, one write instead of one each. At a low rate nobody
joins, and the turn is all it does: a pass of the scheduler on the way of every message, a
tenth of a merged node's QoS 1 latency at 1k msgs/s. `WriteGrouping` waits while others join,
stops after `quiet` waits in a row that nobody joined, and from then on waits once every
`probe` writes to see whether company came back. Pure: the store tells it what each write held.
"""

from __future__ import annotations

__all__ = ["WriteGrouping"]


class WriteGrouping:
    __slots__ = ("_alone", "_grouping", "_since_probe", "probe", "quiet")

    def __init__(self, *, quiet: int = 8, probe: int = 32) -> None:
        self.quiet = quiet
        self.probe = probe
        self._grouping = True  # until a few writes show that nobody joins
        self._alone = 0  # waits in a row that nobody joined
        self._since_probe = 0

    @property
    def grouping(self) -> bool:
        """Whether writes wait for company now (rather than only when probing)."""
        return self._grouping

    def should_wait(self) -> bool:
        """Whether the next write waits a turn for other publishers' records."""
        if self._grouping:
            return True
        self._since_probe += 1
        if self._since_probe >= self.probe:
            self._since_probe = 0
            return True
        return False

    def written(self, callers: int, *, waited: bool) -> None:
        """A write was asked for by `callers` tasks since the one before (publishers waiting
        for their records); it had `waited` a turn for them or not."""
        if callers > 1:
            # Company: others asked for the same write, so sharing writes pays.
            self._grouping = True
            self._alone = 0
            return
        if not waited:
            return
        self._alone += 1
        if self._alone >= self.quiet:
            self._grouping = False
            self._alone = 0
            self._since_probe = 0
