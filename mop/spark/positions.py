"""Positions in a topic: Pulsar message ids used as Spark offsets, and which messages a range holds.

A position names the last message already read; a range is every message after its start up to
and including its end. Text form is mop's `MessageId` form, `ledger:entry` for a whole entry and
`ledger:entry:batch_index` for one message of a producer batch, so a `message_id` seen in a row
can be given back as a starting position. `earliest` is the position before every message.

Ordering: a whole-entry position covers every message of the entry, so `L:E` sorts after
`L:E:i` for each batch index i.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from mop.message import MessageId

__all__ = [
    "EARLIEST",
    "WHOLE_ENTRY",
    "Offsets",
    "advance",
    "format_position",
    "offsets_from_json",
    "offsets_to_json",
    "order_key",
    "parse_position",
    "whole_entries_through",
]

EARLIEST: Final = MessageId(-1, -1)
# The batch index an `order_key` gives a whole entry: after every real one (they are int32).
WHOLE_ENTRY: Final = 1 << 62

Offsets = dict[str, MessageId]


def order_key(position: MessageId) -> tuple[int, int, int]:
    """Sort key: a message id sorts after its start when it is new to a reader of the range."""
    index = position.batch_index
    return position.ledger, position.entry, index if index >= 0 else WHOLE_ENTRY


def parse_position(text: str) -> MessageId:
    """`earliest`, `ledger:entry` or `ledger:entry:batch_index` -> a position."""
    text = text.strip()
    if text.lower() == "earliest":
        return EARLIEST
    try:
        position = MessageId.parse(text)
    except ValueError:
        raise ValueError(
            f"not a position: {text!r} (expected 'earliest', 'ledger:entry' or"
            " 'ledger:entry:batch_index')"
        ) from None
    if position != EARLIEST and (position.ledger < 0 or position.entry < 0):
        raise ValueError(f"not a position: {text!r} (ledger and entry must be >= 0)")
    return position


def format_position(position: MessageId) -> str:
    return "earliest" if position == EARLIEST else str(position)


def offsets_to_json(offsets: Mapping[str, MessageId]) -> dict[str, str]:
    """The dict Spark stores as an offset. Spark compares offsets by their JSON text, so the
    keys must come in one order every time (sorted) and equal positions must print alike."""
    return {topic: format_position(offsets[topic]) for topic in sorted(offsets)}


def offsets_from_json(value: Mapping[str, object] | str | None) -> Offsets:
    """The inverse of `offsets_to_json`; also takes the JSON text itself (None: no offsets)."""
    if value is None:
        return {}
    loaded = json.loads(value) if isinstance(value, str) else value
    if not isinstance(loaded, Mapping):
        raise ValueError(f"an offset must be a JSON object, not {loaded!r}")
    return {str(topic): parse_position(str(text)) for topic, text in loaded.items()}


def advance(first: MessageId, latest: MessageId, entries: int) -> MessageId:
    """The end of a range that starts with the message at `first`, holds at most `entries`
    stored entries (at least one) and stops at `latest`.

    Entry ids count up within a ledger, so the bound is exact when `first` and `latest` share
    one; otherwise the range ends within the ledger of `first` (the next range then starts in the
    ledger that follows it).
    """
    end = MessageId(first.ledger, first.entry + max(1, entries) - 1)
    return latest if order_key(latest) <= order_key(end) else end


def whole_entries_through(position: MessageId) -> MessageId | None:
    """The last whole entry at or before `position`: a subscription acknowledged up to it has
    kept every message after `position`. None when there is no such entry."""
    if position.batch_index < 0:
        return None if position == EARLIEST else position
    if position.entry == 0:
        return None
    return MessageId(position.ledger, position.entry - 1)
