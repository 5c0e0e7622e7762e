"""In-memory indexes of the durable log: where each kept message lives, the latest cursor and
table state, and how many live bytes each segment still holds. Pure data, no I/O.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TypeAlias

from mop.broker.storage.api import CursorKey, CursorState
from mop.message import MessageId

__all__ = ["LogIndex", "Run", "Segment", "Slot", "StateKey", "TopicIndex"]

# Identifies a piece of live state whose latest record must outlive its segment:
# ("T", topic) topic record, ("C", topic, subscription) cursor, ("K", table, key) table entry.
StateKey: TypeAlias = tuple[str, ...]
# (ledger, entry, log position, record size) of one kept message
Slot: TypeAlias = tuple[int, int, int, int]


class Run:
    """Consecutive entries of one ledger, from `first + head` to `next_entry - 1`, with the log
    position, record size and append time (s) of each. Trimming moves `head`; the dropped
    prefix is cut off the arrays once it dominates, so trimming stays amortised O(1).

    `totals` holds the running sum of `sizes` (only differences of it mean anything, so
    slices and dropped prefixes keep it right) and `times` never decreases (a message
    appended after the clock stepped back is dated as the one before it): retention and
    backlog quotas find their cut by bisection instead of a walk over every kept message."""

    __slots__ = ("first", "head", "ledger", "monotonic", "positions", "sizes", "times", "totals")

    def __init__(self, ledger: int, first: int) -> None:
        self.ledger = ledger
        self.first = first
        self.head = 0
        self.positions = array("q")
        self.sizes = array("I")
        self.times = array("I")
        self.totals = array("q")
        # Positions rise with entries until a reclaim copies older entries forward.
        self.monotonic = True

    def __len__(self) -> int:
        return len(self.positions) - self.head

    @property
    def next_entry(self) -> int:
        return self.first + len(self.positions)

    def append(self, position: int, size: int, seconds: int) -> None:
        if self.positions and position < self.positions[-1]:
            self.monotonic = False
        self.positions.append(position)
        self.sizes.append(size)
        self.times.append(max(seconds, self.times[-1]) if self.times else seconds)
        self.totals.append(size + (self.totals[-1] if self.totals else 0))

    def extend(self, positions: list[int], sizes: list[int], seconds: int) -> None:
        """`append` for each of several messages appended at `seconds`."""
        if self.positions and positions[0] < self.positions[-1]:
            self.monotonic = False
        self.positions.extend(positions)
        self.sizes.extend(sizes)
        if self.times:
            seconds = max(seconds, self.times[-1])
        self.times.extend([seconds] * len(positions))
        start = self.totals[-1] if self.totals else 0
        self.totals.extend(start + total for total in accumulate(sizes))

    def load(self, positions: array[int], sizes: array[int], times: array[int]) -> None:
        """Take whole columns (recovery), deriving `totals` and never-decreasing times."""
        self.positions, self.sizes = positions, sizes
        self.times = array("I", accumulate(times, max))
        self.totals = array("q", accumulate(sizes))

    def bytes_between(self, lo: int, hi: int) -> int:
        """The bytes of the array indexes [lo, hi)."""
        if hi <= lo:
            return 0
        return self.totals[hi - 1] - self.totals[lo] + self.sizes[lo]

    def index_of(self, entry: int) -> int | None:
        i = entry - self.first
        return i if self.head <= i < len(self.positions) else None

    def drop_prefix(self, end: int) -> None:
        """Forget array indexes below `end` (they were trimmed)."""
        self.head = end
        if self.head > 1024 and self.head * 2 > len(self.positions):
            for column in (self.positions, self.sizes, self.times, self.totals):
                del column[: self.head]
            self.first += self.head
            self.head = 0


@dataclass(slots=True)
class TopicIndex:
    """A topic's kept messages (runs in id order) and the ids that bound them.

    `ledger` is the ledger this process appends to, opened at the first append after the
    store opens, so ids handed out before a crash are never handed out again.
    """

    name: str
    runs: list[Run] = field(default_factory=list)
    ledger: int | None = None
    last_id: MessageId | None = None
    trimmed: MessageId | None = None
    count: int = 0
    bytes: int = 0

    def ledgers(self) -> tuple[int, ...]:
        kept = [run.ledger for run in self.runs if len(run) or run.ledger == self.ledger]
        return tuple(dict.fromkeys(kept))

    def locate(self, after: MessageId | None, max_count: int) -> list[Slot]:
        slots: list[Slot] = []
        for run in self.runs:
            if len(slots) >= max_count:
                break
            start = run.head
            if after is not None:
                if after.ledger > run.ledger:
                    continue
                if after.ledger == run.ledger:
                    start = max(start, after.entry + 1 - run.first)
            stop = min(len(run.positions), start + max_count - len(slots))
            first, positions, sizes = run.first, run.positions, run.sizes
            for i in range(start, stop):
                slots.append((run.ledger, first + i, positions[i], sizes[i]))
        return slots

    def trim(self, through: MessageId) -> Iterator[tuple[Run, int, int]]:
        """Drop kept messages with an id <= `through`, yielding (run, lo, hi) array ranges
        just before they are dropped."""
        while self.runs:
            run = self.runs[0]
            if run.ledger > through.ledger:
                return
            end = len(run.positions)
            if run.ledger == through.ledger:
                end = max(run.head, min(end, through.entry + 1 - run.first))
            if end > run.head:
                yield run, run.head, end
                self.count -= end - run.head
                self.bytes -= run.bytes_between(run.head, end)
                run.drop_prefix(end)
            if len(run) or run.ledger == self.ledger:
                return
            self.runs.pop(0)

    def expired_through(self, cutoff: int) -> MessageId | None:
        """The last id of the kept prefix appended before `cutoff` (s): a bisection in each
        run (append times never decrease within one) until one holds a later message."""
        last = None
        for run in self.runs:
            times = run.times
            i = bisect_left(times, cutoff, lo=run.head)
            if i > run.head:
                last = MessageId(run.ledger, run.first + i - 1)
            if i < len(times):
                break
        return last

    def over_through(self, limit: int) -> MessageId | None:
        """The last id to trim so that at most `limit` bytes stay kept: whole runs while they
        hold less than the excess, then a bisection over the running sums of the next."""
        excess, last = self.bytes - limit, None
        for run in self.runs:
            if excess <= 0:
                break
            end = len(run.sizes)
            held = run.bytes_between(run.head, end)
            if held > excess:
                # The first index whose bytes from `head` on reach the excess.
                base = run.totals[run.head] - run.sizes[run.head]
                end = bisect_left(run.totals, base + excess, lo=run.head) + 1
                held = excess
            if end > run.head:
                last = MessageId(run.ledger, run.first + end - 1)
            excess -= held
        return last


@dataclass(slots=True)
class Segment:
    """One segment file as the index sees it: the live message bytes in it and the state keys
    whose latest record it holds. It can be deleted once both are gone."""

    base: int
    live_bytes: int = 0
    state: set[StateKey] = field(default_factory=set)


class LogIndex:
    """Everything the store knows without reading files: topics, cursors, tables, segments."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicIndex] = {}
        self.by_ledger: dict[int, TopicIndex] = {}
        self.cursors: dict[CursorKey, CursorState] = {}
        self.cursors_of: dict[str, set[str]] = {}
        self.tables: dict[str, dict[str, bytes]] = {}
        self.segments: list[Segment] = []
        self.bases: list[int] = []
        self.state_at: dict[StateKey, tuple[int, int]] = {}  # (position, record size)
        self.state_bytes = 0
        self.live_bytes = 0
        self.messages = 0
        self.message_bytes = 0

    # -- segments --------------------------------------------------------------------------

    def add_segment(self, base: int) -> Segment:
        segment = Segment(base)
        self.segments.append(segment)
        self.bases.append(base)
        return segment

    def remove_oldest(self) -> Segment:
        del self.bases[0]
        return self.segments.pop(0)

    def segment_at(self, position: int) -> Segment:
        return self.segments[bisect_right(self.bases, position) - 1]

    def count_live(self, run: Run, lo: int, hi: int, sign: int) -> None:
        """Add (sign 1) or remove (sign -1) the records run[lo:hi] to the live bytes of the
        segments holding them."""
        positions, sizes, bases = run.positions, run.sizes, self.bases
        total = 0
        i = lo
        while i < hi:
            s = bisect_right(bases, positions[i]) - 1
            if run.monotonic and s + 1 < len(bases):
                j = bisect_left(positions, bases[s + 1], i, hi)
            else:
                j = hi if run.monotonic else i + 1
            amount = sum(sizes[i:j]) if j - i > 1 else sizes[i]
            self.segments[s].live_bytes += sign * amount
            total += amount
            i = j
        self.live_bytes += sign * total

    # -- live state ------------------------------------------------------------------------

    def set_state(self, key: StateKey, position: int | None, size: int = 0) -> None:
        """Record that `key`'s latest record is at `position` and `size` bytes long (None:
        the key is gone)."""
        old = self.state_at.pop(key, None)
        if old is not None:
            self.state_bytes -= old[1]
            if old[0] >= self.bases[0]:
                self.segment_at(old[0]).state.discard(key)
        if position is not None:
            self.state_at[key] = (position, size)
            self.state_bytes += size
            self.segment_at(position).state.add(key)

    def put_cursor(self, key: CursorKey, state: CursorState | None) -> None:
        topic, subscription = key
        if state is None:
            self.cursors.pop(key, None)
            subs = self.cursors_of.get(topic)
            if subs is not None:
                subs.discard(subscription)
                if not subs:
                    del self.cursors_of[topic]
        else:
            self.cursors[key] = state
            self.cursors_of.setdefault(topic, set()).add(subscription)

    def put_table(self, table: str, key: str, value: bytes | None) -> None:
        if value is None:
            entries = self.tables.get(table)
            if entries is not None:
                entries.pop(key, None)
                if not entries:
                    del self.tables[table]
        else:
            self.tables.setdefault(table, {})[key] = value

    def drop_topic_cursors(self, topic: str) -> list[CursorKey]:
        keys = [(topic, sub) for sub in self.cursors_of.pop(topic, ())]
        for key in keys:
            self.cursors.pop(key, None)
            self.set_state(("C", *key), None)
        return keys

    # -- messages --------------------------------------------------------------------------

    def add_topic(self, topic: TopicIndex) -> None:
        self.topics[topic.name] = topic
        for run in topic.runs:
            self.by_ledger[run.ledger] = topic
            self.count_live(run, run.head, len(run.positions), 1)
        self.messages += topic.count
        self.message_bytes += topic.bytes

    def drop_topic(self, name: str) -> TopicIndex | None:
        topic = self.topics.pop(name, None)
        if topic is None:
            return None
        for run in topic.runs:
            self.by_ledger.pop(run.ledger, None)
            self.count_live(run, run.head, len(run.positions), -1)
        if topic.ledger is not None:
            self.by_ledger.pop(topic.ledger, None)
        self.messages -= topic.count
        self.message_bytes -= topic.bytes
        self.set_state(("T", name), None)
        return topic

    def trim_topic(self, topic: TopicIndex, through: MessageId) -> None:
        count, size = topic.count, topic.bytes
        for run, lo, hi in topic.trim(through):
            self.count_live(run, lo, hi, -1)
        topic.trimmed = through
        self.messages -= count - topic.count
        self.message_bytes -= size - topic.bytes

    def add_message(
        self, topic: TopicIndex, run: Run, position: int, size: int, seconds: int
    ) -> None:
        """Index a message just queued at the end of the log (so in the newest segment)."""
        run.append(position, size, seconds)
        self.segments[-1].live_bytes += size
        self.live_bytes += size
        topic.count += 1
        topic.bytes += size
        self.messages += 1
        self.message_bytes += size

    def add_messages(
        self, topic: TopicIndex, run: Run, positions: list[int], sizes: list[int], seconds: int
    ) -> None:
        """Index messages just queued together at the end of the log, in the newest segment
        (`add_message` for each, in one step)."""
        if not positions:
            return
        run.extend(positions, sizes, seconds)
        total = sum(sizes)
        self.segments[-1].live_bytes += total
        self.live_bytes += total
        topic.count += len(positions)
        topic.bytes += total
        self.messages += len(positions)
        self.message_bytes += total

    def void_messages(self, topic: TopicIndex, run: Run, lo: int, hi: int) -> None:
        """Forget run entries [lo, hi): their records were never written. Their ids stay
        used: the entries after them move to a run of their own (as after recovery, which
        starts a new run at every gap), and the topic's newest run keeps its next entry."""
        lo = max(lo, run.head)
        if lo >= hi:
            return
        self.count_live(run, lo, hi, -1)
        size = run.bytes_between(lo, hi)
        topic.count -= hi - lo
        topic.bytes -= size
        self.messages -= hi - lo
        self.message_bytes -= size
        runs = topic.runs
        at = runs.index(run)
        if hi < len(run.positions) or at == len(runs) - 1:
            rest = Run(run.ledger, run.first + hi)
            rest.positions = run.positions[hi:]
            rest.sizes = run.sizes[hi:]
            rest.times = run.times[hi:]
            rest.totals = run.totals[hi:]
            rest.monotonic = run.monotonic
            runs.insert(at + 1, rest)
        for column in (run.positions, run.sizes, run.times, run.totals):
            del column[lo:]
        if not len(run):
            runs.pop(at)

    def move_message(self, run: Run, i: int, position: int) -> None:
        """Record that a reclaim copied run entry `i` to `position` at the end of the log."""
        size = run.sizes[i]
        self.segment_at(run.positions[i]).live_bytes -= size
        self.segments[-1].live_bytes += size
        run.positions[i] = position
        run.monotonic = False

    def find(self, ledger: int, entry: int) -> tuple[Run, int] | None:
        topic = self.by_ledger.get(ledger)
        if topic is None:
            return None
        for run in topic.runs:
            if run.ledger == ledger:
                i = run.index_of(entry)
                if i is not None:
                    return run, i
        return None
