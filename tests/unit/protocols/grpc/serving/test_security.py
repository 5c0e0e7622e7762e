"""A call authenticates with its authorization metadata (Bearer or Basic) through the
processor, and the ACL decides per topic: UNAUTHENTICATED and PERMISSION_DENIED otherwise."""

from __future__ import annotations

import base64
import contextlib
import datetime
import time
from typing import Any

import jwt
import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mop.processor import MessagingProcessor
from mop.protocols.grpc.proto import mop_grpc_pb2 as pb
from mop.protocols.grpc.serving.calls import MethodHandler
from mop.protocols.grpc.serving.pulsar_service import CONSUME, SEND
from mop.protocols.grpc.status import StatusCode
from mop.security.acl import AclRules
from mop.security.authentication import Authenticator
from mop.security.authorization import Authorizer
from mop.security.gatekeeper import Gatekeeper
from mop.security.passwords import PasswordFile, update_password_file
from mop.security.policy import SecurityPolicy
from mop.security.tokens import TokenVerifier, load_key_material
from mop.settings import JwtSettings
from tests.unit.protocols.grpc.serving.conftest import FakeCall

SECRET = "0123456789abcdef0123456789abcdef"
JWT = JwtSettings(secret=SECRET)
ACL = "user alice\ntopic readwrite open/#\ntopic read readonly\n"


@pytest.fixture
def processor_options() -> dict[str, Any]:
    passwords = PasswordFile.parse(update_password_file("", "alice", b"wonderland"))
    authenticator = Authenticator(
        allow_anonymous=False,
        order=("password_file", "jwt", "certificate"),
        passwords=passwords,
        tokens=TokenVerifier(JWT, keys=load_key_material(JWT)),
        certificates="cn",
    )
    policy = SecurityPolicy(authenticator, Authorizer(AclRules.parse(ACL)))
    return {"gatekeeper": Gatekeeper(policy)}


def token(sub: str = "alice") -> str:
    return jwt.encode({"sub": sub, "exp": time.time() + 60}, SECRET, algorithm="HS256")


def with_token(authorization: str) -> str:
    """`authorization` with "{token}" replaced by a fresh token: a parameter is made when the
    tests are collected, which may be longer before the test runs than a token lives."""
    return authorization.replace("{token}", token())


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def send(methods: dict[str, MethodHandler], topic: str, **metadata: str) -> FakeCall:
    call = FakeCall(SEND, {"pulsar-topic": topic, **metadata})
    call.request(pb.Send(payload=b"x"))
    call.half_close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[SEND])
        with trio.move_on_after(2), contextlib.suppress(trio.EndOfChannel):
            await call.responses.receive()
    return call


@pytest.mark.parametrize(
    "authorization", ["Bearer {token}", basic("alice", "wonderland"), "bearer  {token}"]
)
async def test_a_bearer_token_or_basic_credentials_authenticate(
    methods: dict[str, MethodHandler], authorization: str
) -> None:
    call = await send(methods, "open%2Fa", authorization=with_token(authorization))
    assert call.status is StatusCode.OK


@pytest.mark.parametrize(
    "authorization",
    [None, basic("alice", "wrong"), "Bearer not-a-jwt", "Digest abc", "Basic !!!", "Bearer"],
)
async def test_missing_or_wrong_credentials_are_unauthenticated(
    processor: MessagingProcessor, methods: dict[str, MethodHandler], authorization: str | None
) -> None:
    metadata = {} if authorization is None else {"authorization": authorization}
    call = await send(methods, "open%2Fa", **metadata)
    assert call.status is StatusCode.UNAUTHENTICATED
    assert "wonderland" not in call.message and "Digest" not in call.message
    stats = processor.stats.protocol("grpc")
    assert sum(stats.refused.values()) == 1 and stats.opened == 0


async def test_the_acl_refuses_topics_it_does_not_allow(
    methods: dict[str, MethodHandler],
) -> None:
    auth = {"authorization": f"Bearer {token()}"}
    assert (await send(methods, "closed", **auth)).status is StatusCode.PERMISSION_DENIED
    # "readonly" may be read, not written.
    denied = await send(methods, "readonly", **auth)
    assert denied.status is StatusCode.PERMISSION_DENIED
    assert "alice" in denied.message and "write" in denied.message
    call = FakeCall(
        CONSUME, {"pulsar-topic": "readonly", "pulsar-subscription": "s", **auth}, window=0
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[CONSUME])
        await trio.sleep(0.05)
        assert call.status is None  # consuming
        call.half_close()
    assert call.status is StatusCode.OK
    refused = FakeCall(CONSUME, {"pulsar-topic": "closed", "pulsar-subscription": "s", **auth})
    await refused.run(methods[CONSUME])
    assert refused.status is StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("topic", "authorization", "status"),
    [
        ("open%2Fa", None, StatusCode.UNAUTHENTICATED),
        ("closed", "Bearer {token}", StatusCode.PERMISSION_DENIED),
    ],
)
async def test_send_refuses_before_reading_the_message(
    methods: dict[str, MethodHandler], topic: str, authorization: str | None, status: StatusCode
) -> None:
    metadata = {} if authorization is None else {"authorization": with_token(authorization)}
    call = FakeCall(SEND, {"pulsar-topic": topic, **metadata})
    call.request(pb.Send(payload=b"x"))
    call.half_close()
    await call.run(methods[SEND])
    assert (call.status, call.received) == (status, 0)


async def test_the_deployments_own_topics_are_refused_to_users(
    methods: dict[str, MethodHandler],
) -> None:
    call = await send(
        methods,
        "persistent://public/__mop/sessions",
        authorization=f"Bearer {token()}",
    )
    assert call.status is StatusCode.INVALID_ARGUMENT
    assert "deployment's own" in call.message


async def test_a_call_ends_when_its_token_expires(
    processor: MessagingProcessor, methods: dict[str, MethodHandler]
) -> None:
    short = jwt.encode({"sub": "alice", "exp": int(time.time()) + 1}, SECRET, algorithm="HS256")
    metadata = {"pulsar-topic": "open%2Fa", "pulsar-subscription": "s"}
    call = FakeCall(CONSUME, {**metadata, "authorization": f"Bearer {short}"})
    with trio.fail_after(5):
        await call.run(methods[CONSUME])
    assert call.status is StatusCode.UNAUTHENTICATED and "expired" in call.message
    assert processor.stats.protocol("grpc").closed == {"not_authorized": 1}


def certificate(common_name: str) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    built = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return built.public_bytes(serialization.Encoding.DER)


async def test_a_client_certificate_authenticates_the_call(
    methods: dict[str, MethodHandler],
) -> None:
    """The certificate of an mTLS listener proves its common name, with no metadata."""
    call = FakeCall(SEND, {"pulsar-topic": "open%2Fa"}, peer_certificate=certificate("alice"))
    call.request(pb.Send(payload=b"x"))
    call.half_close()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call.run, methods[SEND])
        await call.response(pb.SendResult)
    assert call.status is StatusCode.OK
    stranger = FakeCall(SEND, {"pulsar-topic": "open%2Fa"}, peer_certificate=certificate("eve"))
    stranger.request(pb.Send(payload=b"x"))
    stranger.half_close()
    await stranger.run(methods[SEND])
    assert stranger.status is StatusCode.PERMISSION_DENIED
