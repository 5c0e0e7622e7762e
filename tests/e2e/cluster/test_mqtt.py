"""MQTT through separated proxies (`mode = "separated"`) in front of a mop broker process, with
paho clients: the MQTT layer is the one of merged mode, the backend is `ClusterBackend`."""

from __future__ import annotations

import time

import pytest

from mop.testing.cluster import proxy_settings
from mop.testing.node import running_node
from tests.e2e.clients import Client
from tests.e2e.cluster.support import SESSION_TAKEN_OVER
from tests.e2e.nodeproc import NodeProcess, broker_process


def test_publish_subscribe_and_retained_through_a_proxy(broker: NodeProcess, prefix: str) -> None:
    with running_node(proxy_settings(broker.service_url)) as node:
        sub = Client(node.mqtt_port, f"{prefix}-sub")
        assert sub.subscribe(f"{prefix}/#", qos=2) == [2]
        pub = Client(node.mqtt_port, f"{prefix}-pub")
        for qos in (0, 1, 2):
            assert pub.publish(f"{prefix}/q{qos}", f"m{qos}", qos=qos) in (0, 0x10)
        got = sub.expect(3)
        assert sorted((m.topic, m.payload, m.qos) for m in got) == [
            (f"{prefix}/q0", b"m0", 0),
            (f"{prefix}/q1", b"m1", 1),
            (f"{prefix}/q2", b"m2", 2),
        ]
        pub.publish(f"{prefix}/kept", b"retained", qos=1, retain=True)
        sub.expect(1)
        late = Client(node.mqtt_port, f"{prefix}-late")
        late.subscribe(f"{prefix}/+", qos=1)
        (retained,) = late.expect(1)
        assert (retained.topic, retained.payload, retained.retain) == (
            f"{prefix}/kept",
            b"retained",
            True,
        )


def test_publish_through_one_proxy_receive_through_another(
    broker: NodeProcess, prefix: str
) -> None:
    url = broker.service_url
    with running_node(proxy_settings(url)) as a, running_node(proxy_settings(url)) as b:
        sub = Client(b.mqtt_port, f"{prefix}-sub")
        sub.subscribe(f"{prefix}/+/t", qos=1)
        pub = Client(a.mqtt_port, f"{prefix}-pub")
        for index in range(10):
            pub.publish(f"{prefix}/{index}/t", f"{index}", qos=1)
        got = sub.expect(10)
        assert sorted(m.payload for m in got) == sorted(f"{i}".encode() for i in range(10))


def test_takeover_across_proxies(broker: NodeProcess, prefix: str) -> None:
    url = broker.service_url
    with running_node(proxy_settings(url)) as a, running_node(proxy_settings(url)) as b:
        first = Client(a.mqtt_port, f"{prefix}-c")
        second = Client(b.mqtt_port, f"{prefix}-c")
        assert second.connack is not None and second.connack.reason_code == 0
        assert first.disconnects.get(timeout=10) == SESSION_TAKEN_OVER


def test_persistent_session_keeps_messages_while_offline(broker: NodeProcess, prefix: str) -> None:
    with running_node(proxy_settings(broker.service_url)) as node:
        sub = Client(node.mqtt_port, f"{prefix}-sub", version=4, clean=False)
        sub.subscribe(f"{prefix}/#", qos=1)
        sub.disconnect()
        pub = Client(node.mqtt_port, f"{prefix}-pub")
        pub.publish(f"{prefix}/a", b"while away", qos=1)
        back = Client(node.mqtt_port, f"{prefix}-sub", version=4, clean=False)
        assert back.connack is not None and back.connack.session_present
        (message,) = back.expect(1)
        assert message.payload == b"while away"


def test_persistent_session_resumes_through_another_proxy(broker: NodeProcess, prefix: str) -> None:
    url = broker.service_url
    with running_node(proxy_settings(url)) as a, running_node(proxy_settings(url)) as b:
        sub = Client(a.mqtt_port, f"{prefix}-sub", version=4, clean=False)
        sub.subscribe(f"{prefix}/#", qos=1)
        sub.disconnect()
        pub = Client(a.mqtt_port, f"{prefix}-pub")
        pub.publish(f"{prefix}/a", b"while away", qos=1)
        back = Client(b.mqtt_port, f"{prefix}-sub", version=4, clean=False)
        assert back.connack is not None and back.connack.session_present
        (message,) = back.expect(1)
        assert message.payload == b"while away"


def test_retained_message_set_through_another_proxy(broker: NodeProcess, prefix: str) -> None:
    url = broker.service_url
    with running_node(proxy_settings(url)) as a, running_node(proxy_settings(url)) as b:
        Client(a.mqtt_port, f"{prefix}-pub").publish(f"{prefix}/r", b"kept", qos=1, retain=True)
        late = Client(b.mqtt_port, f"{prefix}-late")
        late.subscribe(f"{prefix}/r", qos=1)
        (retained,) = late.expect(1, timeout=3)
        assert retained.payload == b"kept"


def test_broker_restart_under_qos1_traffic(tmp_path_factory: pytest.TempPathFactory) -> None:
    broker = broker_process(tmp_path_factory.mktemp("restarted") / "data")
    port = broker.start()
    try:
        with running_node(proxy_settings(broker.service_url)) as node:
            sub = Client(node.mqtt_port, "restart-sub", version=4, clean=False)
            sub.subscribe("restart/+", qos=1)
            pub = Client(node.mqtt_port, "restart-pub")
            for index in range(40):
                if index == 20:
                    broker.kill()
                    broker.start(MOP_PULSAR__PORT=str(port))
                # Waits for PUBACK: a publish pending while the broker was down completes.
                assert pub.publish("restart/a", f"{index}", qos=1) == 0
            got: set[int] = set()
            deadline = time.monotonic() + 30
            while got != set(range(40)) and time.monotonic() < deadline:
                # QoS 1 may deliver twice (what was in flight when the broker went).
                got.update(int(m.payload) for m in sub.expect(1, timeout=30))
            assert got == set(range(40))
    finally:
        broker.close()
