"""Authentication and authorization of Pulsar clients, end to end with pulsar-client and raw
frames: tokens (refreshed when they expire), user names and passwords, TLS and client
certificates, proxies that speak for their clients, ACLs, and hostile credentials.

pulsar-client does not surface a refused CONNECT as an AuthenticationError: any answer to
CONNECT but CONNECTED closes its connection as a connect error, which it retries until the
operation times out (`pulsar.Timeout`), whatever the broker (Apache Pulsar's answer is the same
ERROR AuthenticationError, request id -1, as mop's; the raw tests check those bytes).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pulsar
import pytest

from mop.protocols.pulsar.commands import (
    AuthChallenge,
    AuthData,
    AuthResponse,
    Command,
    Connect,
    Connected,
    Error,
    FeatureFlags,
    GetOrCreateSchema,
    GetOrCreateSchemaResponse,
    GetSchema,
    GetSchemaResponse,
    GetTopicsOfNamespace,
    GetTopicsOfNamespaceResponse,
    Lookup,
    LookupResponse,
    LookupType,
    Producer,
    ProducerSuccess,
    Schema,
    SchemaType,
    Subscribe,
    SubType,
)
from mop.protocols.pulsar.connection import NO_REQUEST_ID
from mop.protocols.pulsar.errors import ServerError
from mop.security.passwords import update_password_file
from mop.settings import AuthSettings, JwtSettings, PulsarSettings, Settings, TlsSettings
from mop.testing.certs import CLIENT_COMMON_NAME, TestCertificates, make_test_certificates
from mop.testing.node import RunningNode
from mop.topic_names import mqtt_to_pulsar, table_topic
from tests.e2e.pulsar_support import (
    TIMEOUT_MS,
    RawPulsar,
    pulsar_node,
    pulsar_port,
    pulsar_settings,
    service_url,
)

pytestmark = pytest.mark.e2e

SECRET = "a shared secret of thirty-two bytes!"
# alice may write `inbox` but not read it, read `shared/...` but not write it; bob the reverse;
# client-1 (the test client certificate) has a topic of its own.
ACL = f"""\
user alice
topic readwrite alice/#
topic read shared/#
topic write inbox

user bob
topic readwrite bob/#
topic write shared/#
topic read inbox

user {CLIENT_COMMON_NAME}
topic readwrite certified/#

user root
topic readwrite #
"""
# A refused client retries until this many seconds have passed.
REFUSED_TIMEOUT = 1


def token(sub: str, *, lifetime: float = 300, secret: str = SECRET, **claims: Any) -> str:
    claims = {"sub": sub, "exp": int(time.time() + lifetime), **claims}
    return jwt.encode(claims, secret, algorithm="HS256")


def topic(mqtt_name: str) -> str:
    return mqtt_to_pulsar(mqtt_name)


def secured_settings(tmp_path: Path, **pulsar_options: Any) -> Settings:
    passwords = ""
    for user, password in {"alice": "a1", "bob": "b2"}.items():
        passwords = update_password_file(passwords, user, password.encode())
    (tmp_path / "passwords").write_text(passwords)
    (tmp_path / "acl").write_text(ACL)
    return dataclasses.replace(
        pulsar_settings(),
        pulsar=PulsarSettings(port=0, **pulsar_options),
        auth=AuthSettings(
            allow_anonymous=False,
            password_file=str(tmp_path / "passwords"),
            acl_file=str(tmp_path / "acl"),
            jwt=JwtSettings(secret=SECRET),
            proxy_roles=("proxy",),
            # pulsar-client retries a refused CONNECT several times a second: without this
            # the refused tests would soon have 127.0.0.1 refused altogether.
            max_failures=0,
        ),
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningNode]:
    with pulsar_node(secured_settings(tmp_path_factory.mktemp("secured"))) as node:
        yield node


def client_for(
    url: str, authentication: Any = None, timeout: int = 10, **options: Any
) -> pulsar.Client:
    if authentication is not None:
        options["authentication"] = authentication
    return pulsar.Client(
        url,
        operation_timeout_seconds=timeout,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        **options,
    )


class Clients:
    """pulsar-clients of one test, closed at its end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._open: list[pulsar.Client] = []

    def __call__(self, authentication: Any = None, **options: Any) -> pulsar.Client:
        client = client_for(self.url, authentication, **options)
        self._open.append(client)
        return client

    def close(self) -> None:
        for client in self._open:
            client.close()


