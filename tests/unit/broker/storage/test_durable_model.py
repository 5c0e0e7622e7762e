"""A stateful model test of `DurableStorage`: random appends, trims, deletes, cursor saves,
table puts, syncs, clean reopens and crashes (with a torn write of what was not synced),
checked against a plain model of what must survive."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mop.broker.storage import CursorKey, CursorState, IdRanges
from mop.broker.storage.durable import DurableStorage, open_durable_storage
from mop.message import Message, MessageId
from mop.settings import StorageSettings

TOPICS = st.sampled_from(["a", "b", "c"])
SUBSCRIPTIONS = st.sampled_from(["s1", "s2"])
KEYS = st.sampled_from(["k1", "k2", "k3"])
TABLE = "tbl"


@dataclass
class State:
    """What the store should show: kept messages and last ids per topic, cursors, table."""

    kept: dict[str, list[MessageId]] = field(default_factory=dict)
    last: dict[str, MessageId | None] = field(default_factory=dict)
    cursors: dict[CursorKey, CursorState] = field(default_factory=dict)
    table: dict[str, bytes] = field(default_factory=dict)

    def copy(self) -> State:
        return State(
            {t: list(ids) for t, ids in self.kept.items()},
            dict(self.last),
            dict(self.cursors),
            dict(self.table),
        )


async def _observe(store: DurableStorage) -> State:
    state = State()
    for topic in store.topics():
        state.kept[topic] = [i for i, _ in await store.read(topic, None, 1_000_000)]
        state.last[topic] = store.last_id(topic)
    state.cursors = store.load_cursors()
    state.table = dict(store.table_items(TABLE))
    return state


class DurableModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="mop-model-"))
        self.settings = StorageSettings(segment_bytes=1024, fsync="always")
        self.store = self._open()
        self.model = State()
        self.durable = State()
        self.payloads: dict[tuple[str, MessageId], bytes] = {}
        self.highest: dict[str, MessageId] = {}  # every id ever handed out, lost ones too
        # What changed since the last sync, which a crash may or may not have kept:
        self.appended: dict[str, set[MessageId]] = {}
        self.deleted: set[str] = set()
        self.cursor_values: dict[CursorKey, list[CursorState | None]] = {}
        self.table_values: dict[str, list[bytes | None]] = {}

    def _open(self) -> DurableStorage:
        return trio.run(open_durable_storage, self.directory, self.settings)

    def _synced(self) -> None:
        self.durable = self.model.copy()
        self.appended.clear()
        self.deleted.clear()
        self.cursor_values.clear()
        self.table_values.clear()

    # -- mutations -----------------------------------------------------------------------------

    @rule(topic=TOPICS, payloads=st.lists(st.binary(max_size=80), min_size=1, max_size=4))
    def append(self, topic: str, payloads: list[bytes]) -> None:
        ids = self.store.append(topic, [Message(p) for p in payloads])
        previous = self.highest.get(topic)
        assert ids == sorted(set(ids))
        assert previous is None or ids[0] > previous
        self.highest[topic] = ids[-1]
        self.model.kept.setdefault(topic, []).extend(ids)
        self.model.last[topic] = ids[-1]
        self.appended.setdefault(topic, set()).update(ids)
        for message_id, payload in zip(ids, payloads, strict=True):
            self.payloads[topic, message_id] = payload

    @rule(count=st.integers(min_value=1, max_value=40))
    def burst(self, count: int) -> None:
        """Traffic on a busy topic that is consumed at once: garbage that forces reclaims to
        copy the other topics' live records forward."""
        payloads = [bytes([n % 256]) * 60 for n in range(count)]
        self.append("busy", payloads)
        self.store.trim("busy", self.model.kept["busy"][-1])
        self.model.kept["busy"] = []

    @precondition(lambda self: any(self.model.kept.values()))
    @rule(data=st.data())
    def trim(self, data: st.DataObject) -> None:
        topic = data.draw(st.sampled_from(sorted(t for t, ids in self.model.kept.items() if ids)))
        kept = self.model.kept[topic]
        through = data.draw(st.sampled_from(kept))
        self.store.trim(topic, through)
        self.model.kept[topic] = [i for i in kept if i > through]

    @rule(topic=TOPICS)
    def delete_topic(self, topic: str) -> None:
        self.store.delete_topic(topic)
        self.model.kept.pop(topic, None)
        self.model.last.pop(topic, None)
        self.deleted.add(topic)
        for key in [key for key in self.model.cursors if key[0] == topic]:
            del self.model.cursors[key]
            self.cursor_values.setdefault(key, []).append(None)

    @rule(topic=TOPICS, subscription=SUBSCRIPTIONS, data=st.data())
    def save_cursor(self, topic: str, subscription: str, data: st.DataObject) -> None:
        handed_out = sorted(i for (t, i) in self.payloads if t == topic)
        if handed_out:
            ids = st.sampled_from(handed_out)
            states = st.builds(
                CursorState, ids | st.none(), st.frozensets(ids, max_size=2).map(IdRanges.of)
            )
        else:
            states = st.just(CursorState(None))
        state = data.draw(st.none() | states)
        key = (topic, subscription)
        self.store.save_cursors({key: state})
        if state is None:
            self.model.cursors.pop(key, None)
        else:
            self.model.cursors[key] = state
        self.cursor_values.setdefault(key, []).append(state)

    @rule(key=KEYS, value=st.none() | st.binary(max_size=300))
    def table_put(self, key: str, value: bytes | None) -> None:
        self.store.table_put(TABLE, key, value)
        if value is None:
            self.model.table.pop(key, None)
        else:
            self.model.table[key] = value
        self.table_values.setdefault(key, []).append(value)

    # -- durability ----------------------------------------------------------------------------

    @rule()
    def sync(self) -> None:
        trio.run(self.store.sync)
        self._synced()

    @rule()
    def reopen(self) -> None:
        trio.run(self.store.aclose)
        self.store = self._open()
        assert self.store.recovery.truncated == 0
        self._synced()
        self.check_state()

    @rule(torn=st.integers(min_value=0, max_value=3000))
    def crash(self, torn: int) -> None:
        """Kill the process while a write of `torn` bytes of the queued records is under way."""
        tail = self.store.tail
        batch = tail.take()
        self.store.files.write(batch.start, batch.data[:torn], batch.bases, False)
        self.store.abandon()
        self.store = self._open()
        recovered = trio.run(_observe, self.store)
        self._check_crash(recovered)
        self.model = recovered
        self._synced()

    def _check_crash(self, got: State) -> None:
        durable, model = self.durable, self.model
        for topic, ids in got.kept.items():
            assert topic in durable.kept or topic in self.appended, topic
            allowed = set(durable.kept.get(topic, ())) | self.appended.get(topic, set())
            assert set(ids) <= allowed, topic  # nothing trimmed before the sync comes back
            assert ids == sorted(ids)
        for topic, ids in durable.kept.items():
            if topic in self.deleted:
                continue
            # Synced messages survive unless an unsynced trim removed them.
            assert topic in got.kept, topic
            still = set(ids) & set(model.kept.get(topic, ()))
            assert still <= set(got.kept[topic]), topic
            last, now = durable.last[topic], got.last[topic]
            assert last is None or (now is not None and now >= last)
        for cursor in durable.cursors.keys() | got.cursors.keys():
            choices = [durable.cursors.get(cursor), *self.cursor_values.get(cursor, [])]
            assert got.cursors.get(cursor) in choices, cursor
        for key in durable.table.keys() | got.table.keys():
            assert got.table.get(key) in [durable.table.get(key), *self.table_values.get(key, [])]

    # -- checks --------------------------------------------------------------------------------

    @invariant()
    def check_state(self) -> None:
        got = trio.run(_observe, self.store)
        assert got.kept == self.model.kept
        assert got.last == self.model.last
        assert got.cursors == self.model.cursors
        assert got.table == self.model.table
        stats = self.store.stats()
        assert stats.topics == len(self.model.kept)
        assert stats.messages == sum(len(ids) for ids in self.model.kept.values())

    @invariant()
    def check_payloads(self) -> None:
        async def read_all() -> None:
            for topic in self.store.topics():
                for message_id, message in await self.store.read(topic, None, 1_000_000):
                    assert message.payload == self.payloads[topic, message_id]

        trio.run(read_all)

    def teardown(self) -> None:
        if not self.store.closed:
            trio.run(self.store.aclose)
        shutil.rmtree(self.directory, ignore_errors=True)


DurableModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestDurableModel = DurableModel.TestCase
