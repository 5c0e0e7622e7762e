"""The floor of an MQTT broker on trio: the least relay that serves the bench's flows, so that
what the bench measures of it (connects/s and memory per idle connection, msgs/s 1 -> 1, fan-out
and fan-in, QoS 1 latency) is the least any trio broker on this machine pays, next to which
mop's numbers are read.

It is a floor, not a broker. What it does, for MQTT 3.1.1 and 5.0 framing:
- CONNECT -> CONNACK (accepted), PINGREQ -> PINGRESP, DISCONNECT ends the connection;
- SUBSCRIBE -> SUBACK granting the requested QoS, UNSUBSCRIBE -> UNSUBACK;
- a PUBLISH at QoS 0, 1 or 2 is forwarded at once to every connection with a matching
  subscription (+ and #; 5.0's No Local), at the lower of the two QoS, with that connection's
  own packet id; then PUBACK, or PUBREC and PUBCOMP on PUBREL, to the publisher. A repeated
  QoS 2 packet id before its PUBREL is acknowledged again, not forwarded again. Toward a
  subscriber, PUBACK and PUBCOMP are read and forgotten, PUBREC is answered with PUBREL.
What it does not do: no authentication, no client ids, no sessions (every connection starts
and ends clean), no will, no retained messages (the flag is cleared on the way; a 5.0 CONNACK
says retain is not available), no queue and no in-flight limit toward a subscriber (what it
cannot write yet waits in memory), no storage, no topic aliases, subscription identifiers or
shared subscriptions (a 5.0 CONNACK says so), no keep-alive timeout. Anything it cannot parse
ends that connection.

How it runs: one trio task per connection, reading with `receive_some`. The packets of one read
are handled together; every connection they write to gets one `send_all` of all of it (the
subscribers first, the reader's own acknowledgements last), the least a batching broker does.
A connection that another task is already writing to gets its bytes appended to what that
writer sends next. Which connections a topic goes to is cached per topic name (dropped on every
subscription change), so the steady state is a dict lookup.

    python bench/floor_server.py PORT

It stops on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import itertools
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

import trio

CONNECT, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 3, 4, 5, 6, 7
SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT = 8, 10, 12, 14
MQTT_311, MQTT_5 = 4, 5
PINGRESP = b"\xd0\x00"
# 5.0: Retain Available 0, Subscription Identifiers Available 0, Shared Subscriptions Available 0.
CONNACK_5_PROPERTIES = b"\x25\x00\x29\x00\x2a\x00"
SUBACK_FAILURE = 0x80
UNSUBACK_5_NO_SUBSCRIPTION = 0x11
READ_SIZE = 65536
# A remaining length takes at most 4 bytes after the first byte of the fixed header.
MAX_HEADER = 5


class Malformed(Exception):
    """The peer sent something that is not MQTT as this server reads it."""


# ---- framing (pure) -----------------------------------------------------------------------------


def frame_at(data: bytes, pos: int) -> tuple[int, int] | None:
    """(start of the body, end) of the packet at `data[pos]`, None when it has not all arrived."""
    length = shift = 0
    for index in range(pos + 1, min(len(data), pos + MAX_HEADER)):
        byte = data[index]
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            end = index + 1 + length
            return (index + 1, end) if len(data) >= end else None
        shift += 7
    if len(data) - pos >= MAX_HEADER:
        raise Malformed("remaining length longer than 4 bytes")
    return None


def read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it) of the variable byte integer at `data[pos]`."""
    value = shift = 0
    for index in range(pos, min(end, pos + 4)):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    raise Malformed("bad variable byte integer")


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


def packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def read_string(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    """(the bytes of the UTF-8 string at `data[pos]`, position after it)."""
    if pos + 2 > end:
        raise Malformed("string runs past the packet")
    stop = pos + 2 + (data[pos] << 8 | data[pos + 1])
    if stop > end:
        raise Malformed("string runs past the packet")
    return data[pos + 2 : stop], stop


def skip_properties(data: bytes, pos: int, end: int) -> int:
    """The position after the 5.0 properties at `data[pos]`."""
    length, start = read_varint(data, pos, end)
    if start + length > end:
        raise Malformed("properties run past the packet")
    return start + length


def ack(first: int, packet_id: bytes) -> bytes:
    """A PUBACK/PUBREC/PUBREL/PUBCOMP: success, so 5.0 may leave out reason and properties."""
    return bytes((first, 2)) + packet_id


def connack(version: int, assigned_id: bytes | None) -> bytes:
    """CONNACK accepted, session not present; a 5.0 one says what this server leaves out and,
    for an empty client id, the one it assigns."""
    if version != MQTT_5:
        return b"\x20\x02\x00\x00"
    properties = CONNACK_5_PROPERTIES
    if assigned_id is not None:
        properties += b"\x12" + len(assigned_id).to_bytes(2, "big") + assigned_id
    return packet(0x20, b"\x00\x00" + encode_varint(len(properties)) + properties)


def parse_connect(data: bytes, body: int, end: int) -> tuple[int, bool]:
    """(protocol level, whether the client id is empty) of a CONNECT's body."""
    name, pos = read_string(data, body, end)
    if name != b"MQTT" or pos + 4 > end:
        raise Malformed("not an MQTT CONNECT")
    level = data[pos]
    pos += 4  # level, flags, keep alive
    if level == MQTT_5:
        pos = skip_properties(data, pos, end)
    client_id, _ = read_string(data, pos, end)
    return level, not client_id


def valid_filter(topic_filter: str) -> bool:
    """Whether `topic_filter` is a topic filter this server serves (not a shared one)."""
    if not topic_filter or topic_filter.startswith("$share/"):
        return False
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def topic_matches(topic_filter: str, topic: str) -> bool:
    """MQTT matching: + is one level, # the parent and every level below; a filter that starts
    with a wildcard matches no topic that starts with $."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    levels = topic.split("/")
    wanted = topic_filter.split("/")
    for index, level in enumerate(wanted):
        if level == "#":
            return True
        if index >= len(levels) or (level != "+" and level != levels[index]):
            return False
    return len(wanted) == len(levels)


def parse_subscribe(data: bytes, body: int, end: int, version: int) -> list[tuple[str, int]]:
    """(filter, options byte) of each entry of a SUBSCRIBE's body (after its packet id)."""
    pos = body + 2
    if version == MQTT_5:
        pos = skip_properties(data, pos, end)
    entries = []
    while pos < end:
        raw, pos = read_string(data, pos, end)
        if pos >= end:
            raise Malformed("subscription without options")
        entries.append((raw.decode("utf-8", "replace"), data[pos]))
        pos += 1
    if not entries:
        raise Malformed("SUBSCRIBE without a topic filter")
    return entries


def parse_unsubscribe(data: bytes, body: int, end: int, version: int) -> list[str]:
    pos = body + 2
    if version == MQTT_5:
        pos = skip_properties(data, pos, end)
    filters = []
    while pos < end:
        raw, pos = read_string(data, pos, end)
        filters.append(raw.decode("utf-8", "replace"))
    if not filters:
        raise Malformed("UNSUBSCRIBE without a topic filter")
    return filters


# ---- the relay ----------------------------------------------------------------------------------


@dataclass(eq=False, slots=True)
class Client:
    stream: trio.SocketStream
    version: int = 0  # the protocol level of its CONNECT; 0 until then
    pending: list[bytes] = field(default_factory=list)  # to write, in order
    writing: bool = False  # a task is in send_all on this stream
    gone: bool = False
    last_id: int = 0  # the packet id of the last QoS 1/2 PUBLISH sent to it
    filters: dict[str, int] = field(default_factory=dict)  # filter -> options byte
    # The packet ids of QoS 2 messages received until their PUBREL; made at the first one, as
    # an empty set is most of what an idle connection of this server holds.
    received_qos2: set[bytes] | None = None

    def next_id(self) -> bytes:
        self.last_id = self.last_id % 0xFFFF + 1
        return self.last_id.to_bytes(2, "big")


# Where a topic goes: each matching client, the QoS it gets, and the QoS it gets of its own
# messages (-1: none, every matching subscription of it says No Local).
Route = tuple[Client, int, int]


class Relay:
    def __init__(self) -> None:
        self.subscribers: dict[str, set[Client]] = {}  # filter -> clients
        self.routes: dict[bytes, list[Route]] = {}

    def subscribe(self, client: Client, topic_filter: str, options: int) -> None:
        client.filters[topic_filter] = options
        self.subscribers.setdefault(topic_filter, set()).add(client)
        self.routes.clear()

    def unsubscribe(self, client: Client, topic_filter: str) -> bool:
        if client.filters.pop(topic_filter, None) is None:
            return False
        clients = self.subscribers[topic_filter]
        clients.discard(client)
        if not clients:
            del self.subscribers[topic_filter]
        self.routes.clear()
        return True

    def route(self, topic: bytes) -> list[Route]:
        found = self.routes.get(topic)
        if found is None:
            found = self.routes[topic] = self._match(topic.decode("utf-8", "replace"))
        return found

    def _match(self, topic: str) -> list[Route]:
        best: dict[Client, tuple[int, int]] = {}
        for topic_filter, clients in self.subscribers.items():
            if not topic_matches(topic_filter, topic):
                continue
            for client in clients:
                options = client.filters[topic_filter]
                qos, own = best.get(client, (-1, -1))
                qos = max(qos, options & 3)
                if not options & 4:  # No Local
                    own = max(own, options & 3)
                best[client] = (qos, own)
        return [(client, qos, own) for client, (qos, own) in best.items()]


class Batch:
    """What one read of one connection writes: the connections written to, in order."""

    def __init__(self, reader: Client) -> None:
        self.reader = reader
        self.targets: dict[Client, None] = {}

    def to(self, client: Client, *chunks: bytes) -> None:
        client.pending.extend(chunks)
        if client is not self.reader:
            self.targets[client] = None

    async def flush(self) -> None:
        for client in self.targets:
            await write(client)
        await write(self.reader)


async def write(client: Client) -> None:
    """Write what `client` has pending, unless another task is writing to it already (that one
    writes it after what it is writing now)."""
    if client.writing:
        return
    client.writing = True
    try:
        while client.pending and not client.gone:
            data = b"".join(client.pending)
            client.pending.clear()
            await client.stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        client.gone = True  # its own task sees the end of its stream and cleans up
        client.pending.clear()
    finally:
        client.writing = False


def forward(batch: Batch, relay: Relay, first: int, data: bytes, body: int, end: int) -> bytes:
    """Hand a PUBLISH to every matching subscriber; its packet id (b"" at QoS 0)."""
    qos = first >> 1 & 3
    if qos == 3:
        raise Malformed("PUBLISH at QoS 3")
    topic, pos = read_string(data, body, end)
    packet_id = b""
    if qos:
        packet_id, pos = data[pos : pos + 2], pos + 2
        received = batch.reader.received_qos2
        if qos == 2 and received is not None and packet_id in received:
            return packet_id  # a resend before its PUBREL: delivered already
    properties = b"\x00"
    if batch.reader.version == MQTT_5:
        after = skip_properties(data, pos, end)
        properties, pos = data[pos:after], after
    if pos > end:
        raise Malformed("PUBLISH shorter than its header")
    if qos == 2:
        if batch.reader.received_qos2 is None:
            batch.reader.received_qos2 = set()
        batch.reader.received_qos2.add(packet_id)
    payload = data[pos:end]
    topic_field = data[body : body + 2 + len(topic)]
    # The head (fixed header and topic) and tail (properties and payload) of each variant sent,
    # by (QoS, 5.0 or not): each subscriber adds only its packet id.
    variants: dict[tuple[int, bool], tuple[bytes, bytes]] = {}
    for client, granted, own in relay.route(topic):
        out_qos = min(qos, own if client is batch.reader else granted)
        if out_qos < 0 or client.gone:
            continue
        v5 = client.version == MQTT_5
        variant = variants.get((out_qos, v5))
        if variant is None:
            tail = properties + payload if v5 else payload
            size = len(topic_field) + (2 if out_qos else 0) + len(tail)
            head = bytes((0x30 | out_qos << 1,)) + encode_varint(size) + topic_field
            variant = variants[(out_qos, v5)] = (head, tail)
        if out_qos:
            batch.to(client, variant[0], client.next_id(), variant[1])
        else:
            batch.to(client, variant[0], variant[1])
    return packet_id


def handle(batch: Batch, relay: Relay, data: bytes, start: int, body: int, end: int) -> bool:
    """Act on the packet at data[start:end]; False when the connection is to end."""
    client = batch.reader
    first = data[start]
    kind = first >> 4
    if kind == PUBLISH:
        packet_id = forward(batch, relay, first, data, body, end)
        qos = first >> 1 & 3
        if qos:
            batch.to(client, ack(0x40 if qos == 1 else 0x50, packet_id))
        return True
    if end - body < 2 and kind in (PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE):
        raise Malformed("packet without a packet id")
    packet_id = data[body : body + 2]
    if kind in (PUBACK, PUBCOMP):
        return True  # nothing in flight is tracked
    if kind == PUBREC:
        if end - body < 3 or data[body + 2] < 0x80:
            batch.to(client, ack(0x62, packet_id))
        return True
    if kind == PUBREL:
        if client.received_qos2 is not None:
            client.received_qos2.discard(packet_id)
        batch.to(client, ack(0x70, packet_id))
        return True
    if kind == SUBSCRIBE:
        codes = bytearray()
        for topic_filter, options in parse_subscribe(data, body, end, client.version):
            if options & 3 == 3 or options & 0xC0 or not valid_filter(topic_filter):
                codes.append(SUBACK_FAILURE)
                continue
            relay.subscribe(
                client, topic_filter, options if client.version == MQTT_5 else options & 3
            )
            codes.append(options & 3)
        head = packet_id + (b"\x00" if client.version == MQTT_5 else b"")
        batch.to(client, packet(0x90, head + bytes(codes)))
        return True
    if kind == UNSUBSCRIBE:
        found = [
            relay.unsubscribe(client, f) for f in parse_unsubscribe(data, body, end, client.version)
        ]
        if client.version == MQTT_5:
            reasons = bytes(0 if ok else UNSUBACK_5_NO_SUBSCRIPTION for ok in found)
            batch.to(client, packet(0xB0, packet_id + b"\x00" + reasons))
        else:
            batch.to(client, packet(0xB0, packet_id))
        return True
    if kind == PINGREQ:
        batch.to(client, PINGRESP)
        return True
    return False  # DISCONNECT, a second CONNECT, or a packet no client sends


async def on_read(client: Client, relay: Relay, ids: Iterator[int], data: bytes) -> bytes | None:
    """Act on the packets of one read and write what they call for; the bytes of a packet not
    complete yet, None when the connection is to end."""
    batch = Batch(client)
    pos, going = 0, True
    while going and (frame := frame_at(data, pos)) is not None:
        body, end = frame
        if client.version:
            going = handle(batch, relay, data, pos, body, end)
        elif data[pos] >> 4 == CONNECT:
            level, anonymous = parse_connect(data, body, end)
            if level not in (MQTT_311, MQTT_5):
                batch.to(client, b"\x20\x02\x00\x01")  # unacceptable protocol version
                going = False
            else:
                client.version = level
                assigned = f"floor-{next(ids)}".encode() if anonymous else None
                batch.to(client, connack(level, assigned))
        else:
            raise Malformed("the first packet is not CONNECT")
        pos = end
    await batch.flush()
    return data[pos:] if going else None


async def serve_client(relay: Relay, ids: Iterator[int], stream: trio.SocketStream) -> None:
    # Only the client and the bytes of a packet not complete yet stay while it waits to read.
    client = Client(stream)
    pending: bytes | None = b""
    try:
        while data := await stream.receive_some(READ_SIZE):
            pending = await on_read(client, relay, ids, pending + data if pending else data)
            if pending is None or client.gone:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError, Malformed):
        return
    finally:
        client.gone = True
        for topic_filter in list(client.filters):
            relay.unsubscribe(client, topic_filter)


async def main(port: int) -> None:
    handler = partial(serve_client, Relay(), itertools.count(1))
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, handler, port, host="127.0.0.1"))
            async for _ in signals:
                nursery.cancel_scope.cancel()
                return


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    trio.run(main, int(sys.argv[1]))