@pytest.fixture
def clients(secured: RunningNode) -> Iterator[Clients]:
    opened = Clients(service_url(secured))
    try:
        yield opened
    finally:
        opened.close()


def connections(node: RunningNode) -> int:
    """Clients admitted so far."""
    return node.call(lambda: node.node.processor.stats.connections_total)


def refusals(node: RunningNode) -> int:
    """Credentials refused so far (at CONNECT or in answer to a challenge)."""
    return node.call(lambda: node.node.processor.gatekeeper.refused)


def round_trip(client: pulsar.Client, name: str, payload: bytes = b"hello") -> None:
    consumer = client.subscribe(name, "check")
    client.create_producer(name).send(payload)
    assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == payload


# -- authentication ----------------------------------------------------------------------------


def test_a_token_user_produces_and_consumes(clients: Clients) -> None:
    round_trip(clients(pulsar.AuthenticationToken(token("alice"))), topic("alice/token"))


def test_a_token_supplier_is_asked_for_the_token(clients: Clients) -> None:
    calls: list[float] = []

    def supplier() -> str:
        calls.append(time.time())
        return token("alice")

    round_trip(clients(pulsar.AuthenticationToken(supplier)), topic("alice/supplied"))
    assert calls


def test_basic_users_produce_and_consume(clients: Clients) -> None:
    round_trip(clients(pulsar.AuthenticationBasic("bob", "b2")), topic("bob/basic"))


@pytest.mark.parametrize(
    "authentication",
    [
        pytest.param(
            lambda: pulsar.AuthenticationToken(token("alice", secret="x" * 32)), id="wrong-key"
        ),
        pytest.param(
            lambda: pulsar.AuthenticationToken(token("alice", lifetime=-60)), id="expired"
        ),
        pytest.param(lambda: pulsar.AuthenticationToken("not.a.token"), id="garbage"),
        pytest.param(lambda: pulsar.AuthenticationBasic("alice", "b2"), id="wrong-password"),
        pytest.param(lambda: pulsar.AuthenticationBasic("mallory", "a1"), id="unknown-user"),
        pytest.param(lambda: None, id="anonymous"),
    ],
)
def test_refused_clients_time_out(
    secured: RunningNode, clients: Clients, authentication: Callable[[], Any]
) -> None:
    client = clients(authentication(), timeout=REFUSED_TIMEOUT)
    before = refusals(secured)
    started = time.monotonic()
    with pytest.raises(pulsar.Timeout):
        client.create_producer(topic("alice/refused"))
    assert time.monotonic() - started < REFUSED_TIMEOUT + 5
    assert refusals(secured) > before  # the node refused it (and not something else)


def connect_raw(port: int, **fields: Any) -> RawPulsar:
    raw = RawPulsar(port)
    fields.setdefault("protocol_version", 20)
    raw.send(Connect(client_version="raw-test", **fields))
    return raw


def refused(raw: RawPulsar) -> None:
    """The answer of a Pulsar broker to credentials it does not take: ERROR
    AuthenticationError for no request (-1), then the connection closes."""
    try:
        frames = raw.recv_until_closed()
    finally:
        raw.close()
    assert frames == [
        Error(
            request_id=NO_REQUEST_ID,
            error=ServerError.AuthenticationError,
            message="Unable to authenticate",
        )
    ]


def accepted(raw: RawPulsar) -> RawPulsar:
    answer = raw.recv()
    assert isinstance(answer, Connected), answer
    return raw


