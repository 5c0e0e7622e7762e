"""`IdRanges` and `IdRangeSet`: the same answers as a plain set of ids, runs that merge and split
as ids come and go, and cursor records whose size follows the runs (with the record of logs
written before runs still read)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mop.broker.storage import CursorState, IdRanges, IdRangeSet
from mop.broker.storage.durable import open_durable_storage
from mop.broker.storage.records import (
    CursorRecord,
    Kind,
    SegmentHeader,
    TopicRecord,
    decode_record,
    encode_cursor,
    encode_message,
    encode_topic,
    frame,
)
from mop.message import Message, MessageId
from tests.unit.broker.storage.conftest import small_settings

IDS = st.builds(MessageId, st.integers(0, 2), st.integers(0, 40))
# One step: add an id, or discard every id up to one.
STEPS = st.lists(st.tuples(st.sampled_from(["add", "through"]), IDS), max_size=80)


def _runs_are_canonical(runs: tuple[tuple[int, int, int], ...]) -> bool:
    return IdRanges.checked(runs).runs == runs


@given(STEPS)
def test_a_range_set_answers_like_a_set(steps: list[tuple[str, MessageId]]) -> None:
    ranges, model = IdRangeSet(), set[MessageId]()
    for op, message_id in steps:
        if op == "add":
            ranges.add(message_id)
            model.add(message_id)
        else:
            ranges.discard_through(message_id)
            model = {m for m in model if m > message_id}
        frozen = ranges.freeze()
        assert _runs_are_canonical(frozen.runs)  # sorted, disjoint, adjacent runs merged
        assert sorted(frozen) == sorted(model)
        assert len(frozen) == len(ranges) == len(model)
        assert frozen == IdRanges.of(model)
    for ledger in range(3):
        for entry in range(-1, 42):
            probe = MessageId(ledger, entry)
            assert (probe in ranges) == (probe in model) == (probe in ranges.freeze())


@given(st.sets(IDS, max_size=60), IDS)
def test_runs_merge_and_split(ids: set[MessageId], cut: MessageId) -> None:
    ranges = IdRangeSet(IdRanges.of(ids))
    runs = ranges.freeze().runs
    # Consecutive entries of one ledger are one run: as many runs as gaps plus one per ledger.
    expected = sum(1 for m in ids if MessageId(m.ledger, m.entry - 1) not in ids)
    assert len(runs) == expected
    ranges.discard_through(cut)
    assert ranges.freeze() == IdRanges.of(m for m in ids if m > cut)


def test_filling_a_gap_joins_two_runs() -> None:
    ranges = IdRangeSet()
    for entry in (1, 2, 4, 5):
        ranges.add(MessageId(7, entry))
    assert ranges.freeze().runs == ((7, 1, 2), (7, 4, 5))
    ranges.add(MessageId(7, 3))
    assert ranges.freeze().runs == ((7, 1, 5),)
    ranges.discard_through(MessageId(7, 2))
    assert ranges.freeze().runs == ((7, 3, 5),)


def test_a_frozen_value_does_not_change_with_the_set() -> None:
    ranges = IdRangeSet()
    ranges.add(MessageId(1, 1))
    frozen = ranges.freeze()
    ranges.add(MessageId(1, 2))
    ranges.add(MessageId(1, 9))
    assert frozen.runs == ((1, 1, 1),)


@pytest.mark.parametrize(
    "runs",
    [((1, 5, 4),), ((1, 1, 3), (1, 4, 6)), ((1, 1, 3), (1, 2, 6)), ((2, 0, 0), (1, 0, 0))],
)
def test_runs_out_of_order_overlapping_or_adjacent_are_refused(
    runs: tuple[tuple[int, int, int], ...],
) -> None:
    with pytest.raises(ValueError):
        IdRanges.checked(runs)


@given(st.none() | IDS, st.sets(IDS, max_size=30))
def test_cursor_records_round_trip(mark: MessageId | None, acked: set[MessageId]) -> None:
    state = CursorState(mark, IdRanges.of(acked))
    body = encode_cursor("t", "s", state)
    assert body[0] == Kind.CURSOR_RUNS
    assert decode_record(body) == CursorRecord("t", "s", state)


def _old_cursor(topic: str, sub: str, mark: MessageId, acked: list[MessageId]) -> bytes:
    """A cursor record as logs written before runs hold it: every acknowledged id listed."""
    parts = [bytes((Kind.CURSOR,))]
    for text in (topic, sub):
        parts.append(struct.pack("<I", len(text)) + text.encode())
    parts.append(struct.pack("<QQI", mark.ledger, mark.entry, len(acked)))
    parts += [struct.pack("<QQ", m.ledger, m.entry) for m in acked]
    return b"".join(parts)


def test_the_record_listing_every_id_is_still_read() -> None:
    acked = [MessageId(3, n) for n in (5, 6, 7, 9)]
    record = decode_record(_old_cursor("t", "s", MessageId(3, 1), acked))
    assert record == CursorRecord("t", "s", CursorState(MessageId(3, 1), IdRanges.of(acked)))
    assert isinstance(record, CursorRecord) and record.state is not None
    assert record.state.acked.runs == ((3, 5, 7), (3, 9, 9))


async def test_a_log_with_the_old_cursor_record_recovers(tmp_path: Path) -> None:
    acked = [MessageId(5, 2), MessageId(5, 3)]
    bodies = [
        encode_topic(TopicRecord("t", (5,), None, None)),
        *[encode_message(5, n, 0, Message(b"m%d" % n)) for n in range(4)],
        _old_cursor("t", "s", MessageId(5, 0), acked),
    ]
    data = SegmentHeader(0, 0).encode() + b"".join(frame(body) for body in bodies)
    (tmp_path / f"{0:020d}.log").write_bytes(data)
    store = await open_durable_storage(tmp_path, small_settings())
    assert store.load_cursors() == {("t", "s"): CursorState(MessageId(5, 0), IdRanges.of(acked))}
    # Saved again, it is written as runs, and read back the same after a reopen.
    store.save_cursors(store.load_cursors())
    await store.aclose()
    store = await open_durable_storage(tmp_path, small_settings())
    assert store.load_cursors() == {("t", "s"): CursorState(MessageId(5, 0), IdRanges.of(acked))}
    await store.aclose()


def test_a_huge_contiguous_run_encodes_small() -> None:
    # A subscription stalled with message 0 in flight, that dropped the next million.
    ranges = IdRangeSet()
    for entry in range(1, 1_000_001):
        ranges.add(MessageId(4, entry))
    state = CursorState(None, ranges.freeze())
    assert len(state.acked) == 1_000_000
    assert len(encode_cursor("topic", "sub", state)) < 100


@given(st.sets(IDS, max_size=60), IDS)
def test_a_span_answers_for_every_id_in_it(ids: set[MessageId], probe: MessageId) -> None:
    ranges = IdRangeSet(IdRanges.of(ids))
    held, ledger, first, last = ranges.span(probe)
    assert (held, ledger) == (probe in ids, probe.ledger)
    assert first <= probe.entry <= last
    for entry in range(max(first, -2), min(last, 43) + 1):
        assert (MessageId(ledger, entry) in ids) == held
    # A span reaches as far as it can: the entries just outside it answer otherwise.
    for entry in (first - 1, last + 1):
        if -2 <= entry <= 43:
            assert (MessageId(ledger, entry) in ids) != held
