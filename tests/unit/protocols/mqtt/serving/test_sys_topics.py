"""What `$SYS` counts on a server driven over in-memory streams, and the client events it
publishes with `mqtt.sys_events` (EMQX's topics, why each connection ended)."""

from __future__ import annotations

import json

import trio
import trio.testing

from mop.protocols.mqtt.packets import (
    Disconnect,
    Properties,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from mop.protocols.mqtt.reason_codes import ReasonCode
from tests.unit.protocols.mqtt.serving.test_server import Peer, connect, mqtt_server

EVENTS = "$SYS/brokers/+/clients/+/+"


async def next_event(peer: Peer) -> tuple[str, dict[str, object]]:
    """The next event about a client other than "watch" (whose own connection may be told
    after it subscribed)."""
    while True:
        packet = await peer.recv()
        assert isinstance(packet, Publish), packet
        assert not packet.retain
        assert packet.properties.content_type == "application/json"
        event = json.loads(packet.payload)
        if event["clientid"] != "watch":
            return packet.topic, event


async def test_counters_follow_clients_subscriptions_and_messages() -> None:
    async with mqtt_server() as (server, nursery):
        peers = [(await connect(server, nursery, f"c{i}"))[0] for i in range(3)]
        await peers[0].send(
            Subscribe(1, (SubscriptionRequest("a/#", 1), SubscriptionRequest("b", 0)))
        )
        assert await peers[0].recv() == Suback(1, (1, 0))
        await peers[1].send(Publish("a/x", b"12345", 0))
        await peers[1].send(Publish("r", b"kept", 0, retain=True))
        assert isinstance(await peers[0].recv(), Publish)
        await peers[2].send(Disconnect())
        assert await peers[2].recv() is None
        await trio.testing.wait_all_tasks_blocked()
        counters = server.sys.counters()
        assert counters.clients_connected == 2
        assert counters.clients_maximum == 3
        assert counters.connections == 3
        assert counters.subscriptions == 2
        assert counters.messages_received == 2
        assert counters.payload_bytes_received == len(b"12345") + len(b"kept")
        assert counters.messages_sent == 1
        assert counters.payload_bytes_sent == len(b"12345")
        assert counters.bytes_sent > counters.payload_bytes_sent
        assert (counters.retained_count, counters.stored_count) == (1, 1)
        assert counters.stored_bytes == len(b"kept")
        assert counters.heap_current > 0
        assert counters.heap_maximum >= counters.heap_current


async def test_the_nodes_own_sys_values_are_not_counted_as_retained_messages() -> None:
    async with mqtt_server() as (server, nursery):
        await server.sys.publish_changed()  # what each `$SYS` interval does
        assert server.retained.get("$SYS/broker/version") is not None
        counters = server.sys.counters()
        assert (counters.retained_count, counters.stored_count, counters.stored_bytes) == (0, 0, 0)
        assert server.sys.values()["$SYS/broker/retained messages/count"] == "0"
        peer, _ = await connect(server, nursery, "keeper")
        await peer.send(Publish("r", b"kept", 0, retain=True))
        await trio.testing.wait_all_tasks_blocked()
        counters = server.sys.counters()
        assert (counters.retained_count, counters.stored_count) == (1, 1)
        assert counters.stored_bytes == len(b"kept")


async def test_offline_persistent_sessions_count_as_disconnected_clients() -> None:
    async with mqtt_server() as (server, nursery):
        props = Properties(session_expiry_interval=60)
        peer, _ = await connect(server, nursery, "away", clean_start=False, properties=props)
        await peer.send(Subscribe(1, (SubscriptionRequest("x", 1),)))
        await peer.recv()
        await peer.send(Disconnect())
        assert await peer.recv() is None
        await trio.testing.wait_all_tasks_blocked()
        counters = server.sys.counters()
        assert (counters.clients_connected, counters.clients_disconnected) == (0, 1)
        assert counters.clients_total == 1
        assert counters.subscriptions == 1  # an offline session keeps its subscriptions


async def test_events_say_who_connected_and_why_each_connection_ended() -> None:
    async with mqtt_server(sys_events=True, sys_node_name="n1") as (server, nursery):
        watch, _ = await connect(server, nursery, "watch")
        await watch.send(Subscribe(1, (SubscriptionRequest(EVENTS, 0),)))
        assert await watch.recv() == Suback(1, (0,))
        polite, _ = await connect(server, nursery, "dev/1", keep_alive=30, username="ann")
        topic, connected = await next_event(watch)
        assert topic == "$SYS/brokers/n1/clients/dev%2F1/connected"
        assert connected["clientid"] == "dev/1"
        assert connected["username"] == "ann"
        assert (connected["keepalive"], connected["clean_start"], connected["proto_ver"]) == (
            30,
            True,
            5,
        )
        assert connected["ipaddress"] == "127.0.0.1"
        await polite.send(Disconnect())
        topic, gone = await next_event(watch)
        assert topic == "$SYS/brokers/n1/clients/dev%2F1/disconnected"
        assert gone["reason"] == "normal"
        assert isinstance(gone["disconnected_at"], int)

        abrupt, _ = await connect(server, nursery, "abrupt")
        assert (await next_event(watch))[0].endswith("/abrupt/connected")
        await abrupt.stream.aclose()
        topic, gone = await next_event(watch)
        assert (topic.rpartition("/")[2], gone["reason"]) == ("disconnected", "closed")

        await connect(server, nursery, "twice")
        await next_event(watch)
        await connect(server, nursery, "twice")  # takes the id over
        reasons = {}
        for _ in range(2):
            topic, event = await next_event(watch)
            reasons[topic.rpartition("/")[2]] = event.get("reason")
        assert reasons == {
            "connected": None,
            "disconnected": ReasonCode.SESSION_TAKEN_OVER.name.lower(),
        }


async def test_no_events_unless_turned_on() -> None:
    async with mqtt_server() as (server, nursery):
        watch, _ = await connect(server, nursery, "watch")
        await watch.send(Subscribe(1, (SubscriptionRequest(EVENTS, 0),)))
        await watch.recv()
        other, _ = await connect(server, nursery, "other")
        await other.send(Disconnect())
        with trio.move_on_after(0.3) as quiet:
            await watch.recv()
        assert quiet.cancelled_caught
