"""The MQTT server's per-read batching and delivery shortcuts, over in-memory streams: what a
client sees is the same as packet by packet (acks in order, nothing acked before it is stored,
refusals answered per message), with one storage sync per read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from mop.backends.local import open_local_backend
from mop.broker.storage.memory import MemoryStorage
from mop.message import Message
from mop.processor import Consumer, MessagingProcessor
from mop.protocols.mqtt.codec import encode
from mop.protocols.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
    Unsuback,
    Unsubscribe,
)
from mop.protocols.mqtt.reason_codes import ReasonCode
from mop.protocols.mqtt.serving.handler import ClientHandler
from mop.protocols.mqtt.serving.outflow import Outflow
from mop.protocols.mqtt.serving.server import MqttServer
from mop.protocols.mqtt.session import SubscriptionOptions
from mop.settings import MqttSettings, Settings

from .test_server import INFO, Peer


@asynccontextmanager
async def mqtt_server(
    storage: MemoryStorage, **mqtt: object
) -> AsyncIterator[tuple[MqttServer, trio.Nursery]]:
    settings = Settings(protocols=("mqtt",), mqtt=MqttSettings(sys_interval=0, **mqtt))  # type: ignore[arg-type]
    async with open_local_backend(storage) as backend, trio.open_nursery() as nursery:
        server = MqttServer(settings, MessagingProcessor(backend))
        await nursery.start(server.serve)
        yield server, nursery
        nursery.cancel_scope.cancel()


async def connect_answer(
    server: MqttServer, nursery: trio.Nursery, client_id: str, level: int = 5, **fields: object
) -> tuple[Peer, Connack]:
    """A client over a memory stream that sent CONNECT, and the server's CONNACK."""
    client_end, server_end = trio.testing.memory_stream_pair()

    async def serve() -> None:
        async with server_end:
            await ClientHandler(server, server_end, INFO).run()

    nursery.start_soon(serve)
    peer = Peer(client_end, level)
    await peer.send(Connect(client_id, protocol_level=level, **fields))  # type: ignore[arg-type]
    connack = await peer.recv()
    assert isinstance(connack, Connack)
    return peer, connack


async def connect(
    server: MqttServer, nursery: trio.Nursery, client_id: str, level: int = 5, **fields: object
) -> Peer:
    peer, connack = await connect_answer(server, nursery, client_id, level, **fields)
    assert connack.reason_code == 0
    return peer


async def send_together(peer: Peer, *publishes: Publish) -> None:
    """Every packet in one write, so the server reads them at once."""
    await peer.stream.send_all(b"".join(encode(p, peer.level) for p in publishes))


def qos1(n: int, payload: bytes | None = None) -> Publish:
    return Publish("t", payload if payload is not None else b"%d" % n, 1, packet_id=n)


async def test_a_read_of_publishes_is_one_sync_and_acks_in_order() -> None:
    storage = MemoryStorage()
    async with mqtt_server(storage) as (server, nursery):
        sub = await connect(server, nursery, "sub")
        await sub.send(Subscribe(1, (SubscriptionRequest("t", 1),)))
        assert await sub.recv() == Suback(1, (1,))
        pub = await connect(server, nursery, "pub")
        syncs = storage.syncs
        await send_together(pub, *(qos1(n) for n in range(1, 11)))
        acks = [await pub.recv() for _ in range(10)]
        assert acks == [Puback(n) for n in range(1, 11)]
        assert storage.syncs == syncs + 1
        got = [await sub.recv() for _ in range(10)]
        expected = [b"%d" % n for n in range(1, 11)]
        assert [p.payload for p in got if isinstance(p, Publish)] == expected


async def test_qos0_and_qos1_of_one_read_keep_their_order() -> None:
    async with mqtt_server(MemoryStorage()) as (server, nursery):
        sub = await connect(server, nursery, "sub")
        await sub.send(Subscribe(1, (SubscriptionRequest("t", 1),)))
        await sub.recv()
        pub = await connect(server, nursery, "pub")
        await send_together(
            pub, Publish("t", b"a"), qos1(1, b"b"), Publish("t", b"c"), qos1(2, b"d")
        )
        assert [await pub.recv() for _ in range(2)] == [Puback(1), Puback(2)]
        got = [await sub.recv() for _ in range(4)]
        assert [p.payload for p in got if isinstance(p, Publish)] == [b"a", b"b", b"c", b"d"]


async def test_a_batch_beyond_receive_maximum_is_answered_not_refused() -> None:
    async with mqtt_server(MemoryStorage(), max_inflight=2) as (server, nursery):
        pub = await connect(server, nursery, "pub")
        await send_together(pub, *(qos1(n) for n in range(1, 6)), Pingreq())  # type: ignore[arg-type]
        answers = [await pub.recv() for _ in range(6)]
        no_subscribers = ReasonCode.NO_MATCHING_SUBSCRIBERS
        assert answers == [Puback(n, no_subscribers) for n in range(1, 6)] + [Pingresp()]


async def test_a_refused_publish_is_answered_with_its_reason_in_order() -> None:
    # 12 bytes of storage: the 20-byte message in the middle does not fit.
    async with mqtt_server(MemoryStorage(max_bytes=12)) as (server, nursery):
        sub = await connect(server, nursery, "sub")
        await sub.send(Subscribe(1, (SubscriptionRequest("t", 1),)))
        await sub.recv()
        pub = await connect(server, nursery, "pub")
        await send_together(pub, qos1(1), qos1(2, payload=b"x" * 20), qos1(3))
        answers = [await pub.recv() for _ in range(3)]
        assert answers == [Puback(1), Puback(2, ReasonCode.QUOTA_EXCEEDED), Puback(3)]
        got = [await sub.recv() for _ in range(2)]
        assert [p.payload for p in got if isinstance(p, Publish)] == [b"1", b"3"]


