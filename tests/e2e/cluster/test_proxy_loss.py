"""What a proxy tier owes its clients when a proxy goes, and what it leaves on the brokers: a
proxy killed (SIGKILL) in the middle of a QoS 1 / QoS 2 stream loses nothing its publisher was
told was stored (and QoS 2 delivers each message once); a thousand clients that connect and
leave leave nothing behind on the brokers (no topic, no presence entry)."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from mop.backends.cluster.admin import get_topics
from mop.backends.cluster.leases import CLEAN_UP_DELAY, PRESENCE_TABLE
from mop.protocols.mqtt.packets import Connect, Puback, Pubcomp, Publish, Pubrec, Pubrel
from mop.testing.cluster import open_cluster_backend
from tests.e2e.clients import Client
from tests.e2e.nodeproc import NodeProcess
from tests.e2e.raw import RawClient

MESSAGES = 500
KILL_AFTER = 100  # acknowledged messages before the first proxy is killed
KILL_AFTER_SECONDS = 0.3  # or at this moment of the stream, whatever is in flight
CLIENTS = 1000


@pytest.mark.parametrize(
    ("qos", "in_flight"),
    [(1, False), (2, False), (1, True), (2, True)],
    ids=["qos1-between", "qos2-between", "qos1-in-flight", "qos2-in-flight"],
)
def test_a_proxy_killed_mid_stream_loses_no_acknowledged_message(
    proxy_processes: list[NodeProcess], prefix: str, qos: int, in_flight: bool
) -> None:
    """Killed between two messages (each acknowledged, nothing in flight) or at any moment
    of the stream (a message in flight, from a timer)."""
    first, second = proxy_processes
    topic = f"{prefix}/stream"
    sub = Client(second.port, f"{prefix}-sub", version=4, clean=False)
    assert sub.subscribe(topic, qos=qos) == [qos]
    publisher = Publisher(first.port, f"{prefix}-pub", qos)
    killer = threading.Timer(KILL_AFTER_SECONDS, first.kill)
    if in_flight:
        killer.start()
    acknowledged: list[int] = []
    try:
        for index in range(MESSAGES):
            if index == KILL_AFTER and not in_flight:
                first.kill()
            acknowledged.append(publisher.publish(topic, index, fallback=second.port))
    finally:
        killer.cancel()
        if in_flight:
            killer.join()
    assert publisher.reconnected, "the proxy was killed after the stream ended: nothing tested"
    got: list[int] = []
    deadline = time.monotonic() + 30
    while len(set(got)) < MESSAGES and time.monotonic() < deadline:
        got.extend(int(m.payload) for m in sub.expect(1, timeout=30))
    assert set(got) == set(acknowledged) == set(range(MESSAGES))
    if qos == 2 and not in_flight:
        sub.expect_none(wait=1.0)  # a duplicate would come now
        assert sorted(got) == list(range(MESSAGES)), "QoS 2 delivered a message twice"
    sub.disconnect()


class Publisher:
    """A persistent-session publisher that waits for each message's acknowledgement and,
    when its proxy goes, connects through another one and finishes what was in flight (the
    same packet id, DUP set; or the PUBREL of a QoS 2 message whose PUBREC came)."""

    def __init__(self, port: int, client_id: str, qos: int) -> None:
        self.client_id = client_id
        self.qos = qos
        self.reconnected = False
        self.raw = self._connect(port)

    def _connect(self, port: int) -> RawClient:
        raw = RawClient(port, level=4)
        raw.send(Connect(self.client_id, protocol_level=4, clean_start=False, keep_alive=30))
        connack = raw.recv()
        assert connack is not None and connack.reason_code == 0, connack  # type: ignore[union-attr]
        return raw

    def publish(self, topic: str, index: int, *, fallback: int) -> int:
        packet_id = index % 60000 + 1
        publish = Publish(topic, str(index).encode(), qos=self.qos, packet_id=packet_id)
        step: Publish | Pubrel = publish
        for _attempt in range(3):
            try:
                self.raw.send(step)
                answer = self.raw.recv(timeout=10)
                if answer is None:
                    raise ConnectionResetError("the proxy closed the connection")
            except (OSError, AssertionError):
                self.raw.close()
                self.raw = self._connect(fallback)
                self.reconnected = True
                if isinstance(step, Publish):
                    step = Publish(
                        topic, publish.payload, qos=self.qos, packet_id=packet_id, dup=True
                    )
                continue
            if isinstance(answer, Puback | Pubcomp) and answer.packet_id == packet_id:
                return index
            if isinstance(answer, Pubrec) and answer.packet_id == packet_id:
                step = Pubrel(packet_id)
                try:
                    self.raw.send(step)
                    done = self.raw.recv(timeout=10)
                except (OSError, AssertionError):
                    done = None
                if isinstance(done, Pubcomp) and done.packet_id == packet_id:
                    return index
                self.raw.close()
                self.raw = self._connect(fallback)
                self.reconnected = True
                continue
            raise AssertionError(f"unexpected answer to message {index}: {answer}")
        raise AssertionError(f"message {index} was never acknowledged")


def test_a_thousand_clients_that_come_and_go_leave_nothing_on_the_brokers(
    broker: NodeProcess, proxy_processes: list[NodeProcess], prefix: str
) -> None:
    before = trio.run(namespace_topics, broker.service_url)
    port = proxy_processes[0].port
    failures: list[str] = []

    def come_and_go(first: int) -> None:
        for index in range(first, CLIENTS, 10):
            try:
                raw = RawClient(port, level=4)
                connack = raw.connect(f"{prefix}-{index}")
                if connack.reason_code != 0:
                    failures.append(f"{index}: {connack}")
                raw.close()
            except (OSError, AssertionError) as exc:
                failures.append(f"{index}: {exc}")

    workers = [threading.Thread(target=come_and_go, args=(first,)) for first in range(10)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert not worker.is_alive()
    assert not failures, failures[:5]
    # No topic of their own, and their presence entries deleted once let go of.
    assert trio.run(namespace_topics, broker.service_url) == before
    time.sleep(CLEAN_UP_DELAY + 1)
    left = trio.run(presence_keys, broker.service_url, prefix)
    assert left == [], f"{len(left)} client ids left in the presence table: {left[:5]}"


async def namespace_topics(service_url: str) -> set[str]:
    """Every topic of the default namespace and of mop's system namespace."""
    found: set[str] = set()
    for namespace in ("public/default", "public/__mop"):
        found.update(await get_topics(service_url, namespace, seconds=20))
    return found


async def presence_keys(service_url: str, prefix: str) -> list[str]:
    """The client ids under `prefix` that the presence table still holds."""
    with trio.fail_after(30):
        async with open_cluster_backend(service_url) as backend:
            table = backend.table(PRESENCE_TABLE)
            await table.catch_up()
            return [key for key, _ in table.items() if key.startswith(prefix)]
