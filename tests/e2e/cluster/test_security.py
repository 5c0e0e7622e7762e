"""A separated deployment with security on: proxies authenticate their clients and reach the
brokers with a proxy role of their own; a client that dials a broker directly gets its own
rights and cannot pass for a proxy or speak for somebody else."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pulsar
import pytest

from mop.protocols.pulsar.commands import PROTOCOL_VERSION, Connect, Connected, Error
from mop.protocols.pulsar.errors import ServerError
from mop.protocols.pulsar.frames import FrameDecoder, NeedData, encode_command
from mop.security.passwords import update_password_file
from mop.topic_names import mqtt_to_pulsar
from tests.e2e.clients import Client
from tests.e2e.cluster.support import proxy_process
from tests.e2e.nodeproc import NodeProcess, broker_process

pytestmark = pytest.mark.e2e

SECRET = "the brokers' and proxies' shared secret, 32+ bytes"


def token(sub: str) -> str:
    return jwt.encode({"sub": sub, "exp": int(time.time()) + 600}, SECRET, algorithm="HS256")


@pytest.fixture
def secured_broker(tmp_path: Path) -> Iterator[NodeProcess]:
    """A broker that admits tokens only, lets the role "proxy" act for clients, and gives
    "bob" read access to bob/# alone."""
    acl = tmp_path / "broker.acl"
    acl.write_text("user bob\ntopic read bob/#\n")
    broker = broker_process(
        tmp_path / "broker",
        MOP_AUTH__ALLOW_ANONYMOUS="false",
        MOP_AUTH__JWT__SECRET=SECRET,
        MOP_AUTH__PROXY_ROLES='["proxy"]',
        MOP_AUTH__ACL_FILE=str(acl),
    )
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


def test_a_proxy_with_its_role_serves_its_authenticated_clients(
    secured_broker: NodeProcess, tmp_path: Path
) -> None:
    passwords = tmp_path / "passwords"
    passwords.write_text(update_password_file("", "alice", b"a1"))
    proxy = proxy_process(
        tmp_path / "proxy",
        secured_broker.service_url,
        MOP_CLUSTER__AUTH__METHOD="token",
        MOP_CLUSTER__AUTH__TOKEN=token("proxy"),
        MOP_AUTH__ALLOW_ANONYMOUS="false",
        MOP_AUTH__PASSWORD_FILE=str(passwords),
    )
    try:
        port = proxy.start()
        alice = Client(port, "alice-p", username="alice", password="a1")
        assert alice.subscribe("team/+", 1) == [1]
        assert alice.publish("team/news", b"through the proxy", qos=1) == 0
        [message] = alice.expect(1)
        assert message.payload == b"through the proxy"
        refused = Client(port, "nobody", connect=False)
        assert refused.connect().reason_code == 0x87
    finally:
        proxy.close()


def test_a_proxy_without_credentials_cannot_start(
    secured_broker: NodeProcess, tmp_path: Path
) -> None:
    proxy = proxy_process(tmp_path / "proxy", secured_broker.service_url)
    try:
        with pytest.raises(AssertionError, match="no line matching"):
            proxy.start(timeout=30)
        assert proxy.process is not None
        assert proxy.process.wait(timeout=10) == 1
        assert "authenticat" in proxy.log().lower()
    finally:
        proxy.close()


def test_a_client_dialing_the_broker_gets_only_its_own_rights(
    secured_broker: NodeProcess,
) -> None:
    client = pulsar.Client(
        secured_broker.service_url,
        authentication=pulsar.AuthenticationToken(token("bob")),
        operation_timeout_seconds=10,
    )
    try:
        consumer = client.subscribe(mqtt_to_pulsar("bob/inbox"), "bob-sub")
        consumer.close()
        with pytest.raises(pulsar.AuthorizationError):
            client.create_producer(mqtt_to_pulsar("team/news"))
    finally:
        client.close()


def _connect(port: int, **fields: object) -> object:
    """CONNECT over a raw socket; the broker's answer (Connected or Error)."""
    decoder = FrameDecoder()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            encode_command(
                Connect(client_version="raw", protocol_version=PROTOCOL_VERSION, **fields)  # type: ignore[arg-type]
            )
        )
        while True:
            frame = decoder.next_frame()
            if not isinstance(frame, NeedData):
                return frame
            data = sock.recv(65536)
            assert data, "closed without an answer"
            decoder.feed(data)


def test_only_proxy_roles_may_speak_for_another_principal(secured_broker: NodeProcess) -> None:
    port = secured_broker.port
    as_bob = _connect(
        port, auth_method_name="token", auth_data=token("bob").encode(), original_principal="proxy"
    )
    assert isinstance(as_bob, Error) and as_bob.error is ServerError.AuthenticationError
    as_proxy = _connect(
        port, auth_method_name="token", auth_data=token("proxy").encode(), original_principal="bob"
    )
    assert isinstance(as_proxy, Connected)
    nothing = _connect(port)
    assert isinstance(nothing, Error) and nothing.error is ServerError.AuthenticationError


def test_a_proxy_answers_the_brokers_token_refresh_from_its_token_file(tmp_path: Path) -> None:
    broker = broker_process(
        tmp_path / "broker",
        MOP_AUTH__ALLOW_ANONYMOUS="false",
        MOP_AUTH__JWT__SECRET=SECRET,
        MOP_AUTH__PROXY_ROLES='["proxy"]',
        MOP_PULSAR__AUTH_REFRESH_INTERVAL="1",
    )
    token_file = tmp_path / "proxy.token"
    short = jwt.encode({"sub": "proxy", "exp": int(time.time()) + 3}, SECRET, algorithm="HS256")
    token_file.write_text(short)
    proxy = proxy_process(
        tmp_path / "proxy",
        "",
        MOP_CLUSTER__AUTH__METHOD="token",
        MOP_CLUSTER__AUTH__TOKEN_FILE=str(token_file),
    )
    try:
        broker.start()
        port = proxy.start(MOP_CLUSTER__SERVICE_URL=broker.service_url)
        sub = Client(port, "refresh-sub")
        assert sub.subscribe("refresh/+", 1) == [1]
        token_file.write_text(token("proxy"))  # the operator's fresh token
        time.sleep(5)  # past the first token's expiry: the brokers have challenged the proxy
        assert Client(port, "refresh-pub").publish("refresh/a", b"still here", qos=1) == 0
        [message] = sub.expect(1)
        assert message.payload == b"still here"
        # Nothing was refused: links that cannot answer a challenge (the topic lister's) are
        # closed and come back with the file's current token.
        assert not broker.find(re.compile(r"authentication refused"))
    finally:
        proxy.close()
        broker.close()
