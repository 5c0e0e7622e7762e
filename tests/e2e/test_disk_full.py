"""A node whose data directory fills up: a real `mop run` on a 20 MB tmpfs, MQTT 5 QoS 1 publishes
until the node answers 0x97 (quota exceeded). A publish answered 0x97 reaches no subscriber and is
not in the log after `kill -9`; everything acknowledged is; the node writes a bounded number of
warnings and accepts publishes again soon after space returns.

Mounting a tmpfs needs root (CAP_SYS_ADMIN); without it the test is skipped.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import trio
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from mop.broker.storage.durable import open_durable_storage
from mop.settings import StorageSettings
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.nodeproc import NodeProcess

pytestmark = pytest.mark.e2e

FS_SIZE = "20m"
HEADROOM = 2 << 20  # free bytes left beside the filler file: about 2,000 publishes
PAYLOAD_PAD = b"." * 1000
TOPIC = "full/t"
MAX_PUBLISHES = 20_000
PUBLISH_DEADLINE = 60.0
WANT_REFUSED = 200  # publishes answered 0x97 before the test stops publishing
WINDOW = 32
SETTLE = 1.0  # seconds for deliveries in flight to arrive
RECOVERY_DEADLINE = 10.0
MAX_WARNINGS = 20
QUOTA_EXCEEDED = 0x97


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {FS_SIZE} tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)


def payload(n: int) -> bytes:
    return b"%d:" % n + PAYLOAD_PAD


def number(data: bytes) -> int:
    return int(data.split(b":", 1)[0])


def client(client_id: str) -> paho.Client:
    return paho.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5
    )


class Subscriber:
    def __init__(self, port: int) -> None:
        self.received: set[int] = set()
        self._subscribed = threading.Event()
        self.client = client("disk-full-sub")
        self.client.on_message = lambda c, u, message: self.received.add(number(message.payload))
        self.client.on_subscribe = lambda *args: self._subscribed.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self.client.subscribe(TOPIC, qos=1)
        assert self._subscribed.wait(10), "no SUBACK"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class Publisher:
    """QoS 1 publishes, up to WINDOW in flight; `answers` maps message number -> reason code."""

    def __init__(self, port: int) -> None:
        self.answers: dict[int, int] = {}
        self._mids: dict[int, int] = {}
        self._early: dict[int, int] = {}  # answers that came before `publish` noted the mid
        self._lock = threading.Lock()
        self._acked = threading.Condition(self._lock)
        self.client = client("disk-full-pub")
        self.client.max_inflight_messages_set(WINDOW)
        self.client.max_queued_messages_set(WINDOW)
        self.client.on_publish = self._on_publish
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_publish(self, c: object, u: object, mid: int, reason: object, p: object) -> None:
        code = int(getattr(reason, "value", 0))
        with self._acked:
            n = self._mids.pop(mid, None)
            if n is None:
                self._early[mid] = code
            else:
                self.answers[n] = code
            self._acked.notify_all()

    def publish(self, n: int) -> None:
        with self._acked:
            self._acked.wait_for(lambda: len(self._mids) < WINDOW, timeout=10)
        # Not under our lock: paho's network thread takes its own lock, then ours.
        info = self.client.publish(TOPIC, payload(n), qos=1)
        with self._acked:
            code = self._early.pop(info.mid, None)
            if code is None:
                self._mids[info.mid] = n
            else:
                self.answers[n] = code

    def wait_idle(self, timeout: float) -> None:
        with self._acked:
            self._acked.wait_for(lambda: not self._mids, timeout=timeout)

    def refused(self) -> set[int]:
        with self._lock:
            return {n for n, code in self.answers.items() if code == QUOTA_EXCEEDED}

    def accepted(self) -> set[int]:
        with self._lock:
            return {n for n, code in self.answers.items() if code < 0x80}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def stored_numbers(log_dir: Path) -> list[int]:
    async def read() -> list[int]:
        store = await open_durable_storage(log_dir, StorageSettings())
        try:
            found: list[int] = []
            after = None
            for _ in range(MAX_PUBLISHES):
                page = await store.read(mqtt_to_pulsar(TOPIC), after, 1000)
                if not page:
                    return found
                found += [number(m.payload) for _, m in page]
                after = page[-1][0]
            return found
        finally:
            await store.aclose()

    return trio.run(read)


def test_a_full_disk_refuses_publishes_that_are_then_neither_delivered_nor_stored(
    small_fs: Path,
) -> None:
    node = NodeProcess(small_fs / "data", MOP_STORAGE__SEGMENT_BYTES=str(4 << 20))
    try:
        port = node.start()
        free = os.statvfs(small_fs)
        filler = small_fs / "filler"
        with filler.open("wb") as file:
            os.posix_fallocate(file.fileno(), 0, free.f_bavail * free.f_frsize - HEADROOM)
        subscriber = Subscriber(port)
        publisher = Publisher(port)
        deadline = time.monotonic() + PUBLISH_DEADLINE
        n = 0
        while n < MAX_PUBLISHES and time.monotonic() < deadline:
            if n % WINDOW == 0 and len(publisher.refused()) >= WANT_REFUSED:
                break
            publisher.publish(n)
            n += 1
        publisher.wait_idle(10)
        refused = publisher.refused()
        assert len(refused) >= WANT_REFUSED, f"{n} publishes, answers: {publisher.answers}"

        # Space returns: the node accepts publishes again, soon.
        filler.unlink()
        returned = time.monotonic()
        while time.monotonic() - returned < RECOVERY_DEADLINE:
            publisher.publish(n)
            publisher.wait_idle(5)
            n += 1
            if publisher.answers.get(n - 1) == 0:
                break
            time.sleep(0.05)
        assert publisher.answers.get(n - 1) == 0, "no publish accepted after space returned"
        time.sleep(SETTLE)
        assert len(publisher.answers) == n, "publishes without an answer"
        refused = publisher.refused()  # with those refused while space came back
        accepted = publisher.accepted()
        received = set(subscriber.received)
        publisher.close()
        subscriber.close()

        assert not refused & received, f"delivered though refused: {sorted(refused & received)}"
        assert accepted <= received, f"acknowledged, not delivered: {sorted(accepted - received)}"
        node.log()  # reads what is waiting
        warnings = [line for line in node.run_output if "WARNING" in line]
        print(f"{n} publishes: {len(accepted)} accepted, {len(refused)} refused (0x97), ", end="")
        print(f"{len(received)} delivered, {len(warnings)} warning lines")
        assert len(warnings) <= MAX_WARNINGS, "".join(warnings)

        node.kill()
        stored = stored_numbers(small_fs / "data" / "broker")
        assert not refused & set(stored), f"stored though refused: {sorted(refused & set(stored))}"
        assert accepted <= set(stored), f"acknowledged, lost: {sorted(accepted - set(stored))}"
        node.start()
        assert int(node.recovery()["messages"]) >= len(accepted)
        assert node.stop() == 0
    finally:
        node.close()
