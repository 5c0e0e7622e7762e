"""mop's own Pulsar client against scripted brokers: what it raises when a broker stays silent
or refuses, so that callers get a `DriverError` and never a bare timeout."""

from __future__ import annotations

import errno
import itertools
import socket
import ssl
import zlib
from collections.abc import Sequence

import pytest
import trio

from mop.message import MessageId
from mop.protocols.pulsar.commands import (
    Ack,
    CloseConsumer,
    CloseProducer,
    Command,
    Connect,
    Connected,
    Error,
    Flow,
    Lookup,
    LookupResponse,
    LookupType,
    Producer,
    ProducerSuccess,
    RedeliverUnacknowledgedMessages,
    Send,
    SendReceipt,
    Subscribe,
    Success,
)
from mop.protocols.pulsar.driver import (
    ClientConsumer,
    ConsumerConfig,
    MessageTooLarge,
    ProducerConfig,
    Received,
    ServerRefused,
    Unavailable,
    create_producer,
    subscribe,
)
from mop.protocols.pulsar.driver.client import ClientOptions, PulsarClient, connect_failure
from mop.protocols.pulsar.driver.errors import NoBrokerAnswers
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import ack_set_of, encode_message_frame, make_payload
from mop.protocols.pulsar.metadata import (
    CompressionType,
    EncryptionKeys,
    MessageIdData,
    MessageMetadata,
)
from tests.e2e.pulsar.driver_support import open_driver
from tests.unit.protocols.pulsar.test_client import Script, scripted_broker


def owner_of_everything(urls: list[str], *, refuse: bool) -> Script:
    """A broker that owns every topic (its URL: `urls[0]`, known once it listens) and then
    refuses producers and consumers (`refuse`) or never answers them."""

    def script(command: Command) -> list[Command]:
        if isinstance(command, Lookup):
            return [
                LookupResponse(
                    request_id=command.request_id,
                    broker_service_url=urls[0],
                    response=LookupType.Connect,
                )
            ]
        if refuse and isinstance(command, Producer | Subscribe):
            return [
                Error(
                    request_id=command.request_id,
                    error=ServerError.AuthorizationError,
                    message="not for you",
                )
            ]
        return []  # silence

    return script


async def test_a_silent_broker_is_unavailable_within_the_operation_timeout() -> None:
    urls: list[str] = []
    async with scripted_broker(owner_of_everything(urls, refuse=False)) as (url, _received):
        urls.append(url)
        async with open_driver(url, operation_timeout=0.5) as client:
            with trio.fail_after(5):
                with pytest.raises(Unavailable):
                    await subscribe(client, "persistent://public/default/t", "s", lambda *_: None)
                with pytest.raises(Unavailable):
                    await create_producer(client, "persistent://public/default/t")


async def test_a_refusal_carries_its_server_error() -> None:
    urls: list[str] = []
    async with scripted_broker(owner_of_everything(urls, refuse=True)) as (url, _received):
        urls.append(url)
        async with open_driver(url, operation_timeout=2) as client:
            with trio.fail_after(5):
                with pytest.raises(ServerRefused) as refused:
                    await subscribe(client, "persistent://public/default/t", "s", lambda *_: None)
            assert refused.value.error is ServerError.AuthorizationError


def storing_broker(urls: list[str]) -> Script:
    """A broker that owns every topic, registers every producer and stores every SEND."""
    entries = itertools.count()

    def script(command: Command) -> list[Command]:
        if isinstance(command, Lookup):
            return owner_of_everything(urls, refuse=False)(command)
        if isinstance(command, Producer):
            return [ProducerSuccess(request_id=command.request_id, producer_name="p")]
        if isinstance(command, Send):
            stored = MessageIdData(ledger_id=1, entry_id=next(entries))
            return [
                SendReceipt(
                    producer_id=command.producer_id,
                    sequence_id=command.sequence_id,
                    message_id=stored,
                )
            ]
        if isinstance(command, CloseProducer):
            return [Success(request_id=command.request_id)]
        return []

    return script


