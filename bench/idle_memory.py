"""What an idle MQTT connection holds on an in-process merged node: a tracemalloc diff of N idle
MQTT 3.1.1 connections, in bytes per connection, by where mop made them (the innermost mop
frame of each allocation; "trio" for what trio makes without a mop frame: the task, the
socket objects, the accept) and by the type of the objects the collector tracks.

    python bench/idle_memory.py [N]        # default 2000 connections

Unlike the resident memory the bench reports, it is the same from run to run and says where
the bytes go. For an A/B, run it with PYTHONPATH pointing at each tree.
"""

from __future__ import annotations

import collections
import gc
import socket
import sys
import time
import tracemalloc

from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import Connect
from mop.testing.node import node_settings, running_node

MAX_CONNECTIONS = 8_000
# Connections opened before the first snapshot, so that caches and pools are warm.
WARM_UP = 200
# How many allocation sites and types to print.
TOP = 30


def open_connections(port: int, count: int, first: int) -> list[socket.socket]:
    sockets = []
    for index in range(first, first + count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sockets.append(sock)
        sock.sendall(encode(Connect(f"idle-{index}", protocol_level=4, keep_alive=60), 4))
        if sock.recv(16)[:1] != b"\x20":
            raise SystemExit("no CONNACK")
    return sockets


def tracked_types() -> tuple[collections.Counter[str], collections.Counter[str]]:
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    return counts, sizes


def site(traceback: tracemalloc.Traceback) -> str:
    for frame in reversed(traceback):
        if "/mop/" in frame.filename:
            return f"{frame.filename.rsplit('/mop/', 1)[1]}:{frame.lineno}"
    return "trio"


def main() -> None:
    count = min(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, MAX_CONNECTIONS)
    with running_node(node_settings()) as node:
        sockets = open_connections(node.mqtt_port, WARM_UP, 0)
        try:
            time.sleep(0.5)
            gc.collect()
            tracemalloc.start(25)
            counts_before, sizes_before = tracked_types()
            before = tracemalloc.take_snapshot()
            sockets += open_connections(node.mqtt_port, count, WARM_UP)
            time.sleep(1.0)  # every connection waiting for its next packet
            gc.collect()
            after = tracemalloc.take_snapshot()
            counts_after, sizes_after = tracked_types()
        finally:
            for sock in sockets:
                sock.close()
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    diff = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "traceback")
    total = sum(stat.size_diff for stat in diff)
    print(f"{count} idle connections: {total / count:.0f} B per connection")
    by_site: collections.Counter[str] = collections.Counter()
    for stat in diff:
        by_site[site(stat.traceback)] += stat.size_diff
    print("\nby where mop made it (B per connection):")
    for where, size in by_site.most_common(TOP):
        print(f"{size / count:8.0f}  {where}")
    print("\nby type, objects the collector tracks (B and objects per connection):")
    rows = [
        (
            name,
            (sizes_after[name] - sizes_before[name]) / count,
            counts_after[name] - counts_before[name],
        )
        for name in set(counts_after) | set(counts_before)
    ]
    rows.sort(key=lambda row: -row[1])
    for name, size, objects in rows[:TOP]:
        print(f"{size:8.0f} {objects / count:6.2f}  {name}")


if __name__ == "__main__":
    main()
