"""Authentication and authorization of MQTT clients, end to end with paho-mqtt, raw packets
and the mosquitto clients: password files, JWTs (with ACL claims), client certificates,
mosquitto ACL files, reloads, bans and hostile credentials."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest

from mop.protocols.mqtt.packets import Auth, Connack, Pingreq, Pingresp, Properties, Publish
from mop.security.passwords import update_password_file
from mop.settings import AuthSettings, FlappingSettings, JwtSettings, TlsSettings
from mop.testing.certs import CLIENT_COMMON_NAME, make_test_certificates
from mop.testing.node import RunningNode, node_settings
from tests.e2e.clients import Client
from tests.e2e.conftest import Topology
from tests.e2e.raw import RawClient, closed_with

pytestmark = [pytest.mark.e2e, pytest.mark.both_modes]

# A publish accepted (0x10: none subscribes, which a separated proxy does not tell).
ACCEPTED = (0, 0x10)
SECRET = "a shared secret of thirty-two bytes!"
ACL = """\
# Anonymous clients (none connect here: anonymous is off)
topic read public/#

user alice
topic readwrite alice/#
topic read shared/#
topic deny shared/secret
topic write inbox/bob

user bob
topic read inbox/bob
topic read $SYS/#
topic write $SYS/broker/connection/#

