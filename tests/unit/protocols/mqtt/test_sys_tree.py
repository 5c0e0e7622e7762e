"""The `$SYS` tree as pure functions: mosquitto's load averages on a fake clock, the topics and
their payloads, and the EMQX-style client events."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.sys_tree import (
    CONNECTION_CLOSED,
    COUNTER_TOPICS,
    LOAD_TOPICS,
    ClientConnected,
    ClientDisconnected,
    LoadAverage,
    SysCounters,
    SysTree,
    disconnect_reason,
    event_payload,
    event_topic,
    topic_level,
)

IDLE = SysCounters(**{field.name: 0 for field in dataclasses.fields(SysCounters)})


def test_one_step_moves_each_average_by_its_window() -> None:
    load = LoadAverage(count=1000, now=0.0)
    # 60 more in 60 seconds: a rate of 60 a minute, of which each average takes 1 - e^(-60/W).
    one, five, fifteen = load.update(1060, 60.0)
    assert one == pytest.approx(60 * (1 - math.exp(-1)))
    assert five == pytest.approx(60 * (1 - math.exp(-60 / 300)))
    assert fifteen == pytest.approx(60 * (1 - math.exp(-60 / 900)))


def test_a_steady_rate_brings_every_average_to_it_and_an_idle_counter_lets_them_decay() -> None:
    now, count = 0.0, 0
    load = LoadAverage(count, now)
    for _ in range(6 * 60 * 2):  # two hours of updates every 10 s, 2 a second
        now += 10
        count += 20
        averages = load.update(count, now)
    assert averages == pytest.approx((120.0, 120.0, 120.0), rel=1e-3)
    for _ in range(6 * 5):  # five idle minutes: each average falls by e^(-300 s / window)
        now += 10
        decayed = load.update(count, now)
    assert decayed == pytest.approx(
        tuple(a * math.exp(-300 / w) for a, w in zip(averages, (60, 300, 900), strict=True))
    )
    assert decayed[0] < decayed[1] < decayed[2]


def test_the_rate_does_not_depend_on_the_update_interval() -> None:
    coarse, fine = LoadAverage(0, 0.0), LoadAverage(0, 0.0)
    for step in range(1, 61):
        fine.update(step * 5, step * 1.0)
    coarse.update(300, 60.0)
    # The same 5 a second: the averages differ only by how the steps compound.
    assert coarse.averages[0] == pytest.approx(fine.averages[0], rel=0.05)


def test_no_time_passed_changes_nothing() -> None:
    load = LoadAverage(0, 5.0)
    before = load.update(10, 15.0)
    assert load.update(99, 15.0) == before
    assert load.update(99, 14.0) == before


def test_a_counter_going_back_counts_as_no_traffic() -> None:
    load = LoadAverage(100, 0.0)
    assert load.update(50, 60.0) == (0.0, 0.0, 0.0)


def test_values_have_mosquittos_topics() -> None:
    values = SysTree("mop 1.0").values(IDLE, now=0.0)
    assert values["$SYS/broker/version"] == "mop 1.0"
    assert values["$SYS/broker/uptime"] == "0 seconds"
    for topic, _ in COUNTER_TOPICS:
        assert values[f"$SYS/broker/{topic}"] == "0"
    for prefix, _ in LOAD_TOPICS:
        for window in ("1min", "5min", "15min"):
            assert values[f"$SYS/broker/load/{prefix}/{window}"] == "0.00"
    assert len(values) == 2 + len(COUNTER_TOPICS) + 3 * len(LOAD_TOPICS)
    for name in (
        "clients/total",
        "clients/maximum",
        "heap/current",
        "heap/maximum",
        "messages/stored",
        "retained messages/count",
        "store/messages/count",
        "store/messages/bytes",
        "subscriptions/count",
        "publish/bytes/received",
        "publish/messages/dropped",
    ):
        assert f"$SYS/broker/{name}" in values, name


def test_values_follow_the_counters_and_the_loads_advance_between_calls() -> None:
    tree = SysTree("mop")
    tree.values(IDLE, now=100.0)
    busy = dataclasses.replace(
        IDLE,
        uptime=61.9,
        clients_connected=3,
        clients_disconnected=2,
        messages_received=600,
        connections=3,
        subscriptions=7,
        heap_current=1 << 20,
    )
    values = tree.values(busy, now=160.0)
    assert values["$SYS/broker/uptime"] == "61 seconds"
    assert values["$SYS/broker/clients/connected"] == "3"
    assert values["$SYS/broker/clients/total"] == "5"
    assert values["$SYS/broker/subscriptions/count"] == "7"
    assert values["$SYS/broker/heap/current"] == str(1 << 20)
    assert values["$SYS/broker/publish/messages/received"] == "600"
    # 600 in a minute: the 1 minute average takes 1 - 1/e of the rate.
    expected = f"{600 * (1 - math.exp(-1)):.2f}"
    assert values["$SYS/broker/load/messages/received/1min"] == expected
    assert values["$SYS/broker/load/publish/received/1min"] == expected
    assert values["$SYS/broker/load/connections/1min"] == f"{3 * (1 - math.exp(-1)):.2f}"
    assert values["$SYS/broker/load/messages/sent/1min"] == "0.00"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (None, CONNECTION_CLOSED),
        (ReasonCode.KEEP_ALIVE_TIMEOUT, "keep_alive_timeout"),
        (ReasonCode.SESSION_TAKEN_OVER, "session_taken_over"),
        (ReasonCode.ADMINISTRATIVE_ACTION, "administrative_action"),
        (0xFE, "0xfe"),
    ],
)
def test_disconnect_reasons(code: int | None, reason: str) -> None:
    assert disconnect_reason(code) == reason


def test_a_client_id_is_one_topic_level() -> None:
    assert topic_level("sensor-1") == "sensor-1"
    assert topic_level("a/b+c#d%e") == "a%2Fb%2Bc%23d%25e"


CONNECTED = ClientConnected(
    client_id="dev/1",
    username="alice",
    address="10.0.0.7",
    port=1883,
    protocol_level=5,
    keep_alive=30,
    clean_start=False,
    expiry_interval=3600,
    at_ms=1_700_000_000_123,
)


def test_event_topics_are_emqxs() -> None:
    assert event_topic("mop@h1", CONNECTED) == "$SYS/brokers/mop@h1/clients/dev%2F1/connected"
    gone = ClientDisconnected("c", None, "::1", 8883, 4, "normal", 1)
    assert event_topic("n", gone) == "$SYS/brokers/n/clients/c/disconnected"


def test_event_payloads_are_json_with_emqxs_fields() -> None:
    assert json.loads(event_payload(CONNECTED)) == {
        "clientid": "dev/1",
        "username": "alice",
        "ipaddress": "10.0.0.7",
        "sockport": 1883,
        "proto_name": "MQTT",
        "proto_ver": 5,
        "keepalive": 30,
        "clean_start": False,
        "expiry_interval": 3600,
        "connected_at": 1_700_000_000_123,
        "ts": 1_700_000_000_123,
    }
    gone = ClientDisconnected("c", None, "::1", 8883, 3, "keep_alive_timeout", 42)
    assert json.loads(event_payload(gone)) == {
        "clientid": "c",
        "username": None,
        "ipaddress": "::1",
        "sockport": 8883,
        "proto_name": "MQIsdp",
        "proto_ver": 3,
        "reason": "keep_alive_timeout",
        "disconnected_at": 42,
        "ts": 42,
    }
