"""The pure per-message work of a merged node, without sockets or trio: decoding PUBLISH packets
through a server connection, encoding PUBLISH packets for delivery, matching topics in the
subscription trie, framing storage records, and reading Pulsar SEND frames and writing MESSAGE
frames; then the same through a merged node in this process (`node0`, `node1`: QoS 0 and QoS 1
publishes from one client to another over loopback, the clients' packets encoded beforehand).
Prints nanoseconds per message, and which of the modules the build may compile
(`mop.compiled`) run compiled, so that a pure install and a compiled one
(`COMPILE_MOP=1 pip install .`) can be compared with the same command:

    python bench/hot_path.py [--messages 200000] [--repeat 5] [--only decode,encode,...]

The best of `--repeat` rounds is reported, which filters out most of a shared machine's noise.
For instruction counts, which do not depend on the load, run one part under callgrind with
`--repeat 1` and with `--repeat 3`: the difference is two rounds of the part alone (the setup
cancels out), so divide it by twice `--messages`:

    valgrind --tool=callgrind --callgrind-out-file=/tmp/r1.out \
        python bench/hot_path.py --messages 20000 --repeat 1 --only decode
    (the same with --repeat 3 into /tmp/r3.out; `summary:` in each file is the total)
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import time
from collections.abc import Callable

from mop.broker.storage.records import frame_messages
from mop.compiled import compiled_modules
from mop.message import Message
from mop.protocols.mqtt.codec import NEED_DATA, encode, encode_publish
from mop.protocols.mqtt.connection import ConnectionLimits, ServerConnection
from mop.protocols.mqtt.packets import (
    NO_PROPERTIES,
    Connect,
    Publish,
    Subscribe,
    SubscriptionRequest,
)
from mop.protocols.pulsar.commands import Send
from mop.protocols.pulsar.frames import (
    NEED_DATA as NEED_FRAME,
)
from mop.protocols.pulsar.frames import (
    FrameDecoder,
    encode_command,
    encode_message_frame,
    make_payload,
)
from mop.protocols.pulsar.metadata import MessageMetadata
from mop.settings import StorageSettings
from mop.testing.node import node_settings, running_node
from mop.topics import SubscriptionTrie

PAYLOAD = b"p" * 100
TOPICS = [f"bench/site{n % 10}/sensor{n % 100}" for n in range(1000)]
# A record batch as the broker appends one: the messages of one read of a publisher.
RECORD_BATCH = 64


def _decode(messages: int) -> Callable[[], int]:
    """A client's stream of QoS 0 and QoS 1 PUBLISH packets (MQTT 3.1.1), read back."""
    stream = bytearray()
    for n in range(messages):
        qos = n & 1
        stream += encode(
            Publish(TOPICS[n % 10], PAYLOAD, qos=qos, packet_id=(n % 65535) + 1 if qos else None),
            4,
        )
    connect = encode(Connect("bench", keep_alive=0), 4)
    chunk = 64 * 1024

    def run() -> int:
        connection = ServerConnection(ConnectionLimits())
        connection.receive_data(connect)
        connection.next_event()
        count = 0
        for start in range(0, len(stream), chunk):
            connection.receive_data(bytes(stream[start : start + chunk]))
            while connection.next_event() is not NEED_DATA:
                count += 1
        return count

    return run


def _encode(messages: int) -> Callable[[], int]:
    def run() -> int:
        for n in range(messages):
            qos = n & 1
            encode_publish(
                TOPICS[n % 100],
                PAYLOAD,
                qos=qos,
                retain=False,
                dup=False,
                packet_id=(n % 65535) + 1 if qos else None,
                properties=NO_PROPERTIES,
                protocol_level=4,
            )
        return messages

    return run


def _match(messages: int) -> Callable[[], int]:
    """1,022 subscriptions: ten clients on each of the 100 topics, and wildcard filters."""
    trie: SubscriptionTrie[str, int] = SubscriptionTrie()
    for n, topic in enumerate(TOPICS):
        trie.add(topic, f"client{n}", 0)
    for site in range(10):
        trie.add(f"bench/site{site}/+", f"site{site}", 1)
        trie.add(f"bench/site{site}/#", f"all{site}", 1)
    trie.add("bench/+/sensor7", "sevens", 1)
    trie.add("#", "everything", 0)

    def run() -> int:
        found = 0
        match = trie.match
        for n in range(messages):
            found += len(match(TOPICS[n % 1000]))
        return messages

    return run