@pytest.mark.parametrize(
    "fields",
    [
        {"auth_method_name": "token", "auth_data": b"not.a.token"},
        {"auth_method_name": "basic", "auth_data": b"alice:wrong"},
        {"auth_method_name": "none"},
        {},
        {"auth_method_name": "sasl", "auth_data": b"x"},
        {"auth_method_name": "tls"},  # no client certificate on a plain connection
    ],
)
def test_refusal_on_the_wire(secured: RunningNode, fields: dict[str, Any]) -> None:
    refused(connect_raw(pulsar_port(secured), **fields))


def test_an_expired_token_is_refused_at_connect(secured: RunningNode) -> None:
    expired = token("alice", lifetime=-1).encode()
    refused(connect_raw(pulsar_port(secured), auth_method_name="token", auth_data=expired))


# -- proxies and original principals -----------------------------------------------------------


def ask(raw: RawPulsar, command: Command) -> object:
    raw.send(command)
    return raw.recv()


def producer_answer(raw: RawPulsar, mqtt_name: str, request_id: int) -> object:
    return ask(raw, Producer(topic=topic(mqtt_name), producer_id=request_id, request_id=request_id))


def as_token(sub: str, **fields: Any) -> dict[str, Any]:
    return {"auth_method_name": "token", "auth_data": token(sub).encode(), **fields}


def test_a_proxy_acts_with_the_rights_of_the_client_it_names(secured: RunningNode) -> None:
    raw = accepted(
        connect_raw(pulsar_port(secured), **as_token("proxy", original_principal="alice"))
    )
    try:
        assert isinstance(producer_answer(raw, "alice/proxied", 1), ProducerSuccess)
        denied = producer_answer(raw, "bob/proxied", 2)
        assert isinstance(denied, Error)
        assert (denied.request_id, denied.error) == (2, ServerError.AuthorizationError)
    finally:
        raw.close()


def test_a_proxy_without_an_original_principal_has_every_right(secured: RunningNode) -> None:
    raw = accepted(connect_raw(pulsar_port(secured), **as_token("proxy")))
    try:
        assert isinstance(producer_answer(raw, "alice/by-proxy", 1), ProducerSuccess)
        assert isinstance(producer_answer(raw, "bob/by-proxy", 2), ProducerSuccess)
    finally:
        raw.close()


def test_only_proxies_may_name_an_original_principal(secured: RunningNode) -> None:
    refused(connect_raw(pulsar_port(secured), **as_token("bob", original_principal="alice")))
    basic = {"auth_method_name": "basic", "auth_data": b"bob:b2", "original_principal": "alice"}
    refused(connect_raw(pulsar_port(secured), **basic))


# -- authorization -----------------------------------------------------------------------------


def test_producing_needs_write_access(clients: Clients) -> None:
    alice = clients(pulsar.AuthenticationToken(token("alice")))
    with pytest.raises(pulsar.AuthorizationError):
        alice.create_producer(topic("shared/news"))  # alice may only read it
    alice.create_producer(topic("inbox")).send(b"for bob")


def test_consuming_needs_read_access(clients: Clients) -> None:
    alice = clients(pulsar.AuthenticationToken(token("alice")))
    with pytest.raises(pulsar.AuthorizationError):
        alice.subscribe(topic("inbox"), "mine")  # alice may only write it
    with pytest.raises(pulsar.AuthorizationError):
        alice.create_reader(topic("inbox"), pulsar.MessageId.earliest)
    alice.subscribe(topic("shared/news"), "mine")


def test_a_topic_neither_readable_nor_writable_is_not_even_looked_up(clients: Clients) -> None:
    alice = clients(pulsar.AuthenticationToken(token("alice")))
    with pytest.raises(pulsar.AuthorizationError):
        alice.create_producer(topic("bob/private"))
    with pytest.raises(pulsar.AuthorizationError):
        alice.subscribe(topic("bob/private"), "peek")


