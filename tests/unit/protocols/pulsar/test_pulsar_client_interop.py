"""The codec against the real `pulsar-client`: a tiny broker on plain sockets and threads.

This broker keeps one in-memory topic. It exists only to show that framing, checksums and the
command schema are what the C++ client speaks, before the real adapter exists.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pulsar
import pytest

from mop.protocols.pulsar.commands import (
    Ack,
    AckType,
    CloseConsumer,
    CloseProducer,
    Connect,
    Error,
    Flow,
    GetLastMessageId,
    GetLastMessageIdResponse,
    Lookup,
    PartitionedMetadata,
    Ping,
    Pong,
    Producer,
    ProducerSuccess,
    Send,
    Subscribe,
    Success,
)
from mop.protocols.pulsar.connection import (
    ConnectionLimits,
    ServerConnection,
    lookup_connect,
    lookup_failed,
    message_id,
    partitioned_metadata,
)
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import NeedData, decode_batch
from mop.protocols.pulsar.metadata import Payload


@dataclass
class Broker:
    """Accepts pulsar-client connections on a loopback port and records what it is sent."""

    listener: socket.socket
    sends: list[Send] = field(default_factory=list)
    producers: list[Producer] = field(default_factory=list)
    subscribes: list[Subscribe] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    client_versions: list[str] = field(default_factory=list)
    received: bytearray = field(default_factory=bytearray)
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        host, port = self.listener.getsockname()
        return f"pulsar://{host}:{port}"

    def serve_connection(self, sock: socket.socket) -> None:
        conn = ServerConnection(ConnectionLimits(server_version="mop-test"))
        permits: dict[int, int] = {}
        next_entry: dict[int, int] = {}
        try:
            with sock:
                while data := sock.recv(65536):
                    with self.lock:
                        self.received += data
                    conn.receive_data(data)
                    while not isinstance(event := conn.next_event(), NeedData):
                        sock.sendall(self._answer(conn, event, permits, next_entry))
        except OSError:
            pass
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.errors.append(exc)

    def _answer(
        self,
        conn: ServerConnection,
        event: object,
        permits: dict[int, int],
        next_entry: dict[int, int],
    ) -> bytes:
        match event:
            case Connect(client_version=version):
                self.client_versions.append(version)
                return conn.connected()
            case Ping():
                return conn.send(Pong())
            case PartitionedMetadata(request_id=rid):
                return conn.send(partitioned_metadata(rid))
            case Lookup(request_id=rid, topic=topic) if topic.endswith("/missing"):
                return conn.send(lookup_failed(rid, ServerError.TopicNotFound, "no such topic"))
            case Lookup(request_id=rid):
                return conn.send(lookup_connect(rid, self.url))
            case Producer(request_id=rid, topic=topic) if topic.endswith("/busy"):
                error = Error(request_id=rid, error=ServerError.ProducerBusy, message="taken")
                return conn.send(error)
            case Producer(request_id=rid, producer_id=pid):
                self.producers.append(event)
                return conn.send(ProducerSuccess(request_id=rid, producer_name=f"mop-test-{pid}"))
            case Send(producer_id=pid, sequence_id=seq):
                with self.lock:
                    self.sends.append(event)
                    entry = len(self.sends) - 1
                return conn.send_receipt(pid, seq, 1, entry)
            case CloseProducer(request_id=rid) | CloseConsumer(request_id=rid):
                return conn.send(Success(request_id=rid))
            case Subscribe(request_id=rid, consumer_id=cid):
                self.subscribes.append(event)
                permits[cid] = 0
                next_entry[cid] = 0
                return conn.send(Success(request_id=rid))
            case Flow(consumer_id=cid, message_permits=n):
                permits[cid] += n
                return self._dispatch(conn, cid, permits, next_entry)
            case Ack():
                self.acks.append(event)
                return b""
            case GetLastMessageId(request_id=rid):
                last = message_id(1, len(self.sends) - 1)
                return conn.send(GetLastMessageIdResponse(request_id=rid, last_message_id=last))
            case _:
                return b""

    def _dispatch(
        self, conn: ServerConnection, cid: int, permits: dict[int, int], next_entry: dict[int, int]
    ) -> bytes:
        out = bytearray()
        with self.lock:
            stored = [send.payload for send in self.sends]
        while permits[cid] > 0 and next_entry[cid] < len(stored):
            entry = next_entry[cid]
            payload = stored[entry]
            assert payload is not None
            # Forward the stored bytes unchanged, reusing the producer's checksum.
            out += conn.deliver(cid, 1, entry, payload.raw, payload.checksum)
            permits[cid] -= payload.metadata.message_count
            next_entry[cid] += 1
        return bytes(out)


@pytest.fixture
def broker() -> Iterator[Broker]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    server = Broker(listener)

    def accept_loop() -> None:
        while not server.stopping.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            threading.Thread(target=server.serve_connection, args=(sock,), daemon=True).start()

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        thread.join(timeout=5)
        listener.close()
    assert not server.errors, server.errors


@pytest.fixture
def client(broker: Broker) -> Iterator[pulsar.Client]:
    client = pulsar.Client(
        broker.url,
        operation_timeout_seconds=5,
        connection_timeout_ms=5000,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        yield client
    finally:
        client.close()


TOPIC = "persistent://public/default/interop"


def test_handshake_lookup_producer_send_receipt(broker: Broker, client: pulsar.Client) -> None:
    producer = client.create_producer(TOPIC)
    msg_id = producer.send(
        b"hello \x00 world",
        properties={"colour": "blue", "empty": ""},
        partition_key="k1",
        event_timestamp=1234,
    )
    assert producer.producer_name() == "mop-test-0"
    producer.close()

    assert broker.producers[0].topic == TOPIC
    assert broker.producers[0].producer_name is None
    assert broker.producers[0].user_provided_producer_name is False
    [send] = broker.sends
    assert send.sequence_id == 0
    payload = send.payload
    assert isinstance(payload, Payload)
    assert payload.data == b"hello \x00 world"
    meta = payload.metadata
    assert {p.key: p.value for p in meta.properties} == {"colour": "blue", "empty": ""}
    assert meta.partition_key == "k1"
    assert meta.event_time == 1234
    assert meta.producer_name == "mop-test-0"
    assert meta.num_messages_in_batch is None
    assert abs(meta.publish_time - time.time() * 1000) < 60_000
    # The receipt's id is what the client hands back.
    assert (msg_id.ledger_id(), msg_id.entry_id()) == (1, 0)
    # The client put a CRC32C block on the SEND, equal to the one computed here.
    assert b"\x0e\x01" + struct.pack(">I", payload.checksum) + payload.raw in broker.received


def test_sequence_ids_and_many_sends(broker: Broker, client: pulsar.Client) -> None:
    producer = client.create_producer(TOPIC, producer_name="named")
    for i in range(50):
        producer.send(f"m{i}".encode() * i)
    producer.close()
    assert broker.producers[0].producer_name == "named"
    assert [s.sequence_id for s in broker.sends] == list(range(50))
    assert [s.payload.data for s in broker.sends if s.payload] == [
        f"m{i}".encode() * i for i in range(50)
    ]


def test_batched_send_decodes_into_entries(broker: Broker, client: pulsar.Client) -> None:
    producer = client.create_producer(
        TOPIC, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=50
    )
    for i in range(10):
        producer.send_async(f"b{i}".encode(), None, properties={"i": str(i)})
    producer.flush()
    producer.close()

    [send] = broker.sends
    assert send.num_messages == 10
    assert send.payload is not None
    assert send.payload.metadata.num_messages_in_batch == 10
    entries = decode_batch(send.payload.data, 10)
    assert [e.payload for e in entries] == [f"b{i}".encode() for i in range(10)]
    assert [e.metadata.properties[0].value for e in entries] == [str(i) for i in range(10)]
    assert [e.metadata.sequence_id for e in entries] == list(range(10))


def test_consumer_receives_forwarded_entries(broker: Broker, client: pulsar.Client) -> None:
    producer = client.create_producer(TOPIC)
    for i in range(3):
        producer.send(f"p{i}".encode(), properties={"n": str(i)})
    producer.close()

    consumer = client.subscribe(TOPIC, "sub", initial_position=pulsar.InitialPosition.Earliest)
    received = [consumer.receive(timeout_millis=5000) for _ in range(3)]
    assert [m.data() for m in received] == [b"p0", b"p1", b"p2"]
    assert [m.properties() for m in received] == [{"n": "0"}, {"n": "1"}, {"n": "2"}]
    assert [m.redelivery_count() for m in received] == [0, 0, 0]
    for m in received:
        consumer.acknowledge(m)
    consumer.close()  # flushes the grouped acks first

    assert broker.subscribes[0].subscription == "sub"
    acked = {(mid.ledger_id, mid.entry_id) for ack in broker.acks for mid in ack.message_id}
    assert acked == {(1, 0), (1, 1), (1, 2)}
    assert all(ack.ack_type is AckType.Individual for ack in broker.acks)


def test_reader_from_earliest_and_last_message_id(broker: Broker, client: pulsar.Client) -> None:
    producer = client.create_producer(TOPIC)
    producer.send(b"only")
    producer.close()

    reader = client.create_reader(TOPIC, pulsar.MessageId.earliest)
    assert reader.has_message_available()  # GET_LAST_MESSAGE_ID -> (1, 0)
    assert reader.read_next(timeout_millis=5000).data() == b"only"
    reader.close()

    assert broker.client_versions[0].startswith("Pulsar-CPP-v")
    [subscribe] = broker.subscribes
    assert subscribe.durable is False
    assert subscribe.start_message_id is not None
    earliest = (1 << 64) - 1
    assert (subscribe.start_message_id.ledger_id, subscribe.start_message_id.entry_id) == (
        earliest,
        earliest,
    )


def test_errors_map_to_the_client_exceptions(broker: Broker, client: pulsar.Client) -> None:
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer("persistent://public/default/busy")
    with pytest.raises(pulsar.TopicNotFound):
        client.create_producer("persistent://public/default/missing")
    # The connection survived both answers.
    client.create_producer(TOPIC).send(b"still fine")
    assert [s.payload.data for s in broker.sends if s.payload] == [b"still fine"]
