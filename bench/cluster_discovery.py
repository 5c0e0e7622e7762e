"""What idle wildcard subscriptions of one separated proxy cost the brokers and the proxy.

A mop broker node runs as its own process; a `ClusterBackend` (the proxy's backend) in this
process reaches it through a relay that counts the commands it forwards. For each count of
wildcard consumers the bench subscribes them (each its own subscription, over a few existing
topics), waits until they are settled, then, for a fixed idle window, counts the topic listings
(GET_TOPICS_OF_NAMESPACE) and lookups that reach the broker and the CPU time of this process
(pulsar-client's threads included), and of the broker process.

    python bench/cluster_discovery.py --consumers 1 200 1000 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trio
from brokers import REPO_DIR, cpu_ticks, free_port

from mop.message import Message
from mop.processor.backend import SubscriptionSpec
from mop.protocols.pulsar.commands import CommandType
from mop.testing.cluster import open_cluster_backend
from mop.testing.pulsar_relay import open_counting_relay
from mop.topic_names import mqtt_to_pulsar

TOPICS = 5  # existing topics every consumer follows
SETTLE = 3.0  # seconds after subscribing before the window starts
STARTUP_TIMEOUT = 30.0


def start_broker(data_dir: Path) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    # The caller's MOP_* variables would be settings to mop: none may leak in.
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MOP_")}
    environ.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_DIR), environ.get("PYTHONPATH")])),
        MOP_DATA_DIR=str(data_dir),
        MOP_ADMIN__PORT="0",
        MOP_PROTOCOLS='["pulsar"]',
        MOP_PULSAR__PORT=str(port),
        MOP_MQTT__SYS_INTERVAL="0",
        MOP_STORAGE__FSYNC="never",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "mop", "run"],
        env=environ,
        cwd=data_dir.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + STARTUP_TIMEOUT
    for line in process.stdout:
        if re.search(r"pulsar listening on tcp", line):
            return process, port
        if time.monotonic() > deadline:
            break
    process.kill()
    raise RuntimeError("the broker did not start")


async def measure(port: int, pid: int, consumers: int, seconds: float) -> dict[str, float]:
    prefix = f"b{uuid.uuid4().hex[:8]}"
    async with (
        open_counting_relay("127.0.0.1", port) as relay,
        open_cluster_backend(relay.service_url) as backend,
    ):
        for index in range(TOPICS):
            topic = mqtt_to_pulsar(f"{prefix}/{index}/x")
            await backend.publish(topic, Message(b"seed"))
        opened = []
        for index in range(consumers):
            spec = SubscriptionSpec(
                name=f"{prefix}-{index}", selectors=frozenset([f"{prefix}/+/x"])
            )
            opened.append(await backend.subscribe(spec))
        await trio.sleep(SETTLE)
        before = relay.counts.copy()
        cpu, wall, ticks = time.process_time(), time.monotonic(), cpu_ticks(pid)
        await trio.sleep(seconds)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        ticks = cpu_ticks(pid) - ticks
        listings = (
            relay.counts[CommandType.GET_TOPICS_OF_NAMESPACE]
            - before[CommandType.GET_TOPICS_OF_NAMESPACE]
        )
        lookups = relay.counts[CommandType.LOOKUP] - before[CommandType.LOOKUP]
        result = {
            "consumers": consumers,
            "listings_per_s": listings / wall,
            "lookups_per_s": lookups / wall,
            "proxy_cpu_percent": 100 * cpu / wall,
            "broker_cpu_percent": 100 * ticks / os.sysconf("SC_CLK_TCK") / wall,
        }
        print(json.dumps(result), flush=True)
        for consumer in opened:
            await consumer.unsubscribe()
    return result


async def main(counts: list[int], seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        process, port = start_broker(Path(tmp) / "data")
        try:
            for consumers in counts:
                await measure(port, process.pid, consumers, seconds)
        finally:
            process.terminate()
            process.wait(timeout=15)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--consumers", type=int, nargs="+", default=[1, 200, 1000])
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    trio.run(main, args.consumers, args.seconds)
