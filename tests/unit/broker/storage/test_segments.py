"""SegmentFiles.fsync_written: the interval's fsync, beside the writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mop.broker.storage.segments import SegmentFiles


def test_a_segment_written_during_its_fsync_is_fsynced_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = SegmentFiles(tmp_path, seal_fsync=True)
    files.write(0, b"first", [0], fsync=False)
    fsynced: list[int] = []
    real = os.fsync

    def fsync_writing_meanwhile(fd: int) -> None:
        fsynced.append(fd)
        if len(fsynced) == 1:  # the event loop writes more while the disk works
            assert files.write_now(5, b"second", [0])
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync_writing_meanwhile)
    files.fsync_written()
    assert len(fsynced) == 2  # the segment, then the new directory entry
    files.fsync_written()
    assert len(fsynced) == 3  # "second" came after the first fsync began
    files.fsync_written()
    assert len(fsynced) == 3  # nothing written since
    files.close()
    files.fsync_written()  # closing fsynced it: nothing to do
    assert (tmp_path / os.listdir(tmp_path)[0]).read_bytes() == b"firstsecond"
