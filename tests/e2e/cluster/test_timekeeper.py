"""The timers of offline MQTT sessions in a separated deployment: one proxy process runs them
(the holder of a cluster-wide role), whatever the others do. Two real proxy processes in front
of a mop broker process; wills are counted by a Pulsar consumer on the broker, which no proxy
restart interrupts."""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest
from paho.mqtt.packettypes import PacketTypes

from mop.topic_names import mqtt_to_pulsar
from tests.e2e.clients import Client, props
from tests.e2e.cluster.support import proxy_process
from tests.e2e.nodeproc import NodeProcess, broker_process

GAINED = re.compile(r"session timers run on this node")
LOST = re.compile(r"session timers no longer run on this node")
# How long a proxy may take to get the role once it is free (it asks at once; the broker
# grants it when the previous holder's connection closes).
HANDOVER = 10.0
# A bounded watch for a will that must not come again (or at all).
QUIET = 3.0
# How long a proxy may be silent before the holder takes it for dead (mqtt.node_timeout).
NODE_TIMEOUT = 2.0


class Deployment:
    """Two proxy processes in a namespace of their own on the module's broker."""

    def __init__(self, broker: NodeProcess, root: Path) -> None:
        self.broker = broker
        self.namespace = f"tk-{uuid.uuid4().hex[:10]}"
        self.proxies = [
            proxy_process(
                root / name,
                broker.service_url,
                MOP_CLUSTER__OPERATION_TIMEOUT="5",
                MOP_DEFAULT_NAMESPACE=self.namespace,
                MOP_MQTT__NODE_TIMEOUT=str(NODE_TIMEOUT),
            )
            for name in ("a", "b")
        ]
        self.pulsar = pulsar.Client(
            broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
        )

    def start_all(self) -> None:
        """Start every proxy at the same moment (each in a thread of its own)."""
        errors: list[BaseException] = []

        def start(proxy: NodeProcess) -> None:
            try:
                proxy.start()
            except BaseException as exc:  # reported by the caller
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(p,)) for p in self.proxies]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def stop_all(self) -> None:
        """Stop every proxy at the same moment (SIGTERM); each must exit with status 0."""
        codes: dict[int, int] = {}

        def stop(index: int) -> None:
            codes[index] = self.proxies[index].stop()

        threads = [threading.Thread(target=stop, args=(i,)) for i in range(len(self.proxies))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for index, proxy in enumerate(self.proxies):
            assert codes.get(index) == 0, proxy.log()

    def holder(self, timeout: float = HANDOVER) -> NodeProcess:
        """The one running proxy that runs the session timers now (fails if none or two)."""
        deadline = time.monotonic() + timeout
        while True:
            holders = [p for p in self.proxies if p.running and _holds(p)]
            if len(holders) == 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(holders) == 1, f"{len(holders)} proxies run the session timers"
        return holders[0]

    def other(self, proxy: NodeProcess) -> NodeProcess:
        [other] = [p for p in self.proxies if p is not proxy]
        return other

    def watch(self, mqtt_topic: str) -> pulsar.Consumer:
        topic = mqtt_to_pulsar(mqtt_topic, namespace=self.namespace)
        return self.pulsar.subscribe(topic, "watch", consumer_type=pulsar.ConsumerType.Exclusive)

    def close(self) -> None:
        self.pulsar.close()
        for proxy in self.proxies:
            proxy.close()


def _holds(proxy: NodeProcess) -> bool:
    return len(proxy.find(GAINED)) > len(proxy.find(LOST))


def count(consumer: pulsar.Consumer, seconds: float) -> list[bytes]:
    """Every message that comes within `seconds`."""
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            message = consumer.receive(timeout_millis=max(1, int(remaining * 1000)))
        except pulsar.Timeout:
            break
        got.append(message.data())
        consumer.acknowledge(message)
    return got


def first(consumer: pulsar.Consumer, seconds: float) -> tuple[bytes, float]:
    """The first message that comes within `seconds`, and when (time.monotonic)."""
    message = consumer.receive(timeout_millis=int(seconds * 1000))
    consumer.acknowledge(message)
    return message.data(), time.monotonic()


def will_client(
    proxy: NodeProcess, client_id: str, topic: str, *, delay: int, expiry: int
) -> Client:
    return Client(
        proxy.port,
        client_id,
        clean=False,
        will=(topic, b"gone", 1, False),
        will_properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=delay),
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=expiry),
    )


@pytest.fixture
def deployment(broker: NodeProcess, tmp_path: Path) -> Iterator[Deployment]:
    running = Deployment(broker, tmp_path)
    try:
        running.start_all()
        yield running
    finally:
        running.close()


