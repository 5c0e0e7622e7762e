"""Cursors (`mop.broker.cursor`): `Cursor.ids` of a subscription that stalls, with its first
message never acknowledged and everything after it acknowledged one by one, stays bounded
(`Cursor.compact`), and a compacted cursor acknowledges, settles and saves exactly as one
that keeps every routed id."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mop.broker.cursor import Cursor
from mop.broker.storage.api import CursorState
from mop.broker.storage.ranges import IdRangeSet
from mop.message import MessageId


def new_cursor(mark_delete: MessageId | None = None) -> Cursor:
    sub: Any = SimpleNamespace(books=SimpleNamespace(changed=set()))
    topic: Any = None
    return Cursor(sub, topic, mark_delete)


class Reference:
    """A cursor that keeps every id routed to it until it is folded into mark_delete."""

    def __init__(self, mark_delete: MessageId | None = None) -> None:
        self.mark_delete = mark_delete
        self.ids: deque[MessageId] = deque()
        self.acked = IdRangeSet()

    def ack(self, message_id: MessageId) -> None:
        ids = self.ids
        if ids and ids[0] == message_id:
            ids.popleft()
            self.mark_delete = message_id
            self.settle()
        elif self.mark_delete is None or message_id > self.mark_delete:
            self.acked.add(message_id)

    def settle(self) -> None:
        ids, acked = self.ids, self.acked
        if not (acked and ids and ids[0] in acked):
            return
        mark = ids.popleft()
        while ids and ids[0] in acked:
            mark = ids.popleft()
        self.mark_delete = mark
        acked.discard_through(mark)

    def is_acked(self, message_id: MessageId) -> bool:
        mark = self.mark_delete
        return (mark is not None and message_id <= mark) or message_id in self.acked

    def state(self) -> CursorState:
        return CursorState(self.mark_delete, self.acked.freeze())


def ack_through(cursor: Cursor | Reference, through: MessageId) -> None:
    """What `Subscription.ack_through` does to the cursor for a whole entry."""
    ids = cursor.ids
    while ids and ids[0] <= through:
        cursor.ack(ids[0])
    cursor.acked.discard_through(through)


def test_a_stalled_cursor_holds_a_bounded_number_of_ids() -> None:
    cursor = new_cursor()
    head = MessageId(3, 0)
    cursor.ids.append(head)  # in flight, never acknowledged
    for entry in range(1, 100_001):
        message_id = MessageId(3, entry)
        cursor.ids.append(message_id)
        cursor.ack(message_id)  # dropped: acknowledged behind the head
        assert len(cursor.ids) <= 1025
    assert cursor.mark_delete is None
    assert cursor.acked.run_count() == 1
    assert not cursor.is_acked(head)
    assert cursor.is_acked(MessageId(3, 1)) and cursor.is_acked(MessageId(3, 100_000))
    cursor.ack(head)
    assert cursor.mark_delete == MessageId(3, 100_000)
    assert not cursor.ids and not cursor.acked


def test_a_stalled_cursor_keeps_the_ids_it_still_owes() -> None:
    cursor = new_cursor()
    owed = [MessageId(1, entry) for entry in range(0, 100_000, 10_000)]
    for entry in range(100_000):
        message_id = MessageId(1, entry)
        cursor.ids.append(message_id)
        if message_id not in owed:
            cursor.ack(message_id)
    assert len(cursor.ids) <= 1024 + 2 * len(owed)
    assert set(owed) <= set(cursor.ids)
    for message_id in owed:
        cursor.ack(message_id)
        assert cursor.mark_delete == MessageId(1, message_id.entry + 9_999)
    assert not cursor.ids and not cursor.acked


# A route takes the next id of a topic (skipping some: ids not routed to this subscription,
# or a new ledger); an ack names an id among or near the routed ones.
_STEP = st.one_of(
    st.tuples(st.just("route"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("ack"), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("through"), st.integers(0, 40), st.booleans()),
    st.tuples(st.just("compact"), st.just(0), st.just(False)),
)


@settings(max_examples=400)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 6)), max_size=12),
    st.lists(_STEP, max_size=120),
)
def test_compaction_changes_no_acknowledgement(
    loaded: list[tuple[int, int]], steps: list[tuple[str, int, bool]]
) -> None:
    # Both start as a cursor read back from storage: a mark_delete, the stored ids after it,
    # and those of them saved as acknowledged.
    mark_delete = MessageId(0, 0)
    cursor, reference = new_cursor(mark_delete), Reference(mark_delete)
    ledger, entry = 1, 0
    ids: list[MessageId] = []
    for skip, acked in loaded:
        entry += 1 + skip
        ids.append(MessageId(ledger, entry))
        if acked % 2:
            cursor.acked.add(ids[-1])
            reference.acked.add(ids[-1])
    cursor.ids.extend(ids)
    reference.ids.extend(ids)
    cursor.settle()
    cursor.compact()
    reference.settle()
    routed = list(ids)
    for kind, number, flag in steps:
        if kind == "route":
            if flag:
                ledger, entry = ledger + 1, 0
            entry += number
            message_id = MessageId(ledger, entry)
            entry += 1
            routed.append(message_id)
            cursor.ids.append(message_id)
            reference.ids.append(message_id)
        elif kind == "compact":
            cursor.compact()
        else:
            if routed and not flag:
                message_id = routed[number % len(routed)]  # a routed id
            else:
                message_id = MessageId(ledger, entry + number % 3 - 1)  # maybe not routed
            if kind == "ack":
                cursor.ack(message_id)
                reference.ack(message_id)
            else:
                ack_through(cursor, message_id)
                ack_through(reference, message_id)
        assert cursor.mark_delete == reference.mark_delete
        assert cursor.state() == reference.state()
        assert (cursor.ids[0] if cursor.ids else None) == (
            reference.ids[0] if reference.ids else None
        )
        assert set(cursor.ids) <= set(reference.ids)
        for message_id in routed:
            assert cursor.is_acked(message_id) == reference.is_acked(message_id)
            # An id compaction dropped is one the reference holds as acknowledged.
            if message_id in reference.ids and message_id not in cursor.ids:
                assert reference.is_acked(message_id)
    # Acknowledging whatever is left brings both to the same end.
    for message_id in list(reference.ids):
        cursor.ack(message_id)
        reference.ack(message_id)
        assert cursor.state() == reference.state()
    assert not cursor.ids and not reference.ids


def test_message_ids_are_ordered_by_ledger_then_entry_then_batch_index() -> None:
    ids = [
        MessageId(ledger, entry, index)
        for ledger in (1, 2)
        for entry in (3, 4)
        for index in (-1, 0, 1)
    ]
    for a in ids:
        for b in ids:
            fields_a = (a.ledger, a.entry, a.batch_index)
            fields_b = (b.ledger, b.entry, b.batch_index)
            assert (a < b, a > b, a <= b, a >= b, a == b) == (
                fields_a < fields_b,
                fields_a > fields_b,
                fields_a <= fields_b,
                fields_a >= fields_b,
                fields_a == fields_b,
            )
    assert sorted(reversed(ids)) == ids
    with pytest.raises(TypeError):
        assert MessageId(1, 2) < (1, 3)  # type: ignore[operator]


@settings(max_examples=400)
@given(
    st.integers(0, 30),
    st.lists(st.integers(0, 40), max_size=4),
    st.integers(0, 30),
    st.lists(st.integers(0, 40), max_size=4),
    st.sampled_from([None, MessageId(1, 0), MessageId(1, 12)]),
)
def test_acknowledging_taken_messages_together_is_acknowledging_each(
    routed: int,
    acked_before: list[int],
    from_front: int,
    out_of_line: list[int],
    mark_delete: MessageId | None,
) -> None:
    # Two cursors in the same state: ids routed, some acknowledged already (then a take's
    # acknowledgements may not be first in line); one acknowledges what a consumer took one
    # at a time, the other all together.
    each, together = new_cursor(mark_delete), new_cursor(mark_delete)
    ids = [MessageId(1, entry) for entry in range(1, routed + 1)]
    for cursor in (each, together):
        cursor.ids.extend(ids)
        for number in acked_before:
            cursor.ack(MessageId(1, number))
    # The usual take: the first ids of those routed, in order; then maybe others, routed or
    # not, later in line.
    front = list(each.ids)[:from_front]
    rest = [MessageId(1, number) for number in sorted(set(out_of_line))]
    message_ids = front + [m for m in rest if not front or m > front[-1]]
    for message_id in message_ids:
        each.ack(message_id)
    together.ack_taken(message_ids)
    assert together.mark_delete == each.mark_delete
    assert together.state() == each.state()
    assert list(together.ids) == list(each.ids)
    # Marked as changed (to be saved) alike.
    assert (together in together.sub.books.changed) == (each in each.sub.books.changed)
