"""The unwritten end of the durable log: records framed into a pending buffer at their final log
positions, rolled into a new segment when the active one is full, and handed to the writer in
one piece; and the most recently written bytes, kept for reads. Pure bookkeeping; the writing
itself happens in `segments.SegmentFiles`.
"""

from __future__ import annotations

import zlib
from bisect import bisect_right
from collections.abc import Sequence

from mop.broker.storage.index import LogIndex
from mop.broker.storage.records import FRAME, HEADER_SIZE, SegmentHeader

__all__ = ["Batch", "LogTail"]


class Batch:
    """Log bytes taken for one write: [start, start + len(data)) across `bases`."""

    __slots__ = ("bases", "data", "start")

    def __init__(self, start: int, data: bytearray, bases: list[int]) -> None:
        self.start = start
        self.data = data
        self.bases = bases

    @property
    def end(self) -> int:
        return self.start + len(self.data)


class LogTail:
    """Positions below `written` are in the files; [flight.start, flight.end) is being written;
    [pending_base, end) waits in `pending`. Readers find bytes that are not in the files yet,
    or that were written recently (up to `keep_bytes` of them), with `find`."""

    def __init__(
        self, index: LogIndex, end: int, segment_bytes: int, epoch: int, keep_bytes: int = 0
    ) -> None:
        self.index = index
        self.segment_bytes = segment_bytes
        self.epoch = epoch
        self.pending = bytearray()
        self.pending_base = end
        self.end = end
        self.written = end
        self.flight: Batch | None = None
        # Written batches, oldest first, while they add up to at most `keep_bytes`: what
        # consumers that fall a little behind read back. Log positions are never reused (the
        # end only grows, and reclaim copies records forward), so these bytes stay valid for
        # their positions even after their segment is gone.
        self.keep_bytes = keep_bytes
        self._kept: list[Batch] = []
        self._kept_starts: list[int] = []
        self._kept_size = 0
        if not index.segments:
            self.roll()

    @property
    def active_base(self) -> int:
        return self.index.bases[-1]

    def add(self, body: bytes) -> tuple[int, int]:
        """Queue one record; returns its (position, framed size)."""
        size = FRAME.size + len(body)
        used = self.end - self.active_base
        if used > HEADER_SIZE and used + size > self.segment_bytes:
            self.roll()
        position = self.end
        self.pending += FRAME.pack(len(body), zlib.crc32(body))
        self.pending += body
        self.end += size
        return position, size

    def fits(self, size: int) -> bool:
        """Whether `size` more framed bytes fit the active segment without rolling it."""
        return self.end - self.active_base + size <= self.segment_bytes

    def add_frames(self, data: bytes, sizes: Sequence[int]) -> list[int]:
        """Queue framed records (`data`, made of records of `sizes`) that `fits` the active
        segment, in one append to the pending buffer; returns their positions."""
        positions = []
        position = self.end
        for size in sizes:
            positions.append(position)
            position += size
        self.pending += data
        self.end = position
        return positions

    def add_framed(self, record: bytes | memoryview) -> int:
        """Queue a record copied verbatim from an older segment; returns its position."""
        used = self.end - self.active_base
        if used > HEADER_SIZE and used + len(record) > self.segment_bytes:
            self.roll()
        position = self.end
        self.pending += record
        self.end += len(record)
        return position

    def roll(self) -> None:
        """Start a new segment at the current end; its header goes through the log like a
        record, so a failed write takes the new file back with it."""
        self.index.add_segment(self.end)
        self.pending += SegmentHeader(self.end, self.epoch).encode()
        self.end += HEADER_SIZE

    def take(self) -> Batch:
        bases = self.index.bases
        first = max(0, bisect_right(bases, self.pending_base) - 1)
        batch = Batch(self.pending_base, self.pending, bases[first:])
        self.flight = batch
        self.pending = bytearray()
        self.pending_base = self.end
        return batch

    def done(self, batch: Batch) -> None:
        self.written = batch.end
        self.flight = None
        if self.keep_bytes <= 0:
            return
        kept, starts = self._kept, self._kept_starts
        kept.append(batch)
        starts.append(batch.start)
        self._kept_size += len(batch.data)
        drop = 0
        while self._kept_size > self.keep_bytes and drop < len(kept):
            self._kept_size -= len(kept[drop].data)
            drop += 1
        if drop:
            del kept[:drop]
            del starts[:drop]

    def failed(self, batch: Batch) -> None:
        """Put a batch that could not be written back in front of the queue; its bytes keep
        their positions, so the next write tries them again."""
        # A new buffer: the failed write's traceback may still hold views of the old one.
        self.pending = batch.data + self.pending
        self.pending_base = batch.start
        self.flight = None

    def find(self, position: int, size: int) -> bytes | None:
        """The bytes at `position` if they are not in the files yet or were written recently,
        else None."""
        if position >= self.pending_base:
            offset = position - self.pending_base
            return bytes(self.pending[offset : offset + size])
        flight = self.flight
        if flight is not None and position >= flight.start:
            offset = position - flight.start
            return bytes(flight.data[offset : offset + size])
        starts = self._kept_starts
        if not starts or position < starts[0]:
            return None
        batch = self._kept[bisect_right(starts, position) - 1]
        offset = position - batch.start
        if offset + size > len(batch.data):
            return None
        return bytes(batch.data[offset : offset + size])