async def test_no_send_carries_more_than_the_brokers_max_message_size() -> None:
    """Batches are closed before they would go over the limit of CONNECTED; a message over
    it on its own fails its ticket, is not sent, and the connection goes on."""
    urls: list[str] = []
    limit = 4096
    connected = Connected(server_version="small", protocol_version=20, max_message_size=limit)
    async with scripted_broker(storing_broker(urls), connected=connected) as (url, received):
        urls.append(url)
        async with open_driver(url, operation_timeout=2) as client:
            with trio.fail_after(5):
                producer = await create_producer(client, "persistent://public/default/t")
                tickets = [await producer.send(bytes([i]) * 1000) for i in range(10)]
                too_large = await producer.send(b"x" * (limit + 1))
                single = await producer.send(b"y" * (limit + 1), deliver_at=1)
                after = await producer.send(b"z" * 1000)
                ids = [await t.wait() for t in (*tickets, after) if t is not None]
                assert len(set(ids)) == 11
                for refused in (too_large, single):
                    assert refused is not None and refused.done
                    with pytest.raises(MessageTooLarge, match="4096"):
                        refused.result()
                await producer.close()
    sends = [c for c in received if isinstance(c, Send)]
    assert sends and all(s.payload is not None and len(s.payload.data) <= limit for s in sends)
    assert sum(s.num_messages for s in sends) == 11  # the refused ones never went
    assert sum(isinstance(c, Connect) for c in received) == 1  # one connection throughout


async def test_send_nowait_takes_messages_while_there_is_room_and_never_waits() -> None:
    """Up to `max_pending` messages without a receipt; then trio.WouldBlock (where `send`
    waits), and room again once receipts come."""
    urls: list[str] = []
    async with scripted_broker(storing_broker(urls)) as (url, _received):
        urls.append(url)
        async with open_driver(url, operation_timeout=2) as client:
            with trio.fail_after(5):
                config = ProducerConfig(max_pending=3)
                producer = await create_producer(client, "persistent://public/default/t", config)
                tickets = [producer.send_nowait(b"m%d" % i) for i in range(3)]
                with pytest.raises(trio.WouldBlock):
                    producer.send_nowait(b"no room")
                for ticket in tickets:
                    assert ticket is not None
                    await ticket.wait()
                assert producer.send_nowait(b"room again", ticket=False) is None
                await producer.close()


async def test_a_corrupt_message_gives_its_permit_back_and_is_asked_for_again() -> None:
    """A MESSAGE that fails its checksum is not handed over: its permit comes back (FLOW)
    and the entry is asked for again; an entry that keeps coming corrupt is given up with an
    ACK that says why (ValidationError.ChecksumMismatch), so that it does not come forever."""
    urls: list[str] = []
    raw = make_payload(MessageMetadata(producer_name="p", sequence_id=0, publish_time=1), b"m")
    flows = 0
    acked = trio.Event()

    def script(command: Command) -> list[Command | bytes]:
        nonlocal flows
        if isinstance(command, Lookup):
            return list(owner_of_everything(urls, refuse=False)(command))
        if isinstance(command, Subscribe):
            return [Success(request_id=command.request_id)]
        if isinstance(command, Ack):
            acked.set()
        if not isinstance(command, Flow):
            return []
        flows += 1
        # Entry 7:0 comes corrupt for the first two permits, then intact; entry 7:1 always
        # comes corrupt.
        if flows <= 2:
            return [encode_message_frame(command.consumer_id, 7, 0, raw.raw, checksum=1)]
        if flows == 3:
            good = encode_message_frame(command.consumer_id, 7, 0, raw.raw)
            bad = encode_message_frame(command.consumer_id, 7, 1, raw.raw, checksum=1)
            return [good, bad, bad, bad]
        return []

    got: list[Received] = []
    async with scripted_broker(script) as (url, received):
        urls.append(url)
        async with open_driver(url, operation_timeout=2) as client:
            with trio.fail_after(5):
                consumer = await subscribe(
                    client,
                    "persistent://public/default/t",
                    "s",
                    lambda _consumer, items: got.extend(items),
                    ConsumerConfig(receiver_queue=1),
                )
                await acked.wait()
                await trio.sleep(0.1)  # the FLOW that follows the ACK
                consumer.abort()
    assert [(m.message_id, m.payload) for m in got] == [(MessageId(7, 0), b"m")]
    redelivered = [c for c in received if isinstance(c, RedeliverUnacknowledgedMessages)]
    assert [[(i.ledger_id, i.entry_id) for i in r.message_ids] for r in redelivered] == [
        [(7, 0)],
        [(7, 0)],
        [(7, 1)],
        [(7, 1)],
    ]
    (given_up,) = [c for c in received if isinstance(c, Ack)]
    assert given_up.validation_error == 2  # ChecksumMismatch
    assert [(i.ledger_id, i.entry_id) for i in given_up.message_id] == [(7, 1)]
    # One permit back for each corrupt delivery (and for the good one).
    assert sum(c.message_permits for c in received if isinstance(c, Flow)) == 1 + 2 + 1 + 3