async def test_a_refused_publish_closes_a_311_connection_after_the_acks_before_it() -> None:
    async with mqtt_server(MemoryStorage(max_bytes=12)) as (server, nursery):
        pub = await connect(server, nursery, "pub", level=4)
        await send_together(pub, qos1(1), qos1(2, payload=b"x" * 20), qos1(3))
        assert await pub.recv() == Puback(1)
        assert await pub.recv() is None  # closed: 3.1.1 acks carry no error


async def test_a_new_overlapping_filter_changes_the_delivered_qos() -> None:
    async with mqtt_server(MemoryStorage()) as (server, nursery):
        sub = await connect(server, nursery, "sub")
        await sub.send(Subscribe(1, (SubscriptionRequest("a/+", 0),)))
        await sub.recv()
        pub = await connect(server, nursery, "pub")

        async def delivered_qos(n: int) -> int:
            await pub.send(Publish("a/b", b"m", 1, packet_id=n))
            assert await pub.recv() == Puback(n)
            got = await sub.recv()
            assert isinstance(got, Publish)
            if got.packet_id is not None:
                await sub.send(Puback(got.packet_id))
            return got.qos

        assert await delivered_qos(1) == 0
        await sub.send(Subscribe(2, (SubscriptionRequest("a/b", 1),)))
        assert await sub.recv() == Suback(2, (1,))
        assert await delivered_qos(2) == 1
        await sub.send(Unsubscribe(3, ("a/b",)))
        assert await sub.recv() == Unsuback(3, (0,))
        assert await delivered_qos(3) == 0


async def test_a_qos0_publish_is_encoded_once_per_protocol_level() -> None:
    async with mqtt_server(MemoryStorage()) as (server, _):
        message = Message(b"payload", qos=0)
        first = server.encoded_qos0("a/b", message, False, 4)
        assert server.encoded_qos0("a/b", message, False, 4) is first
        assert first == encode(Publish("a/b", b"payload"), 4)
        assert server.encoded_qos0("a/b", message, True, 4) == encode(
            Publish("a/b", b"payload", retain=True), 4
        )
        at_v5 = server.encoded_qos0("a/b", message, False, 5)
        assert at_v5 == encode(Publish("a/b", b"payload"), 5)
        # Another message with the same content is encoded on its own.
        assert server.encoded_qos0("a/b", Message(b"payload", qos=0), False, 4) is not first


async def test_keep_alive_allows_one_and_a_half_intervals(autojump_clock: trio.abc.Clock) -> None:
    async with mqtt_server(MemoryStorage()) as (server, nursery):
        peer = await connect(server, nursery, "k", keep_alive=2)
        for _ in range(3):
            await trio.sleep(2.9)  # within 1.5 x 2 s of the last packet
            await peer.send(Pingreq())
            assert await peer.recv() == Pingresp()
        start = trio.current_time()
        assert await peer.recv() == Disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT)
        assert 3.0 <= trio.current_time() - start < 3.5
        assert await peer.recv() is None


async def test_a_subscriber_is_told_when_the_node_stops() -> None:
    # Its delivery task runs beside its connection: the goodbye waits for it to end.
    async with mqtt_server(MemoryStorage()) as (server, nursery):
        sub = await connect(server, nursery, "sub")
        await sub.send(Subscribe(1, (SubscriptionRequest("t", 1),)))
        assert await sub.recv() == Suback(1, (1,))
        nursery.cancel_scope.cancel()
    assert await sub.recv() == Disconnect(ReasonCode.SERVER_SHUTTING_DOWN)
    assert await sub.recv() is None


async def test_a_failing_delivery_ends_its_own_connection_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deliver = Outflow.deliver

    async def failing(
        self: Outflow, consumer: Consumer, shared: SubscriptionOptions | None
    ) -> None:
        if self._ctx.client_id == "bad":
            raise RuntimeError("delivery failed")
        await deliver(self, consumer, shared)

    monkeypatch.setattr(Outflow, "deliver", failing)
    failures: list[BaseException] = []
    async with mqtt_server(MemoryStorage()) as (server, nursery):
        good = await connect(server, nursery, "good")
        await good.send(Subscribe(1, (SubscriptionRequest("t", 0),)))
        assert await good.recv() == Suback(1, (0,))

        client_end, server_end = trio.testing.memory_stream_pair()

        async def serve() -> None:
            async with server_end:
                try:
                    await ClientHandler(server, server_end, INFO).run()
                except RuntimeError as exc:
                    failures.append(exc)

        nursery.start_soon(serve)
        bad = Peer(client_end, 5)
        await bad.send(Connect("bad", protocol_level=5))
        assert isinstance(await bad.recv(), Connack)
        await bad.send(Subscribe(1, (SubscriptionRequest("t", 0),)))
        # Ended as a failing task in its nursery would end it: closed, without a DISCONNECT
        # (whether its SUBACK got out first is a race, as it was).
        answers = []
        while (packet := await bad.recv()) is not None:
            answers.append(packet)
        assert answers in ([], [Suback(1, (0,))])
        assert [str(exc) for exc in failures] == ["delivery failed"]
        assert [client.ctx.client_id for client in server.clients] == ["good"]
        assert server.sessions.connected == 1
        # The other connection goes on.
        pub = await connect(server, nursery, "pub")
        await pub.send(Publish("t", b"still here"))
        got = await good.recv()
        assert isinstance(got, Publish) and got.payload == b"still here"
