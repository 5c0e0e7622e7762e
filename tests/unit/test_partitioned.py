"""Partitioned topics' pure rules: the partitions' names, which counts may be set, and how a
count is stored."""

from __future__ import annotations

import pytest

from mop.partitioned import (
    MAX_PARTITIONS,
    PartitionsRefused,
    check_count,
    decode_count,
    encode_count,
    partition_index,
    partition_topic,
    partitions_of,
)

TOPIC = "persistent://public/default/orders"


def test_partitions_are_named_after_the_topic() -> None:
    assert partition_topic(TOPIC, 2) == f"{TOPIC}-partition-2"
    assert partitions_of(TOPIC, 2) == [f"{TOPIC}-partition-0", f"{TOPIC}-partition-1"]
    assert partition_index(f"{TOPIC}-partition-12") == (TOPIC, 12)
    # The last suffix counts: a partitioned topic may have "-partition-" in its name.
    assert partition_index(f"{TOPIC}-partition-1-partition-0") == (f"{TOPIC}-partition-1", 0)


@pytest.mark.parametrize(
    "name",
    [TOPIC, f"{TOPIC}-partition-", f"{TOPIC}-partition-01", f"{TOPIC}-partition-x", "-partition-1"],
)
def test_other_names_are_no_partitions(name: str) -> None:
    assert partition_index(name) is None


def test_a_count_must_be_positive_bounded_and_grow() -> None:
    check_count(TOPIC, 1)
    check_count(TOPIC, MAX_PARTITIONS)
    check_count(TOPIC, 5, current=4)
    for wrong in (0, -1, MAX_PARTITIONS + 1):
        with pytest.raises(PartitionsRefused) as refused:
            check_count(TOPIC, wrong)
        assert refused.value.reason == "invalid_partitions"
    for fewer in (4, 3):
        with pytest.raises(PartitionsRefused, match="can only grow") as refused:
            check_count(TOPIC, fewer, current=4)
        assert refused.value.reason == "fewer_partitions"
    # As in Pulsar, no partitioned topic's name contains "-partition-", whatever follows it.
    for name in (f"{TOPIC}-partition-0", f"{TOPIC}-partition-x", f"{TOPIC}-partition-"):
        with pytest.raises(PartitionsRefused, match="cannot contain") as refused:
            check_count(name, 2)
        assert refused.value.reason == "partition_name"


def test_a_stored_count_reads_back_and_garbage_is_none() -> None:
    assert decode_count(encode_count(7)) == 7
    for stored in (None, b"", b"x", b"0", b"-3", b"\xff", str(MAX_PARTITIONS + 1).encode()):
        assert decode_count(stored) == 0
