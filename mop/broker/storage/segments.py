"""Segment files of the durable log: naming, the directory lock, and every blocking read,
write, truncate, fsync and unlink. Called from worker threads, except `write_now`: a small
write into an open file, which costs less than the hop to a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = [
    "DirectoryLock",
    "SegmentFiles",
    "cut_segment",
    "list_segments",
    "read_segment",
    "read_spans",
    "segment_path",
]

_SUFFIX = ".log"


def segment_path(directory: Path, base: int) -> Path:
    """Segments are named after the log position of their first byte, so names sort in log
    order and a position maps to its file without any table."""
    return directory / f"{base:020d}{_SUFFIX}"


def list_segments(directory: Path) -> list[int]:
    bases = []
    for path in directory.iterdir():
        if path.suffix == _SUFFIX and path.stem.isdigit():
            bases.append(int(path.stem))
    return sorted(bases)


def read_segment(directory: Path, base: int) -> bytes:
    return segment_path(directory, base).read_bytes()


def read_spans(directory: Path, spans: Sequence[tuple[int, int, int]]) -> list[bytes]:
    """Read (segment base, offset in file, size) spans, opening each file once.

    Raises FileNotFoundError when a segment was reclaimed since the caller looked its
    positions up; the caller looks them up again.
    """
    fds: dict[int, int] = {}
    try:
        chunks = []
        for base, offset, size in spans:
            fd = fds.get(base)
            if fd is None:
                fd = fds[base] = os.open(segment_path(directory, base), os.O_RDONLY)
            chunk = os.pread(fd, size, offset)
            if len(chunk) != size:
                raise OSError(errno.EIO, f"short read in segment {base}")
            chunks.append(chunk)
        return chunks
    finally:
        for fd in fds.values():
            os.close(fd)


def cut_segment(directory: Path, base: int, size: int) -> None:
    """Shorten a segment to `size` bytes (0: remove it) durably; recovery uses this to drop a
    torn tail before the log is appended to again."""
    path = segment_path(directory, base)
    if size == 0:
        path.unlink()
    else:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryLock:
    """An exclusive POSIX lock on `LOCK` in the data directory, so that two processes never
    write one log. POSIX (not flock) locks, so a store reopened in the same process after a
    simulated crash is not locked out by the abandoned one."""

    def __init__(self, directory: Path) -> None:
        self._fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SegmentFiles:
    """The write side of the log files. `write` puts a run of log bytes at their positions,
    creating segment files as the run crosses into them, and undoes its partial writes when it
    fails, so the files always end at a record boundary that was written whole.

    Thread-safe through one lock: the writer thread and a reclaiming thread never interleave.
    """

    def __init__(self, directory: Path, *, seal_fsync: bool) -> None:
        self.directory = directory
        self._seal_fsync = seal_fsync  # fsync a segment when the log moves past it
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}
        # Segments written since their last fsync -> the number of runs written to the files
        # when each last was (`fsync_written` keeps a segment dirty that was written again
        # while its fsync ran).
        self._dirty: dict[int, int] = {}
        self._runs = 0
        self._directory_dirty = False
        self._damaged: str | None = None
        self._closed = False

    def write(
        self,
        start: int,
        data: bytes | bytearray,
        bases: Sequence[int],
        fsync: bool,
        written: Callable[[], None] | None = None,
    ) -> None:
        """Write `data` at log position `start`; `bases` are the bases of the segments the run
        touches, in order (the first may begin before `start`). Fsync everything written so
        far when `fsync`. `written` is called once the bytes are written, before any fsync."""
        with self._lock:
            if self._damaged is not None or self._closed:
                raise OSError(errno.EIO, self._damaged or "the log is closed")
            undo: list[tuple[int, int]] = []
            try:
                with memoryview(data) as view:
                    self._write_chunks(start, view, bases, undo)
                if written is not None:
                    written()
                for base in bases[:-1]:
                    self._seal(base)
                if fsync:
                    self._fsync_dirty()
            except OSError:
                self._undo(undo)
                raise

    def write_now(self, start: int, data: bytes | bytearray, bases: Sequence[int]) -> bool:
        """`write` without fsync, for the caller's own thread, only when it cannot block for
        long: the run stays in one segment whose file is open and no other thread holds the
        files. False when it did nothing (the caller then uses `write` from a worker thread)."""
        if len(bases) != 1 or bases[0] not in self._fds:
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._damaged is not None or self._closed:
                raise OSError(errno.EIO, self._damaged or "the log is closed")
            undo: list[tuple[int, int]] = []
            try:
                with memoryview(data) as view:
                    self._write_chunks(start, view, bases, undo)
            except OSError:
                self._undo(undo)
                raise
            return True
        finally:
            self._lock.release()

    def unlink(self, base: int) -> None:
        """Delete a reclaimed segment and make the deletion durable."""
        with self._lock:
            self._close(base)
            self._dirty.pop(base, None)
            with contextlib.suppress(FileNotFoundError):
                segment_path(self.directory, base).unlink()
            _fsync_directory(self.directory)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for base in list(self._fds):
                self._close(base)

    def _write_chunks(
        self, start: int, data: memoryview, bases: Sequence[int], undo: list[tuple[int, int]]
    ) -> None:
        end = start + len(data)
        for i, base in enumerate(bases):
            limit = bases[i + 1] if i + 1 < len(bases) else end
            lo, hi = max(start, base), min(end, limit)
            if lo >= hi:
                continue
            fd = self._open(base, create=lo == base)
            undo.append((base, lo - base))
            chunk = data[lo - start : hi - start]
            offset = lo - base
            while chunk:
                written = os.pwrite(fd, chunk, offset)
                chunk, offset = chunk[written:], offset + written
            self._runs += 1
            self._dirty[base] = self._runs

    def _open(self, base: int, *, create: bool) -> int:
        fd = self._fds.get(base)
        if fd is None:
            flags = os.O_WRONLY | (os.O_CREAT | os.O_TRUNC if create else 0)
            fd = self._fds[base] = os.open(segment_path(self.directory, base), flags, 0o644)
            self._directory_dirty |= create
        return fd

    def _seal(self, base: int) -> None:
        if self._seal_fsync and base in self._dirty:
            self._fsync(self._fds[base])
            self._dirty.pop(base, None)
        if base not in self._dirty:
            self._close(base)

    def fsync_written(self) -> None:
        """Fsync everything written so far, holding the files only to look up what is dirty:
        writes made while the disk works (`write_now` on the event loop's thread, for
        records that wait for no fsync) do not wait for it. The descriptors are duplicated,
        so that a segment closed meanwhile is still fsynced."""
        with self._lock:
            if self._closed:
                return  # closing the log fsynced it first
            if self._damaged is not None:
                raise OSError(errno.EIO, self._damaged)
            dirty = {
                base: (os.dup(self._fds[base]), run)
                for base, run in self._dirty.items()
                if base in self._fds
            }
            directory = self._directory_dirty
            self._directory_dirty = False
        try:
            for base in sorted(dirty):
                self._fsync(dirty[base][0])
            if directory:
                _fsync_directory(self.directory)
        except OSError:
            with self._lock:
                self._directory_dirty |= directory
            raise
        finally:
            for fd, _ in dirty.values():
                os.close(fd)
        with self._lock:
            newest = max(self._fds, default=-1)
            for base, (_, run) in dirty.items():
                if self._dirty.get(base) == run:  # not written since
                    del self._dirty[base]
                    if base != newest:
                        self._close(base)  # sealed: never written again

    def _fsync_dirty(self) -> None:
        for base in sorted(self._dirty):
            fd = self._fds.get(base)
            if fd is not None:
                self._fsync(fd)
        if self._directory_dirty:
            _fsync_directory(self.directory)
            self._directory_dirty = False
        # Sealed segments are never written again; only the newest keeps its descriptor.
        newest = max(self._fds, default=-1)
        for base in self._dirty:
            if base != newest:
                self._close(base)
        self._dirty.clear()

    def _undo(self, undo: list[tuple[int, int]]) -> None:
        """Cut every touched file back to where this write started (a new file goes away)."""
        try:
            for base, size in reversed(undo):
                if size == 0:
                    self._close(base)
                    self._dirty.pop(base, None)
                    with contextlib.suppress(FileNotFoundError):
                        segment_path(self.directory, base).unlink()
                else:
                    os.ftruncate(self._fds[base], size)
        except OSError as exc:
            # The files may now hold a partial record before later writes: refuse to go on.
            self._damaged = f"could not undo a failed write: {exc}"

    def _fsync(self, fd: int) -> None:
        """fsync a segment. When that fails for any reason but a full disk, Linux may have
        dropped the pages it could not write and marked them clean, so a later fsync would
        succeed without them: the log refuses every write from then on rather than go on as
        if the records were safe (a restart recovers it from what is on disk)."""
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                # A plain assignment: the interval's thread fsyncs without the lock.
                self._damaged = f"fsync failed, records written before may be lost: {exc}"
            raise

    def _close(self, base: int) -> None:
        fd = self._fds.pop(base, None)
        if fd is not None:
            os.close(fd)
