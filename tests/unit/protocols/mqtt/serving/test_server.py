"""The MQTT server driven over in-memory streams (no sockets): sessions, flow control, takeover."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from mop.backends.local import open_local_backend
from mop.broker.storage.memory import MemoryStorage
from mop.processor import MessagingProcessor
from mop.protocols.mqtt.codec import NeedData, PacketDecoder, encode
from mop.protocols.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.serving.handler import ClientHandler
from mop.protocols.mqtt.serving.server import MqttServer
from mop.settings import MqttSettings, Settings
from mop.transport import ConnectionInfo

INFO = ConnectionInfo(transport="tcp", local=("127.0.0.1", 1883), peer=("127.0.0.1", 5000))


class Peer:
    """The client end of an in-memory connection, speaking through mop's codec."""

    def __init__(self, stream: trio.abc.Stream, level: int = 5) -> None:
        self.stream = stream
        self.level = level
        self.decoder = PacketDecoder(protocol_level=level)

    async def send(self, packet: Packet) -> None:
        await self.stream.send_all(encode(packet, self.level))

    async def recv(self) -> Packet | None:
        with trio.fail_after(5):
            while True:
                packet = self.decoder.next_packet()
                if not isinstance(packet, NeedData):
                    return packet
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.decoder.feed(data)


@asynccontextmanager
async def mqtt_server(**mqtt: object) -> AsyncIterator[tuple[MqttServer, trio.Nursery]]:
    settings = Settings(protocols=("mqtt",), mqtt=MqttSettings(sys_interval=0, **mqtt))  # type: ignore[arg-type]
    async with open_local_backend(MemoryStorage()) as backend, trio.open_nursery() as nursery:
        server = MqttServer(settings, MessagingProcessor(backend))
        await nursery.start(server.serve)
        yield server, nursery
        nursery.cancel_scope.cancel()


async def connect(
    server: MqttServer, nursery: trio.Nursery, client_id: str, **fields: object
) -> tuple[Peer, Connack]:
    client_end, server_end = trio.testing.memory_stream_pair()

    async def serve() -> None:
        # Like the transport: the stream closes once the handler returns.
        async with server_end:
            await ClientHandler(server, server_end, INFO).run()

    nursery.start_soon(serve)
    peer = Peer(client_end)
    await peer.send(Connect(client_id, protocol_level=5, **fields))  # type: ignore[arg-type]
    connack = await peer.recv()
    assert isinstance(connack, Connack)
    return peer, connack


async def test_publish_and_receive_over_memory_streams() -> None:
    async with mqtt_server() as (server, nursery):
        sub, _ = await connect(server, nursery, "sub")
        await sub.send(Subscribe(1, (SubscriptionRequest("a/#", 1),)))
        assert await sub.recv() == Suback(1, (1,))
        pub, _ = await connect(server, nursery, "pub")
        await pub.send(Publish("a/b", b"hi", 1, packet_id=7))
        assert await pub.recv() == Puback(7)
        msg = await sub.recv()
        assert isinstance(msg, Publish) and (msg.topic, msg.payload, msg.qos) == ("a/b", b"hi", 1)


async def test_receive_maximum_limits_unacknowledged_deliveries() -> None:
    async with mqtt_server() as (server, nursery):
        sub, _ = await connect(server, nursery, "sub", properties=Properties(receive_maximum=2))
        await sub.send(Subscribe(1, (SubscriptionRequest("t", 1),)))
        await sub.recv()
        pub, _ = await connect(server, nursery, "pub")
        for i in range(5):
            await pub.send(Publish("t", str(i).encode(), 1, packet_id=i + 1))
            await pub.recv()
        first = [await sub.recv() for _ in range(2)]
        with trio.move_on_after(0.2) as idle:
            await sub.recv()
        assert idle.cancelled_caught, "a third message arrived before any acknowledgement"
        assert all(isinstance(p, Publish) for p in first)
        await sub.send(Puback(first[0].packet_id))  # type: ignore[union-attr]
        third = await sub.recv()
        assert isinstance(third, Publish) and third.payload == b"2"


async def test_takeover_disconnects_the_old_connection_with_0x8e() -> None:
    async with mqtt_server() as (server, nursery):
        old, _ = await connect(server, nursery, "same")
        _new, connack = await connect(server, nursery, "same")
        assert connack.reason_code == 0
        assert await old.recv() == Disconnect(ReasonCode.SESSION_TAKEN_OVER)
        assert await old.recv() is None


async def test_session_present_only_when_state_exists() -> None:
    async with mqtt_server() as (server, nursery):
        props = Properties(session_expiry_interval=60)
        first, connack = await connect(server, nursery, "p", clean_start=False, properties=props)
        assert not connack.session_present
        await first.send(Disconnect())
        assert await first.recv() is None
        _, connack = await connect(server, nursery, "p", clean_start=False, properties=props)
        assert connack.session_present