def test_what_one_user_writes_the_other_reads(clients: Clients) -> None:
    bob = clients(pulsar.AuthenticationBasic("bob", "b2"))
    inbox = bob.subscribe(topic("inbox"), "bob")
    news = bob.create_producer(topic("shared/news"))
    alice = clients(pulsar.AuthenticationToken(token("alice")))
    reader = alice.subscribe(topic("shared/news"), "alice")
    alice.create_producer(topic("inbox")).send(b"hi bob")
    news.send(b"hi alice")
    assert inbox.receive(timeout_millis=TIMEOUT_MS).data() == b"hi bob"
    assert reader.receive(timeout_millis=TIMEOUT_MS).data() == b"hi alice"


def test_lookups_on_the_wire(secured: RunningNode) -> None:
    raw = accepted(connect_raw(pulsar_port(secured), **as_token("alice")))
    try:
        for request_id, name in enumerate(("inbox", "shared/news", "alice/x"), 1):
            answer = ask(raw, Lookup(topic=topic(name), request_id=request_id))
            assert isinstance(answer, LookupResponse) and answer.response is LookupType.Connect
        denied = ask(raw, Lookup(topic=topic("bob/x"), request_id=9))
        assert isinstance(denied, LookupResponse)
        assert (denied.request_id, denied.response, denied.error) == (
            9,
            LookupType.Failed,
            ServerError.AuthorizationError,
        )
        subscribe = Subscribe(
            topic=topic("inbox"),
            subscription="s",
            sub_type=SubType.Exclusive,
            consumer_id=1,
            request_id=10,
        )
        denied_subscribe = ask(raw, subscribe)
        assert isinstance(denied_subscribe, Error)
        assert (denied_subscribe.request_id, denied_subscribe.error) == (
            10,
            ServerError.AuthorizationError,
        )
    finally:
        raw.close()


def test_schemas_need_the_rights_on_their_topic(secured: RunningNode) -> None:
    raw = accepted(connect_raw(pulsar_port(secured), **as_token("alice")))
    schema = Schema(name="", schema_data=b"", type=SchemaType.STRING)
    try:
        # alice may only read shared/..., only write inbox: asking is reading or writing,
        # registering is writing.
        readable = ask(raw, GetSchema(topic=topic("shared/news"), request_id=1))
        assert isinstance(readable, GetSchemaResponse)
        assert readable.error_code is ServerError.TopicNotFound  # no schema yet, but allowed
        refused = ask(
            raw, GetOrCreateSchema(topic=topic("shared/news"), request_id=2, schema=schema)
        )
        assert isinstance(refused, GetOrCreateSchemaResponse)
        assert refused.error_code is ServerError.AuthorizationError
        taken = ask(raw, GetOrCreateSchema(topic=topic("inbox"), request_id=3, schema=schema))
        assert taken == GetOrCreateSchemaResponse(request_id=3, schema_version=bytes(8))
        denied = ask(raw, GetSchema(topic=topic("bob/x"), request_id=4))
        assert isinstance(denied, GetSchemaResponse)
        assert denied.error_code is ServerError.AuthorizationError
    finally:
        raw.close()


def test_topic_lists_show_what_the_client_may_use(secured: RunningNode, clients: Clients) -> None:
    proxy = clients(pulsar.AuthenticationToken(token("proxy")))
    names = ("alice/listed", "bob/listed", "shared/listed", "inbox")
    for name in names:
        proxy.subscribe(topic(name), "keep")  # a topic with a subscription is listed
    raw = accepted(connect_raw(pulsar_port(secured), **as_token("alice")))
    try:
        answer = ask(raw, GetTopicsOfNamespace(request_id=1, namespace="public/default"))
    finally:
        raw.close()
    assert isinstance(answer, GetTopicsOfNamespaceResponse)
    listed = {name for name in names if topic(name) in answer.topics}
    assert listed == {"alice/listed", "shared/listed", "inbox"}