def _record(messages: int) -> Callable[[], int]:
    batch = [Message(PAYLOAD, producer="bench", publish_time=n, qos=n & 1) for n in range(64)]

    def run() -> int:
        for first in range(0, messages, RECORD_BATCH):
            frame_messages(1, first, 1_000, batch)
        return messages

    return run


def _pulsar(messages: int) -> Callable[[], int]:
    """A producer's stream of SEND frames read back, and a MESSAGE frame for each."""
    stream = bytearray()
    for n in range(messages):
        metadata = MessageMetadata(producer_name="bench", sequence_id=n, publish_time=1_000)
        payload = make_payload(metadata, PAYLOAD)
        stream += encode_command(Send(producer_id=1, sequence_id=n, payload=payload))
    chunk = 64 * 1024

    def run() -> int:
        decoder = FrameDecoder()
        count = 0
        for start in range(0, len(stream), chunk):
            decoder.feed(bytes(stream[start : start + chunk]))
            while (frame := decoder.next_frame()) is not NEED_FRAME:
                assert isinstance(frame, Send) and frame.payload is not None
                encode_message_frame(1, 7, count, frame.payload.raw, frame.payload.checksum)
                count += 1
        return count

    return run


# The nodes and clients of the node parts, closed when main() ends.
_OPEN = contextlib.ExitStack()


def _client(port: int, client_id: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(encode(Connect(client_id), 4))
    _read_exactly(sock, 4)  # CONNACK
    return sock


def _read_exactly(sock: socket.socket, size: int) -> None:
    while size > 0:
        data = sock.recv(min(size, 1 << 20))
        if not data:
            raise SystemExit("the node closed the connection")
        size -= len(data)


def _node(qos: int, window: int) -> Callable[[int], Callable[[], int]]:
    """A merged node in this process (fsync never, MQTT 3.1.1): a publisher sends PUBLISH
    packets at `qos`, `window` at a time, to a subscriber (QoS 0) over loopback; each window is
    read back whole before the next, so nothing is ever dropped. The clients are raw sockets
    with the packets encoded beforehand: the work measured is the node's (and the kernel's)."""

    def part(messages: int) -> Callable[[], int]:
        stack = _OPEN.enter_context(contextlib.ExitStack())
        settings = node_settings(storage=StorageSettings(fsync="never"))
        node = stack.enter_context(running_node(settings))
        subscriber = stack.enter_context(_client(node.mqtt_port, f"sub{qos}"))
        topic = f"bench/node/{qos}"
        subscribe = Subscribe(1, (SubscriptionRequest(topic, qos=0),))
        subscriber.sendall(encode(subscribe, 4))
        _read_exactly(subscriber, 5)  # SUBACK
        publisher = stack.enter_context(_client(node.mqtt_port, f"pub{qos}"))
        chunk = b"".join(
            encode(Publish(topic, PAYLOAD, qos=qos, packet_id=n + 1 if qos else None), 4)
            for n in range(window)
        )
        delivered = window * len(encode(Publish(topic, PAYLOAD), 4))
        acks = window * 4 if qos else 0

        rounds = max(1, messages // window)

        def run() -> int:
            for _ in range(rounds):
                publisher.sendall(chunk)
                _read_exactly(subscriber, delivered)
                _read_exactly(publisher, acks)
            return rounds * window

        return run

    return part


PARTS: dict[str, Callable[[int], Callable[[], int]]] = {
    "decode": _decode,
    "encode": _encode,
    "match": _match,
    "record": _record,
    "pulsar": _pulsar,
    "node0": _node(0, 100),
    "node1": _node(1, 32),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    args = parser.parse_args()
    compiled = compiled_modules()
    print(f"compiled modules: {', '.join(compiled) if compiled else 'none (pure Python)'}")
    with _OPEN:
        for name in args.only.split(","):
            run = PARTS[name](args.messages)
            best = float("inf")
            for _ in range(args.repeat):
                started = time.perf_counter_ns()
                done = run()
                best = min(best, (time.perf_counter_ns() - started) / done)
            print(f"{name:>8}: {best:8.0f} ns per message", flush=True)


if __name__ == "__main__":
    main()
