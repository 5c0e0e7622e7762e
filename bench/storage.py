"""Benchmark of the durable store: append+sync throughput and latency per fsync policy and
publisher count, and recovery time for a log of a given size. Prints markdown tables.

    python bench/storage.py [--duration 3] [--recovery-size 1G] [--dir /path/on/the/disk]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio

from mop.broker.storage import CursorState
from mop.broker.storage.durable import DurableStorage, open_durable_storage
from mop.message import Message
from mop.settings import FsyncPolicy, StorageSettings

POLICIES: tuple[FsyncPolicy, ...] = ("always", "interval", "never")
PUBLISHERS = (1, 10, 100)
PAYLOAD = b"p" * 100


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


async def publish(
    store: DurableStorage, publishers: int, duration: float, max_messages: int
) -> tuple[int, float, list[float]]:
    """`publishers` tasks, each appending one message and awaiting sync() in a loop (a QoS 1
    publisher), until `max_messages` or `duration` is reached."""
    latencies: list[float] = []
    deadline = time.perf_counter() + duration

    async def publisher(n: int) -> None:
        topic = f"bench/{n % 10}"
        message = Message(PAYLOAD)
        while len(latencies) < max_messages and time.perf_counter() < deadline:
            started = time.perf_counter()
            store.append(topic, [message])
            await store.sync()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for n in range(publishers):
            nursery.start_soon(publisher, n)
    return len(latencies), time.perf_counter() - started, latencies


async def bench_appends(
    root: Path, duration: float, max_messages: int
) -> dict[tuple[str, int], float]:
    print("| fsync | publishers | messages | msg/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|---:|")
    rates: dict[tuple[str, int], float] = {}
    for policy in POLICIES:
        for publishers in PUBLISHERS:
            directory = Path(tempfile.mkdtemp(dir=root, prefix=f"{policy}-{publishers}-"))
            store = await open_durable_storage(directory, StorageSettings(fsync=policy))
            async with trio.open_nursery() as nursery:
                await nursery.start(store.serve)
                count, elapsed, latencies = await publish(store, publishers, duration, max_messages)
                await store.aclose()
            latencies.sort()
            rate = count / elapsed
            rates[policy, publishers] = rate
            p50 = statistics.median(latencies) * 1e3
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3
            print(f"| {policy} | {publishers} | {count} | {rate:,.0f} | {p50:.2f} | {p99:.2f} |")
    return rates


async def write_log(directory: Path, size: int, topics: int) -> tuple[int, float]:
    """Fill a log to about `size` bytes: 100-byte messages over `topics` topics, a cursor
    saved per topic every batch; returns (messages, seconds)."""
    settings = StorageSettings(fsync="never")
    store = await open_durable_storage(directory, settings)
    message, count = Message(PAYLOAD), 0
    started = time.perf_counter()
    while store.disk_bytes() < size:
        for n in range(topics):
            ids = store.append(f"bench/{n}", [message] * 100)
            store.save_cursors({(f"bench/{n}", "sub"): CursorState(ids[49])})
            count += 100
        await store.sync()
    await store.aclose()
    return count, time.perf_counter() - started


async def bench_recovery(root: Path, size: int, topics: int) -> None:
    directory = Path(tempfile.mkdtemp(dir=root, prefix="recovery-"))
    count, wrote = await write_log(directory, size, topics)
    started = time.perf_counter()
    store = await open_durable_storage(directory, StorageSettings())
    reopened = time.perf_counter() - started
    report = store.recovery
    await store.aclose()
    print()
    print("| log size | messages | topics | write s | reopen s | scan MB/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {report.bytes / 1e6:,.0f} MB | {count:,} | {topics} | {wrote:.1f} | {reopened:.2f}"
        f" | {report.bytes / 1e6 / report.seconds:,.0f} |"
    )
    print(f"\nrecovery: {report}")


async def main(args: argparse.Namespace) -> None:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="mop-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"data in {root}\n")
    if not args.skip_appends:
        rates = await bench_appends(root, args.duration, args.max_messages)
        ratio = rates["always", 100] / rates["never", 100]
        print(f"\nalways/never at 100 publishers: {ratio:.2f} (target >= 0.5)")
    if args.recovery_size:
        await bench_recovery(root, parse_size(args.recovery_size), args.topics)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per case")
    parser.add_argument("--max-messages", type=int, default=200_000, help="per case")
    parser.add_argument("--recovery-size", default="1G", help="log size to recover; 0 skips")
    parser.add_argument("--topics", type=int, default=100, help="topics in the recovery log")
    parser.add_argument("--dir", help="where to put the data (default: a new temp dir)")
    parser.add_argument("--skip-appends", action="store_true")
    trio.run(main, parser.parse_args())
