"""Sampling the node's memory with psutil, a few times a second (never per message), into the
`OverloadGuard` that the adapters consult."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import psutil
import trio

from mop.overload.guard import OverloadGuard
from mop.overload.watermark import resolve_watermarks
from mop.settings import LimitsSettings

__all__ = ["open_guard", "process_rss", "serve_memory_watch", "total_memory"]

_PROCESS = psutil.Process()


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


async def serve_memory_watch(
    guard: OverloadGuard,
    interval: float,
    *,
    read_used: Callable[[], int] | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Give `guard` a sample of the memory used (`read_used`, default this process's RSS)
    every `interval` seconds, the first before reporting started."""
    read = read_used if read_used is not None else process_rss
    guard.observe_memory(read())
    task_status.started()
    while True:
        await trio.sleep(interval)
        guard.observe_memory(read())
