"""Sampling the node's memory with psutil, a few times a second (never per message), into the
`OverloadGuard` that the adapters consult.

The memory judged is the process's resident set (RSS): what the system counts, and what an
out-of-memory killer or a container limit acts on. But memory the process frees is not given
back to the system by itself: CPython hands freed objects to the C library's malloc, and glibc
keeps most of what it gets back for later allocations. Measured: a node idle at 66 MiB that 171
retained messages of 256 KiB took to 255 MiB was still at 227 MiB 15 s after they were deleted
(a garbage collection changes nothing); `malloc_trim(0)` takes such a node to about 100 MiB. A
node judged on RSS alone would stay over its mark after such a spike, with no load left. So a
sample that would put the node over its mark, or keep it there, is taken again after the node
gave back what it freed (`release_memory`): a garbage collection, for cycles that hold memory,
then glibc's `malloc_trim(0)` where there is one. What stays resident then is memory the node
holds (and arenas of Python's small objects that a few live objects keep). Counting malloc's
memory in use instead (glibc's `mallinfo2`) would miss those arenas, which CPython maps itself,
and every allocator but glibc's.

Releasing costs a garbage collection (milliseconds per million objects) and a walk over
malloc's free memory, so it runs at most once per sample interval, and no more often than keeps
it under `_RELEASE_SHARE` of the node's time.
"""

from __future__ import annotations

import ctypes
import gc
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Final, NoReturn

import psutil
import trio

from mop.overload.guard import OverloadGuard
from mop.overload.watermark import resolve_watermarks
from mop.settings import LimitsSettings

__all__ = [
    "can_trim_malloc",
    "open_guard",
    "process_rss",
    "release_memory",
    "serve_memory_watch",
    "total_memory",
]

_PROCESS = psutil.Process()
# The most of the node's time that giving memory back may take: after a release that took t
# seconds, the next waits t / _RELEASE_SHARE seconds at least.
_RELEASE_SHARE: Final = 0.05


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, which gives the free memory of every malloc arena back to the
    system (None where the C library has none: musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the process runs on
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim_malloc: Callable[[int], int] = trim
    return trim_malloc


_MALLOC_TRIM: Final = _find_malloc_trim()


def can_trim_malloc() -> bool:
    """Whether `release_memory` can give malloc's free memory back (glibc)."""
    return _MALLOC_TRIM is not None


def process_rss() -> int:
    """This process's resident memory, in bytes."""
    return int(_PROCESS.memory_info().rss)


def total_memory() -> int:
    """The machine's memory, in bytes."""
    return int(psutil.virtual_memory().total)


def open_guard(limits: LimitsSettings) -> OverloadGuard:
    """The guard of a node with `limits`; ValueError when the memory marks cannot be used (a
    low mark that is not below the high one)."""
    watermarks = resolve_watermarks(
        limits.memory_high_watermark, limits.memory_low_watermark, total_memory()
    )
    return OverloadGuard(limits, watermarks=watermarks)


async def release_memory() -> None:
    """Give the system back the memory the process freed: collect garbage cycles, then trim
    malloc's free memory (glibc only; in a worker thread, since ctypes lets go of the GIL and
    a large heap takes a while to walk)."""
    gc.collect()
    trim = _MALLOC_TRIM
    if trim is not None:
        await trio.to_thread.run_sync(trim, 0)


async def serve_memory_watch(
    guard: OverloadGuard,
    interval: float,
    *,
    read_used: Callable[[], int] | None = None,
    release: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Give `guard` a sample of the memory used (`read_used`, default this process's RSS)
    every `interval` seconds, the first before reporting started. A sample that would put
    the node over its mark or keep it there is taken again after `release` (default
    `release_memory`), at most once per interval and within `_RELEASE_SHARE` of the time."""
    read = read_used if read_used is not None else process_rss
    give_back = release if release is not None else release_memory
    next_release = -float("inf")

    async def sample() -> None:
        nonlocal next_release
        used = read()
        now = trio.current_time()
        if guard.memory_pressing(used) and now >= next_release:
            started = time.perf_counter()
            await give_back()
            took = time.perf_counter() - started
            next_release = now + max(interval, took / _RELEASE_SHARE)
            before, used = used, read()
            guard.released_memory(before, used)
        guard.observe_memory(used)

    await sample()
    task_status.started()
    while True:
        await trio.sleep(interval)
        await sample()