def test_the_deployments_own_topics_are_for_proxies_only(
    secured: RunningNode, clients: Clients
) -> None:
    sessions = table_topic("public", "default", "sessions")
    # root may use every topic the ACL names, but not the node's tables.
    root = clients(pulsar.AuthenticationToken(token("root")))
    root.create_producer(topic("anything/at/all"))
    with pytest.raises(pulsar.AuthorizationError):
        root.create_producer(sessions)
    with pytest.raises(pulsar.AuthorizationError):
        root.create_reader(sessions, pulsar.MessageId.earliest)
    proxy = clients(pulsar.AuthenticationToken(token("proxy")))
    proxy.create_reader(sessions, pulsar.MessageId.earliest)
    for who, expected in (("proxy", True), ("root", False)):
        raw = accepted(connect_raw(pulsar_port(secured), **as_token(who)))
        try:
            answer = ask(raw, GetTopicsOfNamespace(request_id=1, namespace="public/__mop"))
        finally:
            raw.close()
        assert isinstance(answer, GetTopicsOfNamespaceResponse)
        assert (sessions in answer.topics) is expected, (who, answer.topics)


# -- TLS and client certificates ---------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TestCertificates:
    return make_test_certificates(tmp_path_factory.mktemp("certs"))


def tls_port(node: RunningNode) -> int:
    return node.node.address("pulsar", "tls")[1]


def tls_settings(certs: TestCertificates, *, mutual: bool) -> TlsSettings:
    return TlsSettings(
        certfile=str(certs.server_cert),
        keyfile=str(certs.server_key),
        cafile=str(certs.ca_cert) if mutual else None,
        require_client_cert=mutual,
    )


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_pulsar_over_tls(tmp_path: Path, certs: TestCertificates, host: str) -> None:
    settings = secured_settings(tmp_path, tls_port=0, tls=tls_settings(certs, mutual=False))
    with pulsar_node(settings) as node:
        client = client_for(
            f"pulsar+ssl://{host}:{tls_port(node)}",
            pulsar.AuthenticationToken(token("alice")),
            tls_trust_certs_file_path=str(certs.ca_cert),
            tls_validate_hostname=True,
        )
        try:
            round_trip(client, topic("alice/tls"))
        finally:
            client.close()


def test_lookups_over_tls_name_the_tls_listener(tmp_path: Path, certs: TestCertificates) -> None:
    settings = secured_settings(tmp_path, tls_port=0, tls=tls_settings(certs, mutual=False))
    with pulsar_node(settings) as node:
        context = certs.client_ssl_context(with_certificate=False)
        raw = RawPulsar(tls_port(node))
        raw.sock = context.wrap_socket(raw.sock, server_hostname="localhost")
        raw.send(Connect(client_version="raw-test", protocol_version=20, **as_token("alice")))
        try:
            assert isinstance(raw.recv(), Connected)
            answer = ask(raw, Lookup(topic=topic("alice/x"), request_id=1))
        finally:
            raw.close()
        plain = RawPulsar(pulsar_port(node))
        plain.send(Connect(client_version="raw-test", protocol_version=20, **as_token("alice")))
        try:
            assert isinstance(plain.recv(), Connected)
            plain_answer = ask(plain, Lookup(topic=topic("alice/x"), request_id=1))
        finally:
            plain.close()
    assert isinstance(answer, LookupResponse) and isinstance(plain_answer, LookupResponse)
    assert answer.broker_service_url_tls == f"pulsar+ssl://127.0.0.1:{tls_port(node)}"
    assert answer.broker_service_url == service_url(node)
    assert plain_answer.broker_service_url == service_url(node)
    assert plain_answer.broker_service_url_tls is None


