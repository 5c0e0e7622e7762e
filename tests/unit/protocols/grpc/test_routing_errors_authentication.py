"""Partition routing, backend errors as status codes, and the credentials of a call."""

from __future__ import annotations

import base64
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mop.messaging import BackendError, ProducerBusy, ProducerFenced, QuotaExceeded
from mop.protocols.grpc.authentication import call_credentials, certificate_of
from mop.protocols.grpc.errors import refused_status, status_of
from mop.protocols.grpc.routing import PartitionRouter, java_string_hash
from mop.protocols.grpc.status import StatusCode
from mop.security.identity import AuthenticationError, AuthFailure, CertificateIdentity


def test_java_string_hash_is_javas() -> None:
    # Values of "...".hashCode() in Java.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2147483648
    # Over UTF-16 code units: a surrogate pair counts as two.
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00


def test_keys_keep_their_partition_and_others_take_turns() -> None:
    router = PartitionRouter(4)
    assert {router.partition("k") for _ in range(10)} == {router.partition("k")}
    assert [router.partition(None) for _ in range(6)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError):
        PartitionRouter(0)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ProducerBusy("busy"), StatusCode.ALREADY_EXISTS),
        (ProducerFenced("fenced"), StatusCode.ABORTED),
        (QuotaExceeded("full"), StatusCode.RESOURCE_EXHAUSTED),
        (BackendError("q", reason="backlog_quota_exceeded"), StatusCode.RESOURCE_EXHAUSTED),
        (BackendError("big", reason="too_large"), StatusCode.RESOURCE_EXHAUSTED),
        (BackendError("c", reason="consumer_busy"), StatusCode.FAILED_PRECONDITION),
        (BackendError("s", reason="incompatible_schema"), StatusCode.FAILED_PRECONDITION),
        (BackendError("gone", reason="closed"), StatusCode.UNAVAILABLE),
        (BackendError("down", reason="unavailable"), StatusCode.UNAVAILABLE),
        (BackendError("none", reason="not_found"), StatusCode.NOT_FOUND),
        (BackendError("?", reason="something new"), StatusCode.UNKNOWN),
    ],
)
def test_backend_errors_answer_with_a_status(error: BackendError, code: StatusCode) -> None:
    assert status_of(error) is code


def test_refused_clients_are_unauthenticated_and_banned_ones_denied() -> None:
    bad = refused_status(AuthenticationError(AuthFailure.BAD_CREDENTIALS, "wrong password"))
    assert bad.code is StatusCode.UNAUTHENTICATED and "password" not in bad.message
    banned = refused_status(AuthenticationError(AuthFailure.BANNED, "x"))
    assert banned.code is StatusCode.PERMISSION_DENIED


def credentials(value: str | None) -> object:
    return call_credentials(value, client_id="c", address="10.0.0.1", certificate=None)


def test_bearer_and_basic_values_become_credentials() -> None:
    token = credentials("Bearer abc.def")
    assert (token.token, token.username) == ("abc.def", None)  # type: ignore[attr-defined]
    basic = credentials("Basic " + base64.b64encode(b"bob:pa:ss").decode())
    assert (basic.username, basic.password) == ("bob", b"pa:ss")  # type: ignore[attr-defined]
    assert credentials(None).token is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["Bearer", "Basic %%%", "Basic " + "Ym9i", "Negotiate x", ""])
def test_unreadable_authorization_is_refused(value: str) -> None:
    with pytest.raises(AuthenticationError) as caught:
        credentials(value)
    assert caught.value.failure is AuthFailure.BAD_CREDENTIALS


def test_a_client_certificate_gives_its_common_name_and_alt_names() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "device-1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("d1.example")]), False)
        .sign(key, hashes.SHA256())
    )
    der = certificate.public_bytes(serialization.Encoding.DER)
    assert certificate_of(der) == CertificateIdentity("device-1", ("d1.example",))
    assert certificate_of(None) is None