def test_a_delayed_will_is_published_once_when_both_proxies_restart_together(
    deployment: Deployment,
) -> None:
    delay = 8
    watch = deployment.watch("tk/will")
    client = will_client(deployment.proxies[0], "tk-restart", "tk/will", delay=delay, expiry=60)
    client.drop()
    dropped = time.monotonic()
    time.sleep(0.5)  # the session is written offline before the proxies stop
    deployment.stop_all()
    deployment.start_all()
    restarted = time.monotonic()
    assert restarted - dropped < delay - 1, "the restart took too long to test anything"
    deployment.holder()
    wills = count(watch, dropped + delay + 5 - time.monotonic())
    assert wills == [b"gone"], f"{len(wills)} wills"


def test_when_the_holder_is_killed_another_proxy_publishes_the_will_and_ends_the_session(
    deployment: Deployment,
) -> None:
    delay, expiry = 3, 6
    holder = deployment.holder()
    survivor = deployment.other(holder)
    watch = deployment.watch("tk/will")
    # Connected through the holder, so the session's timers start there.
    client = will_client(holder, "tk-killed", "tk/will", delay=delay, expiry=expiry)
    client.drop()
    dropped = time.monotonic()
    time.sleep(0.5)  # the session is written offline before the holder dies
    holder.kill()
    assert deployment.holder() is survivor
    payload, at = first(watch, delay + HANDOVER)
    assert payload == b"gone"
    assert at - dropped >= delay - 0.5, "the will came before its delay"
    assert count(watch, QUIET) == [], "the will came twice"
    time.sleep(max(0.0, dropped + expiry + 2 - time.monotonic()))
    back = Client(
        survivor.port,
        "tk-killed",
        clean=False,
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=60),
    )
    assert back.connack is not None and not back.connack.session_present, "not expired"


def test_a_reconnect_through_the_other_proxy_cancels_the_will(deployment: Deployment) -> None:
    delay = 3
    holder = deployment.holder()
    other = deployment.other(holder)
    watch = deployment.watch("tk/will")
    client = will_client(holder, "tk-back", "tk/will", delay=delay, expiry=60)
    client.drop()
    time.sleep(0.5)
    # Back through the other proxy, resuming the session but keeping none after this
    # connection (session expiry 0): nothing else tells the holder the client is back.
    back = Client(other.port, "tk-back", clean=False)
    assert back.connack is not None and back.connack.session_present
    assert count(watch, delay + QUIET) == [], "the will was published after the reconnect"
    back.disconnect()


def test_a_holder_cut_off_from_its_broker_stops_and_one_proxy_carries_on(
    tmp_path: Path,
) -> None:
    broker = broker_process(tmp_path / "broker")
    port = broker.start()
    deployment = Deployment(broker, tmp_path)
    try:
        deployment.start_all()
        holder = deployment.holder()
        watch = deployment.watch("tk/will")
        delay = 8
        client = will_client(holder, "tk-cut", "tk/will", delay=delay, expiry=60)
        client.drop()
        dropped = time.monotonic()
        time.sleep(0.5)
        broker.kill()
        holder.wait_for(LOST, timeout=5)
        broker.start(MOP_PULSAR__PORT=str(port))
        deployment.holder(timeout=2 * HANDOVER)
        assert time.monotonic() - dropped < delay - 1, "the restart took too long to test anything"
        wills = count(watch, dropped + delay + 6 - time.monotonic())
        assert wills == [b"gone"], f"{len(wills)} wills"
    finally:
        deployment.close()
        broker.close()


@pytest.mark.parametrize("dying", ["holder", "other"])
def test_when_a_proxy_dies_its_clients_wills_go_out_and_their_sessions_expire(
    deployment: Deployment, dying: str
) -> None:
    holder = deployment.holder()
    proxy = holder if dying == "holder" else deployment.other(holder)
    survivor = deployment.other(proxy)
    watch = deployment.watch("tk/dead")
    # Connected when their proxy dies: one without a session after the connection (MQTT
    # 3.1.1, clean), one with a session that expires 3 s after it and a will delayed by 1 s.
    clean = Client(
        proxy.port, "tk-dead-clean", version=4, clean=True, will=("tk/dead", b"clean", 1, False)
    )
    kept = Client(
        proxy.port,
        "tk-dead-kept",
        clean=False,
        will=("tk/dead", b"kept", 1, False),
        will_properties=props(PacketTypes.WILLMESSAGE, WillDelayInterval=1),
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=3),
    )
    assert clean.connack is not None and kept.connack is not None
    proxy.kill()
    killed = time.monotonic()
    if dying == "holder":
        assert deployment.holder() is survivor
    one, _ = first(watch, NODE_TIMEOUT + HANDOVER)
    two, at = first(watch, NODE_TIMEOUT + HANDOVER)
    assert sorted([one, two]) == [b"clean", b"kept"]
    print(f"both wills {at - killed:.1f} s after the kill")
    assert count(watch, QUIET) == [], "a will came twice"
    time.sleep(max(0.0, killed + NODE_TIMEOUT + 1 + 3 + 2 - time.monotonic()))
    back = Client(
        survivor.port,
        "tk-dead-kept",
        clean=False,
        connect_properties=props(PacketTypes.CONNECT, SessionExpiryInterval=60),
    )
    assert back.connack is not None and not back.connack.session_present, "not expired"
    back.disconnect()