def _frame(consumer_id: int, entry: int, *, corrupt: bool = False) -> bytes:
    """MESSAGE 7:`entry` (payload b"m{entry}"), with a wrong checksum when `corrupt`."""
    meta = MessageMetadata(producer_name="p", sequence_id=entry, publish_time=1)
    raw = make_payload(meta, f"m{entry}".encode()).raw
    return encode_message_frame(consumer_id, 7, entry, raw, checksum=1 if corrupt else None)


async def _read(
    script: Script, config: ConsumerConfig, count: int
) -> tuple[list[Received], ClientConsumer]:
    """What a consumer with `config` of a broker answering by `script` is handed, once it was
    handed `count` messages (or after a second), and the consumer (closed)."""
    urls: list[str] = []

    def owning(command: Command) -> Sequence[Command | bytes]:
        if isinstance(command, Lookup):
            return owner_of_everything(urls, refuse=False)(command)
        return script(command)

    got: list[Received] = []
    enough = trio.Event()

    def sink(_consumer: ClientConsumer, items: list[Received]) -> None:
        got.extend(items)
        if len(got) >= count:
            enough.set()

    async with scripted_broker(owning) as (url, _received):
        urls.append(url)
        async with open_driver(url, operation_timeout=2) as client:
            with trio.fail_after(5):
                consumer = await subscribe(
                    client, "persistent://public/default/t", "s", sink, config
                )
                with trio.move_on_after(1):
                    await enough.wait()
                await trio.sleep(0.1)  # anything more it would be handed
                consumer.abort()
    return got, consumer


async def test_a_reader_subscribes_again_from_before_a_corrupt_entry() -> None:
    """A reader asked for a corrupt entry by id would filter it out when it comes (entries
    handed over after it are newer), and has acknowledged past it: it hands over nothing after
    it and subscribes again from the last entry handed over, so every entry comes, in order."""
    subscribes: list[Subscribe] = []
    acks: list[Ack] = []

    def script(command: Command) -> Sequence[Command | bytes]:
        if isinstance(command, Subscribe):
            subscribes.append(command)
            return [Success(request_id=command.request_id)]
        if isinstance(command, Ack):
            acks.append(command)
        cid = getattr(command, "consumer_id", None)
        if isinstance(command, Flow) and len(subscribes) == 1:
            return [_frame(cid, 0), _frame(cid, 1, corrupt=True), _frame(cid, 2)]
        if isinstance(command, Flow):  # from the start id, inclusive, as brokers do
            start = subscribes[-1].start_message_id
            assert start is not None
            return [_frame(cid, e) for e in range(start.entry_id, 3)]
        if isinstance(command, RedeliverUnacknowledgedMessages):  # as a Shared one would
            return [_frame(cid, data.entry_id) for data in command.message_ids]
        return []

    reader = ConsumerConfig(durable=False, auto_ack=True, receiver_queue=10)
    got, _ = await _read(script, reader, 3)
    assert [(m.message_id, m.payload) for m in got] == [
        (MessageId(7, e), f"m{e}".encode()) for e in range(3)
    ]
    first, again = subscribes
    assert again.start_message_id == MessageIdData(ledger_id=7, entry_id=0)
    # Nothing past the corrupt entry was acknowledged on the first subscription.
    assert all(
        (i.ledger_id, i.entry_id) < (7, 1)
        for ack in acks
        if ack.consumer_id == first.consumer_id
        for i in ack.message_id
    )


async def test_a_reader_gives_up_an_entry_that_stays_corrupt() -> None:
    """Its count of corrupt deliveries survives subscribing again, so an entry corrupt at rest
    is given up (acknowledged with ChecksumMismatch) after three, and the reader goes on."""
    subscribes: list[Subscribe] = []
    given_up: list[Ack] = []

    def script(command: Command) -> Sequence[Command | bytes]:
        if isinstance(command, Subscribe):
            subscribes.append(command)
            return [Success(request_id=command.request_id)]
        if isinstance(command, Ack) and command.validation_error is not None:
            given_up.append(command)
        if isinstance(command, Flow):
            cid = command.consumer_id
            return [_frame(cid, 0, corrupt=True), _frame(cid, 1)]
        return []

    reader = ConsumerConfig(durable=False, auto_ack=True, start_message_id=MessageId(-1, -1))
    got, _ = await _read(script, reader, 1)
    assert [m.message_id for m in got] == [MessageId(7, 1)]
    assert len(subscribes) == 3
    assert [s.start_message_id for s in subscribes[1:]] == [
        MessageIdData(ledger_id=7, entry_id=0)
    ] * 2
    (ack,) = given_up
    assert ack.validation_error == 2
    assert [(i.ledger_id, i.entry_id) for i in ack.message_id] == [(7, 0)]


