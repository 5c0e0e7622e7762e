"""`DurableStorage`: the `Storage` interface over one shared, checksummed, append-only log of
segment files, with group commit, recovery after a crash and space reclaim.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from mop.broker.storage.api import (
    CursorKey,
    CursorState,
    StorageError,
    StorageFull,
    StorageStats,
)
from mop.broker.storage.grouping import WriteGrouping
from mop.broker.storage.index import LogIndex, Run, TopicIndex
from mop.broker.storage.interval_sync import IntervalSyncer
from mop.broker.storage.log import Batch, LogTail
from mop.broker.storage.reads import LogReader
from mop.broker.storage.records import (
    TopicRecord,
    encode_cursor,
    encode_epoch,
    encode_message,
    encode_table,
    encode_topic,
    encode_topic_delete,
    encode_trim,
    frame_messages,
    framed_void,
)
from mop.broker.storage.recovery import Recovered, RecoveryReport, recover
from mop.broker.storage.segments import DirectoryLock, SegmentFiles
from mop.broker.storage.upkeep import Upkeep, UpkeepParts
from mop.counters import LatencyHistogram
from mop.log_limit import LimitedLog
from mop.message import Message, MessageId
from mop.settings import StorageSettings

if TYPE_CHECKING:
    from mop.broker.storage.api import Storage

__all__ = ["DurableStorage", "open_durable_storage"]

logger = logging.getLogger("mop.storage")
# While the disk is full every write fails the same way: one line per kind per interval.
_failures = LimitedLog(logger)

# Ledger ids are `epoch << 32 | n`: every opening of the store starts a new epoch, written and
# fsynced before any id is handed out, so ids given out before a crash (even for messages the
# crash lost) are never given out again.
_EPOCH_SHIFT = 32
# Queued bytes that make `serve` write them out without waiting for a `sync`.
_FLUSH_BYTES = 1 << 20
# Writes up to this size without fsync are made on the event loop's thread (`write_now`).
_INLINE_BYTES = 256 * 1024
# After ENOSPC, `append` refuses new messages for this long instead of queueing more.
_FULL_BACKOFF = 1.0


class _Flight:
    """One write in progress; the tasks that need it wait on `done`."""

    __slots__ = ("done", "end", "error")

    def __init__(self, end: int) -> None:
        self.end = end
        self.done = trio.Event()
        self.error: StorageError | None = None


class _Fresh:
    """Messages of one `append` that are not written yet: where their records are, so that a
    failed write can take them back."""

    __slots__ = ("end", "first", "positions", "sizes", "topic")

    def __init__(
        self, topic: TopicIndex, first: int, positions: list[int], sizes: list[int], end: int
    ) -> None:
        self.topic = topic
        self.first = first
        self.positions = positions
        self.sizes = sizes
        self.end = end


def _storage_error(exc: OSError) -> StorageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"no space left for the log: {exc}")
    return StorageError(f"log write failed: {exc}")


class DurableStorage:
    """Implements `Storage` on disk; open it with `open_durable_storage`.

    Durability of `sync()` per `settings.fsync`:
    - "always": `sync()` returns after the records are written and fsynced; a power loss loses
      nothing that a returned `sync()` covered.
    - "interval": `sync()` returns after the records are written to the operating system (they
      survive a crash of the process, not of the machine); they are fsynced within
      `fsync_interval` by `serve()` (on a thread of its own, at each of its ticks, after it
      has written the records no `sync()` asked for), or failing that by the next write after
      the interval.
    - "never": like "interval" without the timed fsync; the operating system decides.
    Whatever the policy, `aclose()` and the reclaim of a segment fsync the log first.

    Run `serve()` in the nursery that owns the store: it writes queued records in the
    background, keeps the "interval" promise and reclaims segments.
    Without it, those chores run at the end of `sync()` calls.
    """

    def __init__(
        self,
        directory: Path,
        settings: StorageSettings,
        recovered: Recovered,
        lock: DirectoryLock,
        *,
        cache_bytes: int = 32 << 20,
    ) -> None:
        self.directory = directory
        self.settings = settings
        self.recovery: RecoveryReport = recovered.report
        self._index: LogIndex = recovered.index
        self._epoch = recovered.epoch + 1
        self._next_ledger = self._epoch << _EPOCH_SHIFT
        # The most recent `cache_bytes` of the log stay in memory for reads: bytes hold no
        # references, so a large cache adds nothing to what the garbage collector walks.
        self._tail = LogTail(
            self._index, recovered.end, settings.segment_bytes, self._epoch, cache_bytes
        )
        self._files = SegmentFiles(directory, seal_fsync=settings.fsync != "never")
        self._lock = lock
        # How far the log is fsynced, when the last fsync began and how long each takes (read
        # by the metrics): a write's that fsyncs, or the interval's, which runs on a thread of
        # its own (`IntervalSyncer`), hence the lock.
        self._synced = recovered.end
        self._last_fsync = time.monotonic()
        self.sync_latency = LatencyHistogram()
        self._sync_lock = threading.Lock()
        self._flight: _Flight | None = None
        # Whether a write waits a turn for other publishers' records, and the callers that
        # asked for the next write so far.
        self._grouping = WriteGrouping()
        self._callers = 0
        self._full_until = 0.0
        # Appends and `when_written` callbacks waiting for their write, oldest first.
        self._fresh: deque[_Fresh] = deque()
        self._outcomes: deque[tuple[int, Callable[[bool], None]]] = deque()
        self._closed = False
        self._serving = False
        self._wakeup = trio.Event()
        self._reader = LogReader(self._index, self._tail, directory)
        self._upkeep = Upkeep(
            UpkeepParts(directory, settings, self._index, self._tail, self._files), self
        )

    # -- mutations -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("storage is closed")

    def append(self, topic: str, messages: Sequence[Message]) -> list[MessageId]:
        self._check_open()
        if self._full_until and time.monotonic() < self._full_until:
            raise StorageFull("the disk was full moments ago")
        index, tail = self._index, self._tail
        entry_topic = index.topics.get(topic)
        if entry_topic is None:
            entry_topic = TopicIndex(topic)
            index.add_topic(entry_topic)
        if entry_topic.ledger is None:
            self._open_ledger(entry_topic)
        run = entry_topic.runs[-1]
        millis = time.time_ns() // 1_000_000
        seconds = millis // 1000
        ledger = run.ledger
        first = run.next_entry
        # Every record is encoded before anything changes: a message that cannot be encoded
        # leaves the store as it was.
        data, sizes = frame_messages(ledger, first, millis, messages)
        if tail.fits(len(data)):
            # The common case, all in the active segment: one append to the log and to the
            # index for the lot (the messages of one read from a client, say).
            positions = tail.add_frames(data, sizes)
            index.add_messages(entry_topic, run, positions, sizes, seconds)
        else:
            positions = []
            for entry, message in enumerate(messages, first):
                position, size = tail.add(encode_message(ledger, entry, millis, message))
                index.add_message(entry_topic, run, position, size, seconds)
                positions.append(position)
        if positions:
            self._fresh.append(_Fresh(entry_topic, first, positions, sizes, tail.end))
        ids = [MessageId(ledger, entry) for entry in range(first, first + len(sizes))]
        if ids:
            entry_topic.last_id = ids[-1]
        if len(tail.pending) >= _FLUSH_BYTES:
            self._wakeup.set()
        return ids

    def _open_ledger(self, topic: TopicIndex) -> None:
        if self._next_ledger >= (self._epoch + 1) << _EPOCH_SHIFT:
            raise StorageError("ledger ids of this epoch are exhausted; reopen the store")
        ledger = self._next_ledger
        self._next_ledger += 1
        topic.ledger = ledger
        topic.runs.append(Run(ledger, 0))
        self._index.by_ledger[ledger] = topic
        self.write_topic(topic)

    def write_topic(self, topic: TopicIndex) -> None:
        record = TopicRecord(topic.name, topic.ledgers(), topic.last_id, topic.trimmed)
        position, size = self._tail.add(encode_topic(record))
        self._index.set_state(("T", topic.name), position, size)

    def trim(self, topic: str, through: MessageId) -> None:
        self._check_open()
        entry_topic = self._index.topics.get(topic)
        if entry_topic is None or entry_topic.last_id is None:
            return
        self.trim_topic(entry_topic, min(through, entry_topic.last_id))

    def retention_cut(
        self, topic: str, *, appended_before: int | None, keep_bytes: int | None
    ) -> MessageId | None:
        entry_topic = self._index.topics.get(topic)
        if entry_topic is None:
            return None
        cuts = []
        if appended_before is not None:
            cuts.append(entry_topic.expired_through(appended_before))
        if keep_bytes is not None and entry_topic.bytes > keep_bytes:
            cuts.append(entry_topic.over_through(keep_bytes))
        return max((cut for cut in cuts if cut is not None), default=None)

    def trim_topic(self, topic: TopicIndex, through: MessageId) -> None:
        """Trim through an id no later than the topic's last one (so that replaying the max
        trim at recovery equals replaying each one in order)."""
        if topic.trimmed is not None and through <= topic.trimmed:
            return
        self._index.trim_topic(topic, through)
        self._tail.add(encode_trim(topic.name, through))

    def delete_topic(self, topic: str) -> None:
        self._check_open()
        gone = self._index.drop_topic(topic)
        cursors = self._index.drop_topic_cursors(topic)
        if gone is not None or cursors:
            self._tail.add(encode_topic_delete(topic))

    def save_cursors(self, updates: Mapping[CursorKey, CursorState | None]) -> None:
        self._check_open()
        index = self._index
        for key, state in updates.items():
            if state is None and key not in index.cursors:
                continue
            position, size = self._tail.add(encode_cursor(key[0], key[1], state))
            index.put_cursor(key, state)
            index.set_state(("C", *key), None if state is None else position, size)

    def write_cursor(self, key: CursorKey) -> None:
        """Queue the current state of a cursor again (reclaim moves it forward)."""
        position, size = self._tail.add(encode_cursor(*key, self._index.cursors[key]))
        self._index.set_state(("C", *key), position, size)

    def table_put(self, table: str, key: str, value: bytes | None) -> None:
        self._check_open()
        index = self._index
        if value is None and key not in index.tables.get(table, {}):
            return
        position, size = self._tail.add(encode_table(table, key, value))
        index.put_table(table, key, value)
        index.set_state(("K", table, key), None if value is None else position, size)

    def write_table_entry(self, table: str, key: str) -> None:
        """Queue the current value of a table key again (reclaim moves it forward)."""
        value = self._index.tables[table][key]
        position, size = self._tail.add(encode_table(table, key, value))
        self._index.set_state(("K", table, key), position, size)

    def when_written(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(True)` once every record queued so far is written (to the operating
        system, before any fsync), or `callback(False)` if the write holding the last of them
        fails: its messages are then refused, never stored. Called on the event loop, in
        the order of the calls to `when_written`."""
        tail = self._tail
        if tail.written >= tail.end:
            callback(True)
        else:
            self._outcomes.append((tail.end, callback))

    def _settle(self, through: int, ok: bool) -> int:
        """Call the `when_written` callbacks covered by log position `through`."""
        outcomes, settled = self._outcomes, 0
        while outcomes and outcomes[0][0] <= through:
            callback = outcomes.popleft()[1]
            settled += 1
            try:
                callback(ok)
            except Exception:
                logger.exception("a write's outcome handler failed")
        return settled

    def _refuse(self, batch: Batch) -> None:
        """Take back the messages of a batch that could not be written: their records become
        void records of the same size (the other records in the batch, and those queued after
        it, keep their positions and are written by the next write) and leave the index."""
        fresh, index, data = self._fresh, self._index, batch.data
        while fresh and fresh[0].end <= batch.end:
            gone = fresh.popleft()
            for position, size in zip(gone.positions, gone.sizes, strict=True):
                offset = position - batch.start
                data[offset : offset + size] = framed_void(size)
            topic = gone.topic
            if index.topics.get(topic.name) is not topic or topic.ledger is None:
                continue  # deleted since
            count = len(gone.positions)
            for skip in range(count):  # retention may have trimmed the first ones already
                found = index.find(topic.ledger, gone.first + skip)
                if found is not None:
                    run, i = found
                    index.void_messages(topic, run, i, i + count - skip)
                    break
        self._settle(batch.end, False)

    def _written(self, batch: Batch) -> int:
        fresh = self._fresh
        while fresh and fresh[0].end <= batch.end:
            fresh.popleft()
        return self._settle(batch.end, True)

    # -- queries -------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        return list(self._index.topics)

    def last_id(self, topic: str) -> MessageId | None:
        entry_topic = self._index.topics.get(topic)
        return None if entry_topic is None else entry_topic.last_id

    def load_cursors(self) -> dict[CursorKey, CursorState]:
        return dict(self._index.cursors)

    def table_items(self, table: str) -> Iterator[tuple[str, bytes]]:
        return iter(list(self._index.tables.get(table, {}).items()))

    def stats(self) -> StorageStats:
        index = self._index
        return StorageStats(
            topics=len(index.topics), messages=index.messages, bytes=index.message_bytes
        )

    def oldest_append_time(self, topic: str) -> int | None:
        entry_topic = self._index.topics.get(topic)
        if entry_topic is None:
            return None
        for run in entry_topic.runs:
            if len(run):
                return int(run.times[run.head])
        return None

    def topic_size(self, topic: str) -> int:
        entry_topic = self._index.topics.get(topic)
        return 0 if entry_topic is None else entry_topic.bytes

    def disk_bytes(self) -> int:
        """Bytes the log spans on disk, from the oldest segment to the end."""
        return self._tail.end - self._index.bases[0]

    def segment_count(self) -> int:
        return len(self._index.segments)

    @property
    def reclaimed_segments(self) -> int:
        """Segments deleted since the store was opened."""
        return self._upkeep.reclaimed

    async def read(
        self, topic: str, after: MessageId | None, max_count: int, max_bytes: int | None = None
    ) -> list[tuple[MessageId, Message]]:
        self._check_open()
        return await self._reader.read(topic, after, max_count, max_bytes)

    # -- group commit --------------------------------------------------------------------------

    async def sync(self) -> None:
        self._check_open()
        fsync = self.settings.fsync == "always"
        await self.flush(self._tail.end, fsync=fsync)
        if not self._serving:
            await self._upkeep.run_if_due()

    async def flush(self, target: int, *, fsync: bool) -> None:
        """Return once the log up to position `target` is written (and fsynced if `fsync`).

        The first caller that finds no write in progress becomes the writer for everything
        queued so far; the others wait for its write and go round again if they need more.
        """
        tail = self._tail
        if (self._synced if fsync else tail.written) >= target:
            await trio.lowlevel.checkpoint()
            return
        # The tasks that are ready run before the write, not after it: publishers that are
        # ready add their records to this same write, and consumers deliver what was routed
        # at once (QoS 0). An fsync always waits for them; a write to the page cache only
        # while others join it (`WriteGrouping`). Messages that wait for `when_written` are
        # released by the write, before its fsync. Not a cancellation point, as the write never
        # was: the caller's records are queued already.
        self._callers += 1
        waited = fsync or self._grouping.should_wait()
        if waited:
            await trio.lowlevel.cancel_shielded_checkpoint()
        while (self._synced if fsync else tail.written) < target:
            flight = self._flight
            if flight is None:
                callers, self._callers = self._callers, 0
                if callers and not fsync:
                    self._grouping.written(callers, waited=waited)
                await self._write(fsync)
                continue
            await flight.done.wait()
            if flight.error is not None and target <= flight.end:
                raise type(flight.error)(*flight.error.args)

    async def _write(self, fsync: bool) -> None:
        tail, settings = self._tail, self.settings
        batch = tail.take()
        flight = self._flight = _Flight(batch.end)
        now = time.monotonic()
        if (
            settings.fsync == "interval"
            and not self._serving
            and now - self._last_fsync >= settings.fsync_interval
        ):
            fsync = True  # no `serve()` keeps the interval: the write that finds it due does
        inline = False
        settled = 0
        try:
            # A small write without fsync goes straight to the page cache: far cheaper than
            # the round trip to a worker thread, and it cannot block for long.
            inline = (
                not fsync
                and len(batch.data) <= _INLINE_BYTES
                and self._files.write_now(batch.start, batch.data, batch.bases)
            )
            if inline:
                settled = self._written(batch)
            else:
                # Shielded: the batch has left the queue and the records after it have their
                # positions, so a write given up because its caller was cancelled (a client
                # that disconnects while its publish waits) would leave a hole that later
                # writes step over, and recovery would cut the log there. It finishes.
                started = time.monotonic()
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(
                        self._files.write,
                        batch.start,
                        batch.data,
                        batch.bases,
                        fsync,
                        self._announcer(batch),
                    )
                if fsync:
                    self._note_synced(batch.end, now, time.monotonic() - started)
        except OSError as exc:
            # One outcome for the whole batch: its publishers are told it failed, so none of
            # its messages may be stored by a later write (the publishers send them again).
            self._refuse(batch)
            tail.failed(batch)
            flight.error = _storage_error(exc)
            if isinstance(flight.error, StorageFull):
                self._full_until = time.monotonic() + _FULL_BACKOFF
            raise flight.error from exc
        except BaseException:
            tail.failed(batch)  # not written: back in front of the queue, never a hole
            raise
        else:
            tail.done(batch)
            self._written(batch)  # a worker thread's write: announced already, but for fresh
            self._full_until = 0.0
            if self._outcomes:
                self._wakeup.set()  # records queued since wait for their outcome: write soon
        finally:
            self._flight = None
            flight.done.set()
        if settled:
            # Consumers of the messages this write released deliver them before the caller
            # (a publisher) acknowledges its own. Not a cancellation point: it is written.
            await trio.lowlevel.cancel_shielded_checkpoint()

    def _note_synced(self, through: int, started: float, seconds: float) -> None:
        """An fsync that began at `started` (monotonic) made the log durable up to `through`
        in `seconds`; called by a write that fsyncs and by the interval's thread."""
        with self._sync_lock:
            self._synced = max(self._synced, through)
            self._last_fsync = max(self._last_fsync, started)
            self.sync_latency.record(seconds)

    def _announcer(self, batch: Batch) -> Callable[[], None]:
        """For a worker thread's write: once the bytes are written, and while the fsync runs,
        settle the batch's `when_written` callbacks on the event loop."""
        token = trio.lowlevel.current_trio_token()

        def announce() -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._settle, batch.end, True)

        return announce

    # -- lifetime ------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Background upkeep until the store is closed (see the class docstring)."""
        if self._serving:
            raise RuntimeError("serve() is already running")
        policy = self.settings.fsync
        tick = self.settings.fsync_interval if policy == "interval" else 1.0
        syncer = self._interval_syncer() if policy == "interval" else None
        self._serving = True
        if syncer is not None:
            syncer.start()
        poked = time.monotonic()
        task_status.started()
        try:
            while not self._closed:
                with trio.move_on_after(tick):
                    await self._wakeup.wait()
                self._wakeup = trio.Event()
                if self._closed:
                    break
                try:
                    # Records that no `sync()` asked for (QoS 0 messages, cursors, tables)
                    # reach the operating system within a tick; the interval's fsync, on its
                    # own thread, follows at once.
                    end = self._tail.end
                    if (self._synced if policy == "always" else self._tail.written) < end:
                        await self.flush(end, fsync=policy == "always")
                    await self._upkeep.run_if_due()
                except StorageError as exc:
                    _failures.warning(type(exc).__name__, "background write failed: %s", exc)
                if syncer is not None and time.monotonic() - poked >= tick:
                    # Once an interval (not at every write that a wakeup asked for): what is
                    # written by now, what this tick wrote included, is fsynced.
                    poked = time.monotonic()
                    syncer.poke()
        finally:
            self._serving = False
            if syncer is not None:
                syncer.stop()
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(syncer.join)

    def _interval_syncer(self) -> IntervalSyncer:
        def failed(exc: OSError) -> None:
            error = _storage_error(exc)
            _failures.warning(type(error).__name__, "interval fsync failed: %s", error)

        return IntervalSyncer(
            self.settings.fsync_interval,
            written=lambda: self._tail.written,
            synced=lambda: self._synced,
            fsync=self._files.fsync_written,
            done=self._note_synced,
            failed=failed,
        )

    async def start(self) -> None:
        """Begin this opening's epoch durably, before any id of it is handed out."""
        self._tail.add(encode_epoch(self._epoch))
        await self.flush(self._tail.end, fsync=True)

    async def aclose(self) -> None:
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._wakeup.set()
        try:
            await self.flush(self._tail.end, fsync=True)
        finally:
            while self._flight is not None:
                await self._flight.done.wait()
            await self._upkeep.wait_idle()
            await trio.to_thread.run_sync(self._files.close)
            self._lock.release()

    def abandon(self) -> None:
        """Release the files without writing anything still queued, as if the process had
        been killed: what `sync()` did not cover may be lost. For recovery tests."""
        self._closed = True
        self._files.close()
        self._lock.release()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- its parts, for tests --------------------------------------------------------------------

    @property
    def index(self) -> LogIndex:
        return self._index

    @property
    def tail(self) -> LogTail:
        return self._tail

    @property
    def files(self) -> SegmentFiles:
        return self._files


async def open_durable_storage(
    directory: Path | str, settings: StorageSettings, *, cache_bytes: int = 32 << 20
) -> DurableStorage:
    """Open (creating it if needed) the log in `directory`, recover it and return the store;
    `store.recovery` says what was found. Close it with `aclose()`."""
    path = Path(directory)

    def recover_locked() -> tuple[DirectoryLock, Recovered]:
        path.mkdir(parents=True, exist_ok=True)
        try:
            lock = DirectoryLock(path)
        except OSError as exc:
            raise StorageError(f"{path} is in use by another process: {exc}") from exc
        try:
            return lock, recover(path)
        except BaseException:
            lock.release()
            raise

    try:
        lock, recovered = await trio.to_thread.run_sync(recover_locked)
    except OSError as exc:
        raise StorageError(f"cannot open the log in {path}: {exc}") from exc
    store = DurableStorage(path, settings, recovered, lock, cache_bytes=cache_bytes)
    try:
        await store.start()
    except BaseException:
        store.abandon()
        raise
    logger.info("%s: %s", path, recovered.report)
    return store


if TYPE_CHECKING:

    def _implements_storage(store: DurableStorage) -> Storage:
        return store