def test_mutual_tls_names_the_user_by_its_certificate(
    tmp_path: Path, certs: TestCertificates
) -> None:
    settings = secured_settings(tmp_path, tls_port=0, tls=tls_settings(certs, mutual=True))
    with pulsar_node(settings) as node:
        url = f"pulsar+ssl://localhost:{tls_port(node)}"
        trust: dict[str, Any] = {
            "tls_trust_certs_file_path": str(certs.ca_cert),
            "tls_validate_hostname": True,
        }
        by_certificate = client_for(
            url,
            pulsar.AuthenticationTLS(str(certs.client_cert), str(certs.client_key)),
            **trust,
        )
        without = client_for(url, timeout=REFUSED_TIMEOUT, **trust)
        try:
            round_trip(by_certificate, topic("certified/data"))
            with pytest.raises(pulsar.AuthorizationError):
                by_certificate.create_producer(topic("alice/data"))
            # No certificate: the TLS handshake fails, and the client retries until it times out.
            with pytest.raises(pulsar.Timeout):
                without.create_producer(topic("certified/data"))
        finally:
            by_certificate.close()
            without.close()


# -- token refresh -----------------------------------------------------------------------------


@pytest.fixture
def refreshing(tmp_path: Path) -> Iterator[RunningNode]:
    with pulsar_node(secured_settings(tmp_path, auth_refresh_interval=0.5)) as node:
        yield node


class Supplier:
    """A token supplier for AuthenticationToken that counts its calls."""

    def __init__(self, make: Callable[[int], str]) -> None:
        self.make = make
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> str:
        with self._lock:
            self.calls += 1
            return self.make(self.calls)


def test_an_expiring_token_is_refreshed_on_the_same_connection(refreshing: RunningNode) -> None:
    supplier = Supplier(lambda _: token("alice", lifetime=2))
    client = client_for(service_url(refreshing), pulsar.AuthenticationToken(supplier))
    try:
        consumer = client.subscribe(topic("alice/refreshed"), "s")
        producer = client.create_producer(topic("alice/refreshed"))
        opened = connections(refreshing)
        deadline = time.monotonic() + 6  # three lifetimes: two refreshes at least
        sent = 0
        while time.monotonic() < deadline:
            producer.send(f"m{sent}".encode())
            sent += 1
            time.sleep(0.2)
        received = [consumer.receive(timeout_millis=TIMEOUT_MS).data() for _ in range(sent)]
    finally:
        client.close()
    assert received == [f"m{i}".encode() for i in range(sent)]
    assert supplier.calls >= 3  # the CONNECT's, then one per challenge
    assert connections(refreshing) == opened  # no reconnection


def test_a_connection_whose_token_cannot_be_refreshed_is_closed(refreshing: RunningNode) -> None:
    first = token("alice", lifetime=2)
    supplier = Supplier(lambda _: first)  # always the same token, which expires
    client = client_for(
        service_url(refreshing), pulsar.AuthenticationToken(supplier), timeout=REFUSED_TIMEOUT
    )
    try:
        producer = client.create_producer(topic("alice/stale"), send_timeout_millis=1500)
        producer.send(b"while valid")
        opened, refused_before = connections(refreshing), refusals(refreshing)
        calls = supplier.calls
        time.sleep(3.5)  # expired, challenged, answered with the expired token: closed
        with pytest.raises(pulsar.Timeout):
            producer.send(b"after expiry")
    finally:
        client.close()
    assert supplier.calls > calls  # it was challenged, and the reconnections asked too
    # The answer to the challenge was refused, and so was every reconnection.
    assert connections(refreshing) == opened
    assert refusals(refreshing) >= refused_before + 2


def test_a_refresh_may_not_change_the_principal(refreshing: RunningNode) -> None:
    raw = connect_raw(
        pulsar_port(refreshing),
        feature_flags=FeatureFlags(supports_auth_refresh=True),
        **as_token("alice", auth_data=token("alice", lifetime=1).encode()),
    )
    try:
        accepted(raw)
        challenge = raw.recv(timeout=5)
        assert isinstance(challenge, AuthChallenge)
        assert challenge.challenge == AuthData(
            auth_method_name="token", auth_data=b"PulsarAuthRefresh"
        )
        raw.send(
            AuthResponse(
                response=AuthData(auth_method_name="token", auth_data=token("bob").encode())
            )
        )
        assert raw.recv_until_closed() == []  # closed, as Pulsar brokers do, without an answer
    finally:
        raw.close()