async def test_corrupt_counts_end_with_their_subscription() -> None:
    """A durable consumer's count of an entry that came corrupt is dropped when it subscribes
    again (the entry may never come back to it): the counts do not pile up."""
    subscribes: list[Subscribe] = []

    def script(command: Command) -> Sequence[Command | bytes]:
        if isinstance(command, Subscribe):
            subscribes.append(command)
            return [Success(request_id=command.request_id)]
        if isinstance(command, Flow) and len(subscribes) == 1:
            return [_frame(command.consumer_id, 0, corrupt=True)]
        if isinstance(command, RedeliverUnacknowledgedMessages):  # its topic moves instead
            return [CloseConsumer(consumer_id=command.consumer_id, request_id=0)]
        if isinstance(command, Flow):
            return [_frame(command.consumer_id, 1)]
        return []

    got, consumer = await _read(script, ConsumerConfig(), 1)
    assert [m.message_id for m in got] == [MessageId(7, 1)] and len(subscribes) == 2
    assert consumer._corrupt == {}


async def test_a_consumer_decompresses_up_to_the_brokers_max_message_size() -> None:
    """A payload announced (or found) larger decompressed than the broker's max_message_size
    (from CONNECTED) is left unacknowledged, not decompressed: a client must not allocate what
    any producer announces."""
    urls: list[str] = []
    limit = 4096
    plain = {0: b"x" * (limit + 1), 1: b"y" * limit}

    def compressed(entry: int) -> bytes:
        meta = MessageMetadata(
            producer_name="p",
            sequence_id=entry,
            publish_time=1,
            compression=CompressionType.ZLIB,
            uncompressed_size=len(plain[entry]),
        )
        return make_payload(meta, zlib.compress(plain[entry])).raw

    def script(command: Command) -> list[Command | bytes]:
        if isinstance(command, Lookup):
            return list(owner_of_everything(urls, refuse=False)(command))
        if isinstance(command, Subscribe):
            return [Success(request_id=command.request_id)]
        if isinstance(command, Flow):
            return [encode_message_frame(command.consumer_id, 7, e, compressed(e)) for e in (0, 1)]
        return []

    got: list[Received] = []
    handed = trio.Event()

    def sink(_consumer: ClientConsumer, items: list[Received]) -> None:
        got.extend(items)
        handed.set()

    connected = Connected(server_version="small", protocol_version=20, max_message_size=limit)
    async with scripted_broker(script, connected=connected) as (url, _received):
        urls.append(url)
        async with open_driver(url, operation_timeout=2) as client:
            with trio.fail_after(5):
                consumer = await subscribe(client, "persistent://public/default/t", "s", sink)
                await handed.wait()
                consumer.abort()
    assert [(m.message_id, m.payload) for m in got] == [(MessageId(7, 1), plain[1])]


async def test_brokers_behind_a_proxy_are_reached_through_the_service_url() -> None:
    """A lookup answer with proxy_through_service_url: the client connects to the service URL
    again, its CONNECT naming the broker to reach, one connection per broker behind it."""

    def proxy(command: Command) -> list[Command]:
        if isinstance(command, Lookup):
            broker = "pulsar://broker-a:6650" if command.topic.endswith("a") else "pulsar://b:1"
            return [
                LookupResponse(
                    request_id=command.request_id,
                    broker_service_url=broker,
                    response=LookupType.Connect,
                    proxy_through_service_url=True,
                )
            ]
        return []

    async with (
        scripted_broker(proxy) as (url, received),
        open_driver(url, operation_timeout=2) as client,
    ):
        with trio.fail_after(5):
            first = await client.lookup("persistent://public/default/a")
            again = await client.lookup("persistent://public/default/a")
            other = await client.lookup("persistent://public/default/b")
        assert first is again and other is not first
        assert first.address == other.address == url
    connects = [c for c in received if isinstance(c, Connect)]
    assert [c.proxy_to_broker_url for c in connects] == [
        None,  # the lookups
        "pulsar://broker-a:6650",
        "pulsar://b:1",
    ]


