"""`mop ban add|list|remove` against a running merged node, as an operator runs it: a real
node process, the command in processes of its own, and two ways to check what the node holds
that do not go through the command: the reference pulsar-client reading the table's topic,
and the node's table read from its storage once it has stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
import trio

from mop.backends.cluster.backend import open_cluster_backend
from mop.backends.local import open_local_backend
from mop.broker.storage import open_durable_storage
from mop.security.abuse import BANS_TABLE, Ban, decode_ban
from mop.security.ban_store import EXPIRY_INTERVAL, BanStore
from mop.settings import StorageSettings
from mop.topic_names import table_topic
from tests.e2e.clients import Client
from tests.e2e.nodeproc import PULSAR_LISTENING, NodeProcess, broker_process, node_environ

pytestmark = pytest.mark.e2e

COMMAND_TIMEOUT = 30.0
DEADLINE = 10.0
POLL = 0.02
TIMEOUT_MS = 5000
TOPIC = table_topic("public", "default", BANS_TABLE)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    """A merged node serving MQTT and Pulsar; its port is the Pulsar one."""
    process = NodeProcess(
        tmp_path / "data", listening=PULSAR_LISTENING, MOP_PROTOCOLS='["mqtt", "pulsar"]'
    )
    process.start()
    try:
        yield process
    finally:
        process.close()


def mop_ban(node: NodeProcess, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """`mop ban ARGS` in a process of its own, pointed at `node` by --service-url unless
    `environ` says otherwise."""
    if "MOP_PULSAR__PORT" not in environ:
        args = (*args, "--service-url", f"pulsar://127.0.0.1:{node.port}")
    return subprocess.run(
        [sys.executable, "-m", "mop", "ban", *args],
        cwd=node.cwd,
        env=node_environ(node.data_dir, **environ),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )


def listed(node: NodeProcess) -> list[dict[str, Any]]:
    done = mop_ban(node, "list", "--json")
    assert done.returncode == 0, done.stderr
    entries: list[dict[str, Any]] = json.loads(done.stdout)
    return entries


def read_topic(node: NodeProcess) -> dict[str, Ban]:
    """The bans in the table's topic, read by the reference client (compacted: the latest
    value of every key)."""
    client = pulsar.Client(
        f"pulsar://127.0.0.1:{node.port}",
        operation_timeout_seconds=10,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    try:
        reader = client.create_reader(TOPIC, pulsar.MessageId.earliest, is_read_compacted=True)
        found: dict[str, Ban] = {}
        while reader.has_message_available():
            message = reader.read_next(timeout_millis=TIMEOUT_MS)
            key = message.partition_key()
            if message.properties().get("mop.tombstone") == "1":
                found.pop(key, None)
            elif not key.startswith("\x00"):  # a table reader's catch-up marker
                found[key] = decode_ban(key, message.data())
        return found
    finally:
        client.close()


def stored_table(data_dir: Path) -> dict[str, bytes]:
    """Table `BANS_TABLE` of a stopped node, read from its storage by a local backend."""

    async def read() -> dict[str, bytes]:
        storage = await open_durable_storage(data_dir / "broker", StorageSettings())
        async with open_local_backend(storage) as backend:
            return dict(backend.table(BANS_TABLE).items())

    return trio.run(read)


def test_bans_are_added_listed_and_removed_on_a_running_node(node: NodeProcess) -> None:
    before = time.time()
    done = mop_ban(node, "add", "--clientid", "bad-client", "--for", "3600", "--reason", "test")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("banned clientid bad-client until 20"), done.stdout
    done = mop_ban(node, "add", "--address", "::ffff:10.1.2.3/104")
    assert (done.returncode, done.stdout) == (0, "banned address 10.0.0.0/8 until removed\n")
    done = mop_ban(node, "add", "--username", "mallory", "--for", "0.5")
    assert done.returncode == 0, done.stderr

    time.sleep(0.6)  # the user name's ban is over: no longer listed
    entries = listed(node)
    assert [(e["kind"], e["value"], e["reason"]) for e in entries] == [
        ("clientid", "bad-client", "test"),
        ("address", "10.0.0.0/8", "manual"),
    ]
    client_ban, address_ban = entries
    assert before <= client_ban["created_at"] <= time.time()
    assert client_ban["until"] == pytest.approx(client_ban["created_at"] + 3600)
    assert address_ban["until"] is None

    # What the node holds, read without `mop ban`: the table's topic, by the reference client.
    in_topic = read_topic(node)
    assert in_topic["clientid:bad-client"] == Ban(**client_ban)
    assert in_topic["address:10.0.0.0/8"] == Ban(**address_ban)

    done = mop_ban(node, "remove", "--clientid", "bad-client")
    assert (done.returncode, done.stdout) == (0, "lifted the ban of clientid bad-client\n")
    done = mop_ban(node, "remove", "--clientid", "bad-client")
    assert done.returncode == 1
    assert done.stderr == "mop: error: no ban of clientid bad-client\n"
    # The default service URL comes from the settings: the node's Pulsar port.
    done = mop_ban(node, "list", MOP_PULSAR__PORT=str(node.port))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["KIND", "VALUE", "UNTIL", "REASON"]
    assert [line.split() for line in lines[1:]] == [["address", "10.0.0.0/8", "-", "manual"]]
    # The node removes the ban that is over from the table on its own (every EXPIRY_INTERVAL).
    deadline = time.monotonic() + EXPIRY_INTERVAL + 10
    while set(read_topic(node)) != {"address:10.0.0.0/8"}:
        assert time.monotonic() < deadline, read_topic(node)
        time.sleep(0.5)

    # The node's own table holds what the command wrote, across a restart of the node.
    assert node.stop() == 0
    table = stored_table(node.data_dir)
    assert list(table) == ["address:10.0.0.0/8"]
    assert decode_ban("address:10.0.0.0/8", table["address:10.0.0.0/8"]) == Ban(**address_ban)
    node.start()
    assert [entry["value"] for entry in listed(node)] == ["10.0.0.0/8"]


def test_bad_targets_are_usage_errors(node: NodeProcess) -> None:
    for args, message in [
        (("add", "--address", "10.0.0.0/33"), "prefix /33 is too long"),
        (("add", "--address", "example.com"), "neither an IP address nor a CIDR network"),
        (("add", "--clientid", ""), "must not be empty"),
        (("remove", "--username", "u" * 1025), "longer than 1024 characters"),
        (("add", "--clientid", "c", "--for", "-5"), "not a positive number of seconds"),
        (("add", "--clientid", "c", "--for", "inf"), "not a positive number of seconds"),
        (("add", "--clientid", "c", "--for", "1e10"), "more than 100 years"),
        (("add", "--clientid", "c", "--reason", "r" * 1025), "reason is too long"),
        (("add", "--clientid", "c", "--username", "u"), "not allowed with argument"),
        (("add",), "one of the arguments --clientid --username --address is required"),
    ]:
        done = mop_ban(node, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
    assert listed(node) == []


def test_a_deployment_that_does_not_answer_is_an_error(node: NodeProcess) -> None:
    node.stop()
    started = time.monotonic()
    done = mop_ban(node, "list", "--timeout", "1")
    assert done.returncode == 1
    assert done.stderr.startswith(f"mop: error: pulsar://127.0.0.1:{node.port}: ")
    assert done.stderr.count("\n") == 1
    assert time.monotonic() - started < COMMAND_TIMEOUT / 2


def test_the_proxies_of_a_separated_deployment_follow_the_bans(tmp_path: Path) -> None:
    broker = broker_process(tmp_path / "broker")
    broker.start()

    def is_banned(store: BanStore) -> bool:
        return store.match(client_id="bad", username=None, address="") is not None

    async def wait_for(store: BanStore, banned: bool) -> None:
        with trio.move_on_after(DEADLINE):
            for _ in range(int(DEADLINE / POLL) + 1):
                if is_banned(store) == banned:
                    break
                await trio.sleep(POLL)
        assert is_banned(store) == banned

    async def proxy() -> None:
        # A proxy's backend and its ban store, as a proxy node runs them.
        async with open_cluster_backend(broker.service_url, tables=[BANS_TABLE]) as backend:
            store = BanStore(backend.table(BANS_TABLE))
            done = await trio.to_thread.run_sync(mop_ban, broker, "add", "--clientid", "bad")
            assert done.returncode == 0, done.stderr
            await wait_for(store, banned=True)
            done = await trio.to_thread.run_sync(mop_ban, broker, "remove", "--clientid", "bad")
            assert done.returncode == 0, done.stderr
            await wait_for(store, banned=False)

    try:
        trio.run(proxy)
    finally:
        broker.close()


def test_a_new_ban_closes_the_connections_it_covers(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", MOP_PROTOCOLS='["mqtt", "pulsar"]')
    mqtt_port = node.start()
    try:
        # The Pulsar listener's line comes before or after the MQTT one.
        found = node.find(PULSAR_LISTENING) or [node.wait_for(PULSAR_LISTENING, DEADLINE)]
        pulsar_port = int(found[0]["port"])
        victim = Client(mqtt_port, "victim")
        bystander = Client(mqtt_port, "bystander")
        assert bystander.subscribe("still/+", 1) == [1]
        service_url = f"pulsar://127.0.0.1:{pulsar_port}"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "mop",
                "ban",
                "add",
                "--clientid",
                "victim",
                "--service-url",
                service_url,
            ],
            cwd=node.cwd,
            env=node_environ(node.data_dir),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        # MQTT 5 DISCONNECT 0x98, administrative action; the others go on.
        assert victim.disconnects.get(timeout=DEADLINE) == 0x98
        assert Client(mqtt_port, "victim", connect=False).connect().reason_code == 0x8A
        assert bystander.publish("still/here", b"yes", qos=1) == 0
        assert [m.payload for m in bystander.expect(1)] == [b"yes"]
    finally:
        node.close()