# -- hostile credentials -----------------------------------------------------------------------


def _alg_none(sub: str) -> bytes:
    header = jwt.utils.base64url_encode(b'{"alg":"none","typ":"JWT"}')
    body = jwt.utils.base64url_encode(f'{{"sub":"{sub}","exp":{int(time.time()) + 300}}}'.encode())
    return header + b"." + body + b"."


def hostile_connects(rng: random.Random) -> Iterator[dict[str, Any]]:
    yield {"auth_method_name": "token", "auth_data": b"x" * 60_000}
    yield {"auth_method_name": "token", "auth_data": _alg_none("alice")}
    yield {"auth_method_name": "token", "auth_data": b"\xff\xfe\xfd"}
    yield {"auth_method_name": "token", "auth_data": b"a.b.c"}
    yield {"auth_method_name": "token", "auth_data": b"." * 2}
    yield {"auth_method_name": "basic", "auth_data": b"\xff\xfe:\x00\x01"}
    yield {"auth_method_name": "basic", "auth_data": b"alice:" + b"\xff" * 50_000}
    yield {"auth_method_name": "basic", "auth_data": b":"}
    yield {"auth_method_name": "basic", "auth_data": b"x" * 40_000 + b":pw"}
    yield {"auth_method_name": "x" * 30_000, "auth_data": b"x"}
    yield {"auth_method_name": "", "auth_data": b"x"}
    yield {"auth_method_name": "token", "auth_data": token("alice").encode() + b"x"}
    yield {**as_token("alice"), "original_principal": "bob" * 10_000}
    for _ in range(40):
        method = rng.choice(["token", "basic", "none", "tls", "", "sasl"])
        size = rng.choice([0, 1, 3, 100, 5000])
        data = rng.randbytes(size)
        if rng.random() < 0.3:
            data = b".".join(rng.randbytes(rng.randint(0, 40)) for _ in range(3))
        yield {"auth_method_name": method, "auth_data": data}


def test_hostile_credentials_never_hurt_the_node(secured: RunningNode, clients: Clients) -> None:
    client = clients(pulsar.AuthenticationToken(token("alice")))
    name = topic("alice/survivor")
    consumer = client.subscribe(name, "s")
    producer = client.create_producer(name)
    for index, fields in enumerate(hostile_connects(random.Random(20261127))):
        raw = connect_raw(pulsar_port(secured), **fields)
        try:
            frames = raw.recv_until_closed()
        finally:
            raw.close()
        assert len(frames) <= 1, fields
        if frames:
            answer = frames[0]
            assert isinstance(answer, Error), (fields, answer)
            assert answer.error in (ServerError.AuthenticationError, ServerError.NotAllowedError)
        producer.send(f"{index}".encode())
        assert consumer.receive(timeout_millis=TIMEOUT_MS).data() == f"{index}".encode()
    # And the node takes new clients as before.
    round_trip(clients(pulsar.AuthenticationBasic("alice", "a1")), topic("alice/after"))


def test_an_anonymous_node_keeps_serving_anonymous_clients() -> None:
    with pulsar_node() as node:
        raw = connect_raw(pulsar_port(node), auth_method_name="none")
        try:
            assert isinstance(raw.recv(), Connected)
            assert isinstance(
                ask(raw, Producer(topic=topic("open"), producer_id=1, request_id=1)),
                ProducerSuccess,
            )
        finally:
            raw.close()
        # Credentials that cannot be checked are not taken for none.
        refused(connect_raw(pulsar_port(node), auth_method_name="sasl", auth_data=b"x"))
