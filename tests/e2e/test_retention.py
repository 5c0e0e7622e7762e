"""Disk use bounded by a small retention policy on a broker process: history beyond the policy is
reclaimed (segment files deleted, not only index entries), and the history within it survives
SIGKILL and an orderly restart, read by pulsar-client readers without any subscription."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from tests.e2e.nodeproc import NodeProcess, broker_process, disk_usage, segment_files
from tests.e2e.pulsar_support import TIMEOUT_MS

pytestmark = pytest.mark.e2e

SEGMENT = 64 * 1024
POLICY = 128 * 1024  # bytes each topic keeps
PAYLOAD = 1000
COUNT = 1500  # about 1.5 MB: over ten times the policy
# The kept history, the segment being written, one more that reclaim has not reached yet, and
# the state records (topic, cursors, tables) on top.
BOUND = POLICY + 4 * SEGMENT
TOPIC = "persistent://public/default/retention-disk"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[NodeProcess]:
    process = broker_process(
        tmp_path / "data",
        MOP_STORAGE__SEGMENT_BYTES=str(SEGMENT),
        MOP_RETENTION__TIME_SECONDS="-1",
        MOP_RETENTION__SIZE_BYTES=str(POLICY),
        MOP_STORAGE__UNSUBSCRIBED_GRACE="0",
    )
    yield process
    process.close()


def publish(url: str, first: int, count: int) -> None:
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(TOPIC, batching_enabled=False, block_if_queue_full=True)
        for n in range(first, first + count):
            producer.send_async(n.to_bytes(4, "big") * (PAYLOAD // 4), None)
        producer.flush()
        producer.close()
    finally:
        client.close()


def history(url: str) -> list[int]:
    """The numbers of the messages a reader from the earliest position gets."""
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = client.create_reader(TOPIC, pulsar.MessageId.earliest)
        numbers = []
        while reader.has_message_available():
            numbers.append(int.from_bytes(reader.read_next(timeout_millis=TIMEOUT_MS).data()[:4]))
        reader.close()
        return numbers
    finally:
        client.close()


def wait_for_reclaim(data: Path) -> int:
    deadline = time.monotonic() + 20
    while (used := disk_usage(data)) > BOUND:
        assert time.monotonic() < deadline, f"the log still takes {used} bytes"
        time.sleep(0.2)
    return used


def assert_recent_suffix(numbers: list[int], last: int) -> None:
    """The newest messages, in order and without a gap, within the policy and close to it."""
    assert numbers == list(range(numbers[0], last + 1)), numbers[:5]
    assert len(numbers) * PAYLOAD <= POLICY
    assert len(numbers) * (PAYLOAD + 200) >= POLICY


def test_history_beyond_the_policy_is_reclaimed_and_within_it_survives_crashes(
    broker: NodeProcess,
) -> None:
    data = broker.data_dir / "broker"
    broker.start()
    publish(broker.service_url, 0, COUNT)
    used = wait_for_reclaim(data)
    print(f"{COUNT} x {PAYLOAD} B published; the log takes {used} bytes for a {POLICY} B policy")
    assert len(segment_files(broker.data_dir)) <= 4
    kept = history(broker.service_url)
    assert_recent_suffix(kept, COUNT - 1)

    broker.kill()
    broker.start()
    assert history(broker.service_url) == kept
    # Ids go on after the crash, and the policy still holds.
    publish(broker.service_url, COUNT, 300)
    wait_for_reclaim(data)
    kept = history(broker.service_url)
    assert_recent_suffix(kept, COUNT + 299)

    assert broker.stop() == 0
    broker.start()
    assert history(broker.service_url) == kept
    assert disk_usage(data) <= BOUND
