"""Sets of message ids held as sorted, disjoint runs of consecutive entries of one ledger:
`IdRanges`, the immutable value a saved cursor holds, and `IdRangeSet`, the mutable form a cursor
updates on each acknowledgement. Both cost per run, not per id: a subscription that skips a long
stretch of messages (dropped for a full queue, say) holds one run, however long it is.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import TypeAlias

from mop.message import MessageId

__all__ = ["NO_IDS", "IdRangeSet", "IdRanges", "Run"]

# (ledger, first entry, last entry), both ends included.
Run: TypeAlias = tuple[int, int, int]

# Above every entry id: (ledger, entry, _TOP) sorts after every run that starts at or before it.
_TOP = 1 << 64


def _find(runs: list[Run] | tuple[Run, ...], ledger: int, entry: int) -> int:
    """The index of the last run that starts at or before (ledger, entry), -1 if none does."""
    return bisect_right(runs, (ledger, entry, _TOP)) - 1


def _holds(runs: list[Run] | tuple[Run, ...], ledger: int, entry: int) -> bool:
    index = _find(runs, ledger, entry)
    if index < 0:
        return False
    run = runs[index]
    return run[0] == ledger and entry <= run[2]


class IdRanges:
    """An immutable set of whole-entry message ids (batch indexes are not kept), as runs in
    order. `len()` is the number of ids; `runs` is what gets stored."""

    __slots__ = ("runs",)

    def __init__(self, runs: tuple[Run, ...] = ()) -> None:
        """`runs` must be sorted, disjoint and not adjacent (see `check`)."""
        self.runs = runs

    @classmethod
    def of(cls, ids: Iterable[MessageId]) -> IdRanges:
        ranges = IdRangeSet()
        for message_id in sorted(ids):
            ranges.add(message_id)
        return ranges.freeze()

    @classmethod
    def checked(cls, runs: tuple[Run, ...]) -> IdRanges:
        """`IdRanges(runs)` after checking that the runs are in order, disjoint and not
        adjacent (so equal sets have equal runs); ValueError otherwise."""
        previous: Run | None = None
        for run in runs:
            ledger, first, last = run
            if first > last:
                raise ValueError(f"empty run {run}")
            if previous is not None and (ledger, first) <= (previous[0], previous[2] + 1):
                raise ValueError(f"run {run} overlaps or touches {previous}")
            previous = run
        return cls(runs)

    def __contains__(self, message_id: object) -> bool:
        if not isinstance(message_id, MessageId):
            return False
        return _holds(self.runs, message_id.ledger, message_id.entry)

    def __iter__(self) -> Iterator[MessageId]:
        for ledger, first, last in self.runs:
            for entry in range(first, last + 1):
                yield MessageId(ledger, entry)

    def __len__(self) -> int:
        return sum(last - first + 1 for _, first, last in self.runs)

    def __bool__(self) -> bool:
        return bool(self.runs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IdRanges) and self.runs == other.runs

    def __hash__(self) -> int:
        return hash(self.runs)

    def __repr__(self) -> str:
        return f"IdRanges({self.runs!r})"


NO_IDS = IdRanges()


class IdRangeSet:
    """The mutable form of `IdRanges`. Adding the id after the last one (the usual case: a
    subscription acknowledges roughly in order) extends the last run in O(1); any other add
    is a binary search and at most one list insertion or deletion."""

    __slots__ = ("_runs",)

    def __init__(self, ranges: IdRanges | None = None) -> None:
        self._runs: list[Run] = [] if ranges is None else list(ranges.runs)

    def freeze(self) -> IdRanges:
        """The current contents, as a value later changes do not affect (O(runs))."""
        return IdRanges(tuple(self._runs))

    def __contains__(self, message_id: MessageId) -> bool:
        return _holds(self._runs, message_id.ledger, message_id.entry)

    def __bool__(self) -> bool:
        return bool(self._runs)

    def __len__(self) -> int:
        return sum(last - first + 1 for _, first, last in self._runs)

    def run_count(self) -> int:
        return len(self._runs)

    def span(self, message_id: MessageId) -> tuple[bool, int, int, int]:
        """(held, ledger, first, last): whether `message_id` is held, and the entries from
        `first` to `last` of its ledger around it that are all held or all not (its run, or
        the gap between two runs), so that a caller looking up ids in order can answer for
        the ids that follow it without a search."""
        ledger, entry = message_id.ledger, message_id.entry
        runs = self._runs
        index = _find(runs, ledger, entry)
        first = -_TOP
        if index >= 0:
            run = runs[index]
            if run[0] == ledger:
                if entry <= run[2]:
                    return True, ledger, run[1], run[2]
                first = run[2] + 1
        last = _TOP
        if index + 1 < len(runs):
            run = runs[index + 1]
            if run[0] == ledger:
                last = run[1] - 1
        return False, ledger, first, last

    def add(self, message_id: MessageId) -> None:
        ledger, entry = message_id.ledger, message_id.entry
        runs = self._runs
        if runs:
            last_ledger, last_first, last_entry = runs[-1]
            if ledger == last_ledger and entry == last_entry + 1:
                runs[-1] = (ledger, last_first, entry)
                return
            if (ledger, entry) > (last_ledger, last_entry):
                runs.append((ledger, entry, entry))
                return
        index = _find(runs, ledger, entry)
        before = runs[index] if index >= 0 and runs[index][0] == ledger else None
        if before is not None and entry <= before[2]:
            return  # held already
        after = runs[index + 1] if index + 1 < len(runs) else None
        joins_before = before is not None and before[2] == entry - 1
        joins_after = after is not None and after[0] == ledger and after[1] == entry + 1
        if joins_before and joins_after:
            assert before is not None and after is not None
            runs[index] = (ledger, before[1], after[2])
            del runs[index + 1]
        elif joins_before:
            assert before is not None
            runs[index] = (ledger, before[1], entry)
        elif joins_after:
            assert after is not None
            runs[index + 1] = (ledger, entry, after[2])
        else:
            runs.insert(index + 1, (ledger, entry, entry))

    def discard_through(self, message_id: MessageId) -> None:
        """Remove every id up to and including `message_id`."""
        ledger, entry = message_id.ledger, message_id.entry
        runs = self._runs
        if not runs or (runs[0][0], runs[0][1]) > (ledger, entry):
            return
        index = _find(runs, ledger, entry)
        run = runs[index]
        if run[0] == ledger and run[2] > entry:
            runs[index] = (ledger, entry + 1, run[2])
            del runs[:index]
        else:
            del runs[: index + 1]
