"""`CompactedTopics.last` is kept up to date as keys are written, deleted and restored; it must
answer what a full scan of the live keys answers, after any sequence of those."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mop.broker.compaction import TOMBSTONE_PROPERTY, CompactedTopics
from mop.broker.storage import MemoryStorage
from mop.message import Message, MessageId

TOPIC = "persistent://public/__mop/retained"
KEYS = st.sampled_from("abcde")  # few keys, so writes often replace and delete the newest

# One step: a write of a key, a tombstone, a batch of both, a message without a key, a restart.
STEP = st.one_of(
    st.tuples(st.just("put"), KEYS),
    st.tuples(st.just("delete"), KEYS),
    st.tuples(st.just("batch"), st.lists(st.tuples(KEYS, st.booleans()), min_size=1, max_size=4)),
    st.tuples(st.just("unkeyed"), st.none()),
    st.tuples(st.just("restart"), st.none()),
)


def member(key: str | None, tombstone: bool) -> Message:
    properties = ((TOMBSTONE_PROPERTY, "1"),) if tombstone else ()
    return Message(b"v", key=key, properties=properties)


def scanned_last(model: dict[str, MessageId]) -> MessageId | None:
    """The answer by brute force: the newest entry holding a live key, with the index of its
    last live member in what a reader gets, for a batch."""
    if not model:
        return None
    whole = max(position.whole for position in model.values())
    members = [position for position in model.values() if position.whole == whole]
    if members[0].batch_index < 0:
        return whole
    return MessageId(whole.ledger, whole.entry, len(members) - 1)


def read_last(tables: CompactedTopics) -> MessageId | None:
    """The answer as a reader from the earliest position sees it: its last delivery."""
    ids, entries = tables.backlog(TOPIC, None, [], frozenset())
    if not ids:
        return None
    batch = entries[-1].message.batch
    return ids[-1] if not batch else MessageId(ids[-1].ledger, ids[-1].entry, len(batch) - 1)


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=40))
def test_last_matches_a_full_scan_through_writes_deletes_and_restarts(
    steps: list[tuple[str, object]],
) -> None:
    storage = MemoryStorage()
    tables = CompactedTopics(storage, tenant="public")
    model: dict[str, MessageId] = {}  # live key -> its position, kept by the test alone
    for kind, arg in steps:
        if kind == "restart":
            tables = CompactedTopics(storage, tenant="public")
            tables.restore()
        else:
            if kind == "put" or kind == "delete":
                assert isinstance(arg, str)
                message = member(arg, kind == "delete")
                members: list[tuple[str | None, bool]] = [(arg, kind == "delete")]
            elif kind == "batch":
                assert isinstance(arg, list)
                members = list(arg)
                message = Message(b"", batch=tuple(member(k, dead) for k, dead in members))
            else:
                members = [(None, False)]
                message = member(None, False)
            message_id = storage.append(TOPIC, (message,))[0]
            tables.record(TOPIC, message_id, message)
            for index, (key, dead) in enumerate(members):
                if key is None:
                    continue
                if dead:
                    model.pop(key, None)
                else:
                    position = -1 if kind != "batch" else index
                    model[key] = MessageId(message_id.ledger, message_id.entry, position)
        expected = scanned_last(model)
        assert tables.last(TOPIC) == expected
        assert read_last(tables) == expected
        assert sorted(tables.keys(TOPIC)) == sorted(model)


def test_last_of_an_unknown_topic_is_none() -> None:
    assert CompactedTopics(MemoryStorage(), tenant="public").last(TOPIC) is None


def test_last_skips_entries_whose_keys_all_died() -> None:
    storage = MemoryStorage()
    tables = CompactedTopics(storage, tenant="public")
    kept = Message(b"v", key="kept")
    kept_id = storage.append(TOPIC, (kept,))[0]
    tables.record(TOPIC, kept_id, kept)
    # Many overwrites of one key: every entry but the newest dies, then the newest is deleted.
    for _ in range(1000):
        churn = Message(b"v", key="churn")
        tables.record(TOPIC, storage.append(TOPIC, (churn,))[0], churn)
    tombstone = member("churn", True)
    tables.record(TOPIC, storage.append(TOPIC, (tombstone,))[0], tombstone)
    assert tables.last(TOPIC) == kept_id
