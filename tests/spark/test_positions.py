"""Positions and offsets: message ids as Spark offsets, range membership and cutting."""

from __future__ import annotations

import json

import pytest

from mop.message import MessageId
from mop.spark.positions import (
    EARLIEST,
    advance,
    format_position,
    offsets_from_json,
    offsets_to_json,
    order_key,
    parse_position,
    whole_entries_through,
)
from mop.spark.reading import TopicRange, split_range

pytestmark = pytest.mark.spark


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("earliest", EARLIEST),
        (" EARLIEST ", EARLIEST),
        ("3:17", MessageId(3, 17)),
        ("0:5:2", MessageId(0, 5, 2)),
    ],
)
def test_parse_position(text: str, position: MessageId) -> None:
    assert parse_position(text) == position
    assert parse_position(format_position(position)) == position


@pytest.mark.parametrize("text", ["", "latest", "1", "1:2:3:4", "a:b", "-1:5", "2:-3"])
def test_parse_position_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_position(text)


def test_a_whole_entry_sorts_after_each_of_its_batch_messages() -> None:
    ordered = [
        EARLIEST,
        MessageId(0, 4),
        MessageId(0, 5, 0),
        MessageId(0, 5, 9),
        MessageId(0, 5),
        MessageId(0, 6, 0),
        MessageId(1, 0),
    ]
    assert sorted(reversed(ordered), key=order_key) == ordered


def test_offsets_json_is_canonical() -> None:
    one = offsets_to_json({"b": MessageId(0, 5), "a": EARLIEST, "c": MessageId(2, 1, 3)})
    two = offsets_to_json({"c": MessageId(2, 1, 3), "a": EARLIEST, "b": MessageId(0, 5)})
    # Spark compares offsets by their JSON text.
    assert json.dumps(one) == json.dumps(two) == ('{"a": "earliest", "b": "0:5", "c": "2:1:3"}')
    assert (
        offsets_from_json(json.dumps(one))
        == offsets_from_json(one)
        == {"a": EARLIEST, "b": MessageId(0, 5), "c": MessageId(2, 1, 3)}
    )
    assert offsets_from_json(None) == {}


def test_advance_counts_entries_within_a_ledger() -> None:
    assert advance(MessageId(0, 10), MessageId(0, 100), 5) == MessageId(0, 14)
    assert advance(MessageId(0, 10, 3), MessageId(0, 100), 1) == MessageId(0, 10)
    assert advance(MessageId(0, 10), MessageId(0, 12, 4), 5) == MessageId(0, 12, 4)
    # Across ledgers the range ends within the first one.
    assert advance(MessageId(1, 10), MessageId(2, 3), 5) == MessageId(1, 14)


def test_whole_entries_through_keeps_a_half_read_batch() -> None:
    assert whole_entries_through(MessageId(0, 7)) == MessageId(0, 7)
    assert whole_entries_through(MessageId(0, 7, 2)) == MessageId(0, 6)
    assert whole_entries_through(MessageId(0, 0, 2)) is None
    assert whole_entries_through(EARLIEST) is None


def test_split_range_within_a_ledger() -> None:
    ranges = split_range("t", MessageId(0, 9), MessageId(0, 30, 2), 10)
    assert ranges == [
        TopicRange("t", MessageId(0, 9), MessageId(0, 19)),
        TopicRange("t", MessageId(0, 19), MessageId(0, 29)),
        TopicRange("t", MessageId(0, 29), MessageId(0, 30, 2)),
    ]


def test_split_range_from_earliest_needs_the_first_message() -> None:
    assert split_range("t", EARLIEST, MessageId(4, 25), 10) == [
        TopicRange("t", EARLIEST, MessageId(4, 25))
    ]
    assert split_range("t", EARLIEST, MessageId(4, 25), 10, first=MessageId(4, 3)) == [
        TopicRange("t", EARLIEST, MessageId(4, 12)),
        TopicRange("t", MessageId(4, 12), MessageId(4, 22)),
        TopicRange("t", MessageId(4, 22), MessageId(4, 25)),
    ]
    # The first message in an older ledger: the range cannot be cut by entry ids.
    assert len(split_range("t", EARLIEST, MessageId(4, 25), 10, first=MessageId(3, 0))) == 1


def test_split_range_small_enough_stays_whole() -> None:
    assert split_range("t", MessageId(0, 1), MessageId(0, 11), 10) == [
        TopicRange("t", MessageId(0, 1), MessageId(0, 11))
    ]