pattern readwrite own/%u/#
pattern write clients/%c
"""


def write_passwords(path: Path, users: dict[str, str]) -> Path:
    text = ""
    for user, password in users.items():
        text = update_password_file(text, user, password.encode())
    path.write_text(text)
    return path


@pytest.fixture
def secured(tmp_path: Path, topology: Topology) -> Iterator[RunningNode]:
    """A node with a password file (alice, bob), JWTs and the ACL above; anonymous off."""
    settings = dataclasses.replace(
        node_settings(),
        auth=AuthSettings(
            allow_anonymous=False,
            password_file=str(
                write_passwords(tmp_path / "passwords", {"alice": "a1", "bob": "b2"})
            ),
            acl_file=str(_write(tmp_path / "acl", ACL)),
            jwt=JwtSettings(secret=SECRET),
            reload_interval=0.2,
            # The tests try wrong passwords on purpose, all from 127.0.0.1.
            max_failures=0,
        ),
    )
    with topology.running_node(settings) as node:
        yield node


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def token(sub: str, **claims: object) -> str:
    claims.setdefault("exp", int(time.time()) + 300)
    return jwt.encode({"sub": sub, **claims}, SECRET, algorithm="HS256")


def port_of(node: RunningNode) -> int:
    return node.mqtt_port


# -- authentication ----------------------------------------------------------------------------


def test_password_file_users_connect_and_wrong_passwords_are_refused(secured: RunningNode) -> None:
    port = port_of(secured)
    assert Client(port, "a", username="alice", password="a1").connack.reason_code == 0  # type: ignore[union-attr]
    wrong = Client(port, "w", username="alice", password="nope", connect=False)
    assert wrong.connect().reason_code == 0x86
    unknown = Client(port, "u", username="mallory", password="a1", connect=False)
    assert unknown.connect().reason_code == 0x86
    nobody = Client(port, "n", connect=False)
    assert nobody.connect().reason_code == 0x87


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"username": "alice", "password": b"nope"}, 4),  # bad user name or password
        ({}, 5),  # not authorized: no credentials, anonymous off
        ({"username": "alice", "password": b"a1"}, 0),
    ],
)
def test_mqtt311_connack_return_codes(
    secured: RunningNode, fields: dict[str, object], code: int
) -> None:
    raw = RawClient(port_of(secured), level=4)
    try:
        connack = raw.connect("raw-311", **fields)
        assert isinstance(connack, Connack)
        assert connack.reason_code == code
    finally:
        raw.close()


def test_a_jwt_is_taken_as_the_password(secured: RunningNode) -> None:
    port = port_of(secured)
    good = Client(port, "j1", username="anything", password=token("alice"), connect=False)
    assert good.connect().reason_code == 0
    # The token's subject is the user the ACL names: alice may write alice/#.
    assert good.publish("alice/x", b"1", qos=1) in ACCEPTED
    expired = Client(port, "j2", username="alice", password=token("alice", exp=1), connect=False)
    assert expired.connect().reason_code == 0x86
    forged = jwt.encode(
        {"sub": "alice"}, "another secret, also long enough for HS256", algorithm="HS256"
    )
    assert (
        Client(port, "j3", username="x", password=forged, connect=False).connect().reason_code
        == 0x86
    )


def test_acl_claims_of_a_token_apply(secured: RunningNode) -> None:
    port = port_of(secured)
    claim = [
        {"permission": "allow", "action": "publish", "topic": "claims/out"},
        {"permission": "allow", "action": "subscribe", "topic": "claims/in/#"},
    ]
    client = Client(port, "c1", username="carol", password=token("carol", acl=claim), connect=False)
    assert client.connect().reason_code == 0
    assert client.subscribe("claims/in/#", 1) == [1]
    assert client.subscribe("alice/#", 1) == [0x87]
    assert client.publish("claims/out", b"x", qos=1) in ACCEPTED
    assert client.publish("claims/in/x", b"x", qos=1) == 0x87


def test_mosquitto_clients_with_a_password_file(secured: RunningNode) -> None:
    if shutil.which("mosquitto_pub") is None:
        pytest.skip("mosquitto_pub is not installed")
    port = str(port_of(secured))
    base = ["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "-t", "alice/m", "-m", "hi", "-q", "1"]
    ok = subprocess.run([*base, "-u", "alice", "-P", "a1"], capture_output=True, timeout=20)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*base, "-u", "alice", "-P", "wrong"], capture_output=True, timeout=20)
    assert bad.returncode != 0
    assert b"not authori" in bad.stderr.lower() or b"bad user" in bad.stderr.lower()


def test_jwt_enhanced_authentication_and_reauthentication(secured: RunningNode) -> None:
    port = port_of(secured)
    raw = RawClient(port, level=5)
    connack = raw.connect(
        "enhanced",
        properties=Properties(
            authentication_method="JWT",
            authentication_data=token("alice", exp=time.time() + 2).encode(),
        ),
    )
    assert connack.reason_code == 0
    assert connack.properties.authentication_method == "JWT"
    raw.send(
        Auth(
            0x19,
            Properties(authentication_method="JWT", authentication_data=token("alice").encode()),
        )
    )
    answer = raw.recv()
    assert isinstance(answer, Auth) and answer.reason_code == 0
    time.sleep(3)  # past the first token's expiry: the fresh one holds
    raw.send(Pingreq())
    assert isinstance(raw.recv(), Pingresp)
    # Re-authenticating as somebody else ends the connection.
    raw.send(
        Auth(
            0x19, Properties(authentication_method="JWT", authentication_data=token("bob").encode())
        )
    )
    closed_with(raw, 0x87)


def test_a_connection_ends_when_its_token_expires(secured: RunningNode) -> None:
    raw = RawClient(port_of(secured), level=5)
    short = token("alice", exp=time.time() + 2)
    assert raw.connect("short-lived", username="alice", password=short.encode()).reason_code == 0
    closed_with(raw, 0x87, timeout=10)


def test_an_unknown_authentication_method_is_refused(secured: RunningNode) -> None:
    raw = RawClient(port_of(secured), level=5)
    connack = raw.connect(
        "scram",
        properties=Properties(authentication_method="SCRAM-SHA-1", authentication_data=b"n,,"),
    )
    assert connack.reason_code == 0x8C


# -- authorization -----------------------------------------------------------------------------


def test_publish_and_subscribe_follow_the_acl(secured: RunningNode) -> None:
    port = port_of(secured)
    alice = Client(port, "alice-1", username="alice", password="a1")
    bob = Client(port, "bob-1", username="bob", password="b2")
    assert bob.subscribe("inbox/bob", 1) == [1]
    assert bob.subscribe("alice/#", 1) == [0x87]
    assert alice.publish("inbox/bob", b"hello", qos=1) == 0
    [message] = bob.expect(1)
    assert message.payload == b"hello"
    # bob may read his inbox but not write to it.
    assert bob.publish("inbox/bob", b"me", qos=1) == 0x87
    bob.expect_none(0.3)
    # Patterns: %u and %c.
    assert alice.publish("own/alice/x", b"1", qos=1) in ACCEPTED
    assert alice.publish("own/bob/x", b"1", qos=1) == 0x87
    assert alice.publish("clients/alice-1", b"1", qos=1) in ACCEPTED
    assert alice.publish("clients/other", b"1", qos=1) == 0x87


def test_a_subscription_delivers_only_the_topics_the_client_may_read(secured: RunningNode) -> None:
    port = port_of(secured)
    alice = Client(port, "alice-2", username="alice", password="a1")
    writer = Client(
        port,
        "writer",
        username="writer",
        password=token("writer", acl={"pub": ["shared/#"]}),
        connect=False,
    )
    assert writer.connect().reason_code == 0
    assert alice.subscribe("shared/#", 1) == [1]
    assert writer.publish("shared/secret", b"hidden", qos=1) == 0
    assert writer.publish("shared/open", b"visible", qos=1) == 0
    [message] = alice.expect(1)
    assert (message.topic, message.payload) == ("shared/open", b"visible")
    alice.expect_none(0.3)


def test_no_spelling_of_a_topic_escapes_its_rules(secured: RunningNode) -> None:
    port = port_of(secured)
    alice = Client(port, "alice-7", username="alice", password="a1")
    bob = Client(port, "bob-7", username="bob", password="b2")
    assert bob.subscribe("inbox/bob", 1) == [1]
    # alice may write inbox/bob, not inbox/carol, however she spells it.
    namespace = f"persistent://public/{secured.node.settings.default_namespace}"
    assert alice.publish(f"{namespace}/inbox%2Fcarol", b"x", qos=1) == 0x87
    assert alice.publish(f"{namespace}/inbox%2Fbob", b"via full name", qos=1) == 0
    [message] = bob.expect(1)
    assert message.payload == b"via full name"
    # $SYS and the node's own tables are nobody's to write or read, by any name.
    assert (
        alice.publish("persistent://public/default/%24SYS%2Fbroker%2Fversion", b"x", qos=1) == 0x87
    )
    assert alice.subscribe("persistent://public/__mop/default%2Ftable%2Fretained", 1) == [0x87]
    will = Client(
        port,
        "w2",
        username="alice",
        password="a1",
        will=("$SYS/broker/version", b"x", 0, True),
        connect=False,
    )
    assert will.connect().reason_code == 0x87


def test_sys_topics_only_where_granted(secured: RunningNode) -> None:
    port = port_of(secured)
    alice = Client(port, "alice-3", username="alice", password="a1")
    bob = Client(port, "bob-3", username="bob", password="b2")
    assert alice.subscribe("$SYS/#", 0) == [0x87]
    assert bob.subscribe("$SYS/#", 0) == [0]


def test_mqtt311_denials_answer_as_mosquitto_does(secured: RunningNode) -> None:
    port = port_of(secured)
    bob = Client(port, "bob-4", username="bob", password="b2", version=4)
    spy = Client(port, "alice-4", username="alice", password="a1", version=4)
    assert spy.subscribe("alice/#", 1) == [1]
    assert bob.subscribe("alice/#", 1) == [0x80]
    # A denied QoS 1 publish is acknowledged (3.1.1 acks carry no error) and dropped.
    bob.publish("alice/x", b"nope", qos=1)
    spy.expect_none(0.3)


def test_a_denied_will_topic_refuses_the_connect(secured: RunningNode) -> None:
    port = port_of(secured)
    client = Client(
        port,
        "w1",
        username="bob",
        password="b2",
        will=("alice/will", b"x", 0, False),
        connect=False,
    )
    assert client.connect().reason_code == 0x87


def test_a_bridge_state_is_taken_only_where_the_acl_allows_writing_it(
    secured: RunningNode,
) -> None:
    """Mosquitto bridges' state messages are dropped, but only after the ACL check that
    every publish and will gets (as mosquitto, whose bridge users need the grant)."""
    port = port_of(secured)
    state = "$SYS/broker/connection/edge/state"
    bob = Client(port, "bob-5", username="bob", password="b2")
    alice = Client(port, "alice-5", username="alice", password="a1")
    assert bob.publish(state, b"1", qos=1) == 0
    assert alice.publish(state, b"1", qos=1) == 0x87
    raw = RawClient(port, level=4)  # 3.1.1 acks carry no error: the connection is closed
    try:
        assert raw.connect("alice-6", username="alice", password=b"a1").reason_code == 0
        raw.send(Publish(state, b"1", qos=1, packet_id=1))
        closed_with(raw, None)
    finally:
        raw.close()
    for user, password, code in (("bob", "b2", 0), ("alice", "a1", 0x87)):
        will = Client(
            port,
            f"{user}-will",
            username=user,
            password=password,
            will=(state, b"0", 1, True),
            connect=False,
        )
        assert will.connect().reason_code == code


def test_files_are_reloaded_and_a_broken_file_keeps_the_rules(
    secured: RunningNode, tmp_path: Path
) -> None:
    port = port_of(secured)
    acl = Path(secured.node.settings.auth.acl_file or "")
    bob = Client(port, "bob-5", username="bob", password="b2")
    assert bob.subscribe("news/#", 0) == [0x87]
    acl.write_text(ACL + "\nuser bob\ntopic read news/#\n")
    assert _eventually(lambda: bob.subscribe("news/#", 0) == [0])
    acl.write_text("topic nonsense here\n")
    time.sleep(1.0)  # several reload intervals: the broken file is looked at and refused
    assert bob.subscribe("news/#", 0) == [0]
    # The files are one policy: with the ACL file fixed, a new password takes effect too.
    acl.write_text(ACL)
    passwords = Path(secured.node.settings.auth.password_file or "")
    write_passwords(passwords, {"alice": "a1", "bob": "new"})
    assert _eventually(
        lambda: (
            Client(port, "b6", username="bob", password="new", connect=False).connect().reason_code
            == 0
        )
    )


def _eventually(check: object, timeout: float = 10.0) -> bool:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


# -- client certificates -----------------------------------------------------------------------


def test_client_certificate_names_the_user(tmp_path: Path, topology: Topology) -> None:
    certs = make_test_certificates(tmp_path / "certs")
    settings = node_settings(
        tls_port=0,
        tls=TlsSettings(
            certfile=str(certs.server_cert),
            keyfile=str(certs.server_key),
            cafile=str(certs.ca_cert),
            require_client_cert=True,
        ),
    )
    acl = _write(tmp_path / "acl", f"user {CLIENT_COMMON_NAME}\ntopic readwrite certs/#\n")
    settings = dataclasses.replace(
        settings,
        auth=AuthSettings(allow_anonymous=False, acl_file=str(acl), providers=("certificate",)),
    )
    with topology.running_node(settings) as node:
        port = node.port("tls")
        tls = {
            "ca_certs": str(certs.ca_cert),
            "certfile": str(certs.client_cert),
            "keyfile": str(certs.client_key),
        }
        client = Client(port, "cert-1", tls=tls, connect=False)
        assert client.connect().reason_code == 0
        assert client.subscribe("certs/#", 1) == [1]
        assert client.subscribe("other/#", 1) == [0x87]
        assert client.publish("certs/a", b"x", qos=1) == 0
        [message] = client.expect(1)
        assert message.payload == b"x"


def test_credentials_over_websocket_and_tls(tmp_path: Path, topology: Topology) -> None:
    certs = make_test_certificates(tmp_path / "certs")
    settings = node_settings(
        ws_enabled=True,
        ws_port=0,
        wss_port=0,
        tls_port=0,
        tls=TlsSettings(certfile=str(certs.server_cert), keyfile=str(certs.server_key)),
    )
    passwords = write_passwords(tmp_path / "passwords", {"alice": "a1"})
    settings = dataclasses.replace(
        settings,
        auth=AuthSettings(allow_anonymous=False, password_file=str(passwords), max_failures=0),
    )
    with topology.running_node(settings) as node:
        for kind in ("wss", "tls"):
            port = node.port(kind)
            transport = "websockets" if kind == "wss" else "tcp"
            tls = {"ca_certs": str(certs.ca_cert)}
            good = Client(
                port,
                f"{kind}-ok",
                username="alice",
                password="a1",
                transport=transport,
                tls=tls,
                connect=False,
            )
            assert good.connect().reason_code == 0, kind
            bad = Client(
                port,
                f"{kind}-bad",
                username="alice",
                password="a2",
                transport=transport,
                tls=tls,
                connect=False,
            )
            assert bad.connect().reason_code == 0x86, kind
            anonymous = Client(port, f"{kind}-anon", transport=transport, tls=tls, connect=False)
            assert anonymous.connect().reason_code == 0x87, kind


# -- abuse -------------------------------------------------------------------------------------


def test_hostile_credentials_never_hurt_other_clients(secured: RunningNode) -> None:
    port = port_of(secured)
    alice = Client(port, "alice-6", username="alice", password="a1")
    assert alice.subscribe("alice/#", 1) == [1]
    none_token = (
        jwt.utils.base64url_encode(b'{"alg":"none","typ":"JWT"}').decode()
        + "."
        + jwt.utils.base64url_encode(b'{"sub":"alice"}').decode()
        + "."
    )
    hostile: list[dict[str, object]] = [
        {"username": "x" * 60000, "password": b"a1"},
        {"username": "alice", "password": b"\xff\xfe\x00" * 1000},
        {"username": "alice", "password": none_token.encode()},
        {"username": "alice", "password": b"a.b.c"},
        {"username": "alice", "password": b"e30." * 10000},
        {"username": "", "password": b""},
    ]
    for index, fields in enumerate(hostile):
        raw = RawClient(port, level=5)
        try:
            connack = raw.connect(f"hostile-{index}", **fields)
            assert isinstance(connack, Connack) and connack.reason_code >= 0x80, fields.keys()
        finally:
            raw.close()
    assert alice.publish("alice/still", b"fine", qos=1) == 0
    [message] = alice.expect(1)
    assert message.payload == b"fine"


def test_an_address_that_fails_too_often_is_refused_for_a_while(
    tmp_path: Path, topology: Topology
) -> None:
    settings = dataclasses.replace(
        node_settings(),
        auth=AuthSettings(
            allow_anonymous=False,
            password_file=str(write_passwords(tmp_path / "passwords", {"alice": "a1"})),
            max_failures=3,
            failure_window=60,
            failure_ban=60,
        ),
    )
    with topology.running_node(settings) as node:
        port = port_of(node)
        for attempt in range(3):
            client = Client(
                port, f"guess-{attempt}", username="alice", password="guess", connect=False
            )
            assert client.connect().reason_code == 0x86
        # Now even the right password is refused from this address.
        right = Client(port, "right", username="alice", password="a1", connect=False)
        assert right.connect().reason_code == 0x8A


def test_a_flapping_client_id_is_banned(tmp_path: Path, topology: Topology) -> None:
    settings = dataclasses.replace(
        node_settings(),
        auth=AuthSettings(
            flapping=FlappingSettings(enabled=True, max_count=3, window=60, ban_time=60)
        ),
    )
    with topology.running_node(settings) as node:
        port = port_of(node)
        codes = []
        for _ in range(4):
            client = Client(port, "flapper", connect=False)
            codes.append(client.connect().reason_code)
            client.client.disconnect()
            client.client.loop_stop()
        assert codes[:2] == [0, 0] and codes[-1] == 0x8A
        assert Client(port, "steady", connect=False).connect().reason_code == 0
