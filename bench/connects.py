"""Sequential MQTT connects against an in-process merged node: the cost of one CONNECT to
CONNACK (authentication, session, lease), without the load generator's parallel storm. The
process collects garbage as `mop run` does.

    python bench/connects.py [N]          # N connections, kept open until the end (default 3000)

For an A/B, run it with PYTHONPATH pointing at each tree (e.g. a `git archive` of the old
commit), interleaved, and compare the medians.
"""

from __future__ import annotations

import gc
import socket
import sys
import time

from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import Connect
from mop.testing.node import node_settings, running_node

# Bounds: never more connections than this, never longer than this many seconds.
MAX_CONNECTIONS = 20_000
MAX_SECONDS = 120.0


def main() -> None:
    count = min(int(sys.argv[1]) if len(sys.argv) > 1 else 3000, MAX_CONNECTIONS)
    # The collector as `mop run` sets it (mop/cli, `_run`): with the default thresholds it
    # takes more of each connect than everything else. Set here rather than imported, so
    # that this script measures older trees too.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    with running_node(node_settings()) as node:
        sockets: list[socket.socket] = []
        started = time.perf_counter()
        try:
            for index in range(count):
                if time.perf_counter() - started > MAX_SECONDS:
                    break
                sock = socket.create_connection(("127.0.0.1", node.mqtt_port), timeout=10)
                sockets.append(sock)
                sock.sendall(encode(Connect(f"bench-{index}", protocol_level=4), 4))
                if sock.recv(16)[:1] != b"\x20":
                    raise SystemExit("no CONNACK")
            elapsed = time.perf_counter() - started
            print(f"{len(sockets)} connects in {elapsed:.2f}s: {len(sockets) / elapsed:.0f}/s")
        finally:
            for sock in sockets:
                sock.close()


if __name__ == "__main__":
    main()
