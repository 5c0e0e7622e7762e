"""Client-id takeover storms through two separated proxies (`mop run` processes) in front of one
broker: many connections for few client ids, alternating proxies, none ever closed by the
client. MQTT-3.1.4-2: the server closes the existing connection of a client id that connects
again, so once the storm is over each id must have exactly one live connection (the last one
it opened), with its persistent session intact; also when a proxy is killed in the middle."""

from __future__ import annotations

import errno
import socket
import threading
import time
from dataclasses import dataclass, field

from mop.protocols.mqtt.packets import (
    Connack,
    Connect,
    Pingreq,
    Pingresp,
    Puback,
    Publish,
    Suback,
    Subscribe,
    SubscriptionRequest,
)
from tests.e2e.nodeproc import NodeProcess
from tests.e2e.raw import RawClient

IDS = 20
WORKERS_PER_ID = 2  # two connects of one id race each other (across proxies)
STORM_SECONDS = 6.0
CONNECTS_PER_WORKER = 60  # bounds the storm in count as well as in time
SETTLE_SECONDS = 20.0  # the old connections of every id closed within this


@dataclass
class Storm:
    """What the storm's workers did, by client id: every connection that got a CONNACK (in
    the order the CONNACKs came), and the connects the proxies refused or dropped."""

    ports: list[int]
    prefix: str
    opened: dict[str, list[RawClient]] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client_id(self, index: int) -> str:
        return f"{self.prefix}-{index}"


def test_a_takeover_storm_leaves_one_live_connection_per_client_id(
    proxy_processes: list[NodeProcess], prefix: str
) -> None:
    storm = Storm([proxy.port for proxy in proxy_processes], prefix)
    with_sessions(storm)
    run_storm(storm, deadline=time.monotonic() + STORM_SECONDS)
    survivors = settle(storm)
    sessions_intact(storm, survivors)
    logs = "\n".join(proxy.log() for proxy in proxy_processes)
    assert "Traceback" not in logs, logs[-4000:]


def test_a_takeover_storm_survives_a_proxy_killed_in_the_middle(
    proxy_processes: list[NodeProcess], prefix: str
) -> None:
    storm = Storm([proxy.port for proxy in proxy_processes], prefix)
    with_sessions(storm)
    start = time.monotonic()
    killer = threading.Timer(STORM_SECONDS / 3, proxy_processes[1].kill)
    killer.start()
    try:
        run_storm(storm, deadline=start + STORM_SECONDS)
    finally:
        killer.cancel()
        killer.join()
    assert not proxy_processes[1].running
    survivors = settle(storm)
    assert all(
        client.sock.getpeername()[1] == proxy_processes[0].port for client in survivors.values()
    )
    sessions_intact(storm, survivors)
    assert "Traceback" not in proxy_processes[0].log(), proxy_processes[0].log()[-4000:]


# -- the storm ---------------------------------------------------------------------------------


def with_sessions(storm: Storm) -> None:
    """Each client id gets a persistent session with one QoS 1 subscription of its own."""
    for index in range(IDS):
        client = RawClient(storm.ports[index % 2], level=4)
        connack = client.connect(storm.client_id(index), clean_start=False, keep_alive=60)
        assert connack.reason_code == 0, connack
        client.send(Subscribe(1, (SubscriptionRequest(f"{storm.prefix}/{index}", 1),)))
        suback = client.recv()
        assert isinstance(suback, Suback) and suback.reason_codes == (1,), suback
        client.close()


def run_storm(storm: Storm, *, deadline: float) -> None:
    workers = [
        threading.Thread(target=storm_worker, args=(storm, index % IDS, index, deadline))
        for index in range(IDS * WORKERS_PER_ID)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=STORM_SECONDS + 30)
        assert not worker.is_alive(), "a storm worker is stuck"
    connected = sum(len(clients) for clients in storm.opened.values())
    assert connected >= IDS * WORKERS_PER_ID * 3, f"only {connected} connects got through"


def storm_worker(storm: Storm, index: int, worker: int, deadline: float) -> None:
    client_id = storm.client_id(index)
    for attempt in range(CONNECTS_PER_WORKER):
        if time.monotonic() >= deadline:
            return
        port = storm.ports[(worker + attempt) % len(storm.ports)]
        try:
            client = RawClient(port, level=4)
        except OSError:
            storm.refused.append(f"{client_id}: proxy on {port} unreachable")
            continue  # a killed proxy: the next attempt goes to the other one
        try:
            packet = connack_of(client, client_id)
        except (AssertionError, OSError) as exc:
            client.close()
            storm.refused.append(f"{client_id}: {exc}")
            continue
        if packet is None or packet.reason_code != 0:
            client.close()
            storm.refused.append(f"{client_id}: {packet}")
            continue
        with storm.lock:
            storm.opened.setdefault(client_id, []).append(client)


def connack_of(client: RawClient, client_id: str) -> Connack | None:
    client.send(Connect(client_id, protocol_level=4, clean_start=False, keep_alive=60))
    packet = client.recv(timeout=15)
    assert packet is None or isinstance(packet, Connack), packet
    return packet


# -- after the storm ---------------------------------------------------------------------------


def settle(storm: Storm) -> dict[str, RawClient]:
    """Wait until every client id has exactly one open connection, and that one answers a
    PINGREQ; the survivor of each id."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        live = {
            client_id: [c for c in clients if is_open(c)]
            for client_id, clients in storm.opened.items()
        }
        counts = {client_id: len(clients) for client_id, clients in live.items()}
        if len(live) == IDS and all(count == 1 for count in counts.values()):
            break
        assert time.monotonic() < deadline, f"live connections per client id: {counts}"
        time.sleep(0.2)
    survivors = {client_id: clients[0] for client_id, clients in live.items()}
    for clients in storm.opened.values():
        for client in clients:
            if client not in survivors.values():
                client.close()
    for client_id, client in survivors.items():
        client.send(Pingreq())
        assert isinstance(client.recv(timeout=10), Pingresp), client_id
    return survivors


def is_open(client: RawClient) -> bool:
    """Whether the server still holds the connection (no end of stream, no reset)."""
    if client.eof:
        return False
    client.sock.settimeout(0)  # `recv` sets its own again
    try:
        data = client.sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:  # nothing to read
        return True
    except OSError as exc:
        if exc.errno in (errno.ECONNRESET, errno.EPIPE):
            client.eof = True
            return False
        raise
    if not data:
        client.eof = True
        return False
    return True  # something to read (a PUBLISH of its session): still open


def sessions_intact(storm: Storm, survivors: dict[str, RawClient]) -> None:
    """Each id's subscription survived the storm: a QoS 1 message on its topic reaches the
    surviving connection."""
    publisher = RawClient(storm.ports[0], level=4)
    assert publisher.connect(f"{storm.prefix}-publisher").reason_code == 0
    for index in range(IDS):
        publisher.send(
            Publish(f"{storm.prefix}/{index}", f"to {index}".encode(), qos=1, packet_id=index + 1)
        )
        puback = publisher.recv()
        assert isinstance(puback, Puback) and puback.packet_id == index + 1, puback
    for index in range(IDS):
        packet = survivors[storm.client_id(index)].recv(timeout=10)
        assert isinstance(packet, Publish) and packet.payload == f"to {index}".encode(), (
            index,
            packet,
        )
    publisher.close()
