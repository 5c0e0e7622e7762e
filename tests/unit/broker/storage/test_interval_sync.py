"""The "interval" fsync policy's own thread (`IntervalSyncer`) and how the store uses it."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest
import trio

from mop.broker.storage.durable import open_durable_storage
from mop.broker.storage.interval_sync import IntervalSyncer
from mop.message import Message
from tests.unit.broker.storage.conftest import small_settings


class _Log:
    """What the syncer sees of a log: a written and a synced position, and its calls."""

    def __init__(self) -> None:
        self.written = 0
        self.synced = 0
        self.fsyncs = 0
        self.failures: list[OSError] = []
        self.fail_next = False
        self.changed = threading.Condition()

    def fsync(self) -> None:
        with self.changed:
            self.fsyncs += 1
            self.changed.notify_all()
        if self.fail_next:
            self.fail_next = False
            raise OSError(errno.EIO, "injected")

    def done(self, through: int, started: float, seconds: float) -> None:
        assert seconds >= 0 and started > 0
        with self.changed:
            self.synced = through
            self.changed.notify_all()

    def failed(self, exc: OSError) -> None:
        with self.changed:
            self.failures.append(exc)
            self.changed.notify_all()

    def wait_for(self, predicate: object) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, timeout=5)  # type: ignore[arg-type]

    def syncer(self, interval: float = 0.005) -> IntervalSyncer:
        return IntervalSyncer(
            interval,
            written=lambda: self.written,
            synced=lambda: self.synced,
            fsync=self.fsync,
            done=self.done,
            failed=self.failed,
        )


def test_fsyncs_only_what_was_written_since_the_last_fsync() -> None:
    log = _Log()
    syncer = log.syncer()
    syncer.start()
    try:
        log.written = 100
        log.wait_for(lambda: log.synced == 100)
        fsyncs = log.fsyncs
        # Several ticks with nothing new written: no fsync.
        threading.Event().wait(0.05)
        assert log.fsyncs == fsyncs
        log.written = 250
        log.wait_for(lambda: log.synced == 250)
        assert log.fsyncs == fsyncs + 1
    finally:
        syncer.stop()
        syncer.join()


def test_a_failed_fsync_is_reported_and_tried_again_at_the_next_tick() -> None:
    log = _Log()
    log.fail_next = True
    syncer = log.syncer()
    syncer.start()
    try:
        log.written = 10
        log.wait_for(lambda: log.synced == 10)
        assert [exc.errno for exc in log.failures] == [errno.EIO]
        assert log.fsyncs == 2
    finally:
        syncer.stop()
        syncer.join()


def test_stop_ends_the_thread() -> None:
    syncer = _Log().syncer()
    syncer.start()
    syncer.stop()
    syncer.join()
    assert not any(t.name == "mop-log-fsync" and t.is_alive() for t in threading.enumerate())


async def test_the_interval_fsync_runs_on_its_own_thread_not_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsyncs: list[tuple[int, str]]
) -> None:
    store = await open_durable_storage(
        tmp_path, small_settings(fsync="interval", fsync_interval=0.01)
    )
    fsyncs.clear()  # opening the store fsynced its epoch
    worker_handoffs = 0
    real_run_sync = trio.to_thread.run_sync

    async def counting_run_sync(*args: object, **kwargs: object) -> object:
        nonlocal worker_handoffs
        worker_handoffs += 1
        return await real_run_sync(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(trio.to_thread, "run_sync", counting_run_sync)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.serve)
        before = store.sync_latency.count
        store.append("t", [Message(b"a")])
        await store.sync()  # written (inline, on the loop), not fsynced
        for _ in range(500):
            if store.sync_latency.count > before:
                break
            await trio.sleep(0.01)
        assert store.sync_latency.count > before
        assert fsyncs and {thread for _, thread in fsyncs} == {"mop-log-fsync"}
        assert worker_handoffs == 0
        # What the thread fsynced needs no fsync of its own.
        fsyncs.clear()
        await store.flush(store.tail.end, fsync=True)
        assert not fsyncs
        nursery.cancel_scope.cancel()
    await store.aclose()
    assert not any(t.name == "mop-log-fsync" and t.is_alive() for t in threading.enumerate())


def test_a_poke_fsyncs_at_once_whatever_the_interval() -> None:
    log = _Log()
    syncer = log.syncer(3600)
    syncer.start()
    try:
        log.written = 42
        syncer.poke()
        log.wait_for(lambda: log.synced == 42)
    finally:
        syncer.stop()
        syncer.join()  # a stop wakes it too: no hour-long wait