def _sealed(
    consumer_id: int, entry: int, *, batch: int = 0, ack_set: tuple[int, ...] = ()
) -> bytes:
    """MESSAGE 7:`entry` of an encrypted entry (a batch of `batch` messages, or a single message
    with an ordering key and a null value), `ack_set` its members still owed."""
    meta = MessageMetadata(
        producer_name="p",
        sequence_id=entry,
        publish_time=1,
        partition_key="partition",
        encryption_keys=(EncryptionKeys(key="k1", value=b"data key"),),
        num_messages_in_batch=batch or None,
        ordering_key=None if batch else b"order",
        null_value=not batch,
    )
    raw = make_payload(meta, b"cipher").raw
    return encode_message_frame(consumer_id, 7, entry, raw, ack_set=ack_set)


async def test_encrypted_entries_get_the_checks_of_single_messages() -> None:
    """A non-durable consumer is not handed an encrypted entry again, nor one whose messages
    were all acknowledged (batch-index acks); a single one keeps its ordering key and null
    value."""

    def script(command: Command) -> Sequence[Command | bytes]:
        if isinstance(command, Subscribe):
            return [Success(request_id=command.request_id)]
        if isinstance(command, Flow):
            cid = command.consumer_id
            return [
                _sealed(cid, 0),
                _sealed(cid, 1, batch=3, ack_set=(0,)),  # every member acknowledged
                _sealed(cid, 2, batch=3, ack_set=ack_set_of((2,))),
                _sealed(cid, 0),  # handed over already
            ]
        return []

    got, _ = await _read(script, ConsumerConfig(durable=False), 3)
    assert [m.message_id for m in got] == [MessageId(7, 0), MessageId(7, 2)]
    single = got[0]
    assert (single.key, single.payload, single.encrypted) == ("order", b"", True)


async def test_a_connection_that_fails_says_why_in_a_few_words() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: connections are refused
        client = PulsarClient(f"pulsar://127.0.0.1:{port}", ClientOptions("test"))
        async with trio.open_nursery() as nursery:
            await nursery.start(client.serve)
            with pytest.raises(NoBrokerAnswers) as failed:
                await client.reach()
            await client.aclose()
    assert failed.value.attempts == [f"pulsar://127.0.0.1:{port}: connection refused"]


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (trio.TooSlowError(), "timed out after 2.5 s"),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "host name not found"),
        (ConnectionResetError(errno.ECONNRESET, "reset"), "connection reset by peer"),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "TLS: "),
    ],
)
def test_connect_failures_are_named(error: BaseException, said: str) -> None:
    assert connect_failure(error, 2.5).startswith(said)


async def test_a_silent_first_address_does_not_keep_the_next_broker_from_being_reached() -> None:
    """A service URL whose first broker accepts and never answers: the next is tried after a
    short head start, not after the whole connect timeout."""
    with socket.socket() as silent:  # connections wait in its backlog, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        silent_port = silent.getsockname()[1]
        async with scripted_broker(lambda _command: []) as (url, _received):
            live_port = int(url.rsplit(":", 1)[1])
            service_url = f"pulsar://127.0.0.1:{silent_port},127.0.0.1:{live_port}"
            client = PulsarClient(service_url, ClientOptions("test", connect_timeout=5.0))
            async with trio.open_nursery() as nursery:
                await nursery.start(client.serve)
                started = trio.current_time()
                with trio.fail_after(3):
                    connection = await client.reach()
                assert trio.current_time() - started < 2.0
                assert connection.address == f"pulsar://127.0.0.1:{live_port}"
                await client.aclose()


async def test_every_address_that_fails_says_why_in_order() -> None:
    with socket.socket() as closed, socket.socket() as silent:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        ports = [closed.getsockname()[1], silent.getsockname()[1]]
        service_url = f"pulsar://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
        client = PulsarClient(service_url, ClientOptions("test", connect_timeout=0.5))
        async with trio.open_nursery() as nursery:
            await nursery.start(client.serve)
            with pytest.raises(NoBrokerAnswers) as failed:
                await client.reach()
            await client.aclose()
    assert failed.value.attempts == [
        f"pulsar://127.0.0.1:{ports[0]}: connection refused",
        f"pulsar://127.0.0.1:{ports[1]}: timed out after 0.5 s",
    ]
