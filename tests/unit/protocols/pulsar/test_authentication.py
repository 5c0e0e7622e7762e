"""What a Pulsar CONNECT's credentials are, whose rights a proxy acts with, and which refreshed
credentials a connection may go on with (the protocol's part of authentication, pure)."""

from __future__ import annotations

import pytest

from mop.protocols.pulsar.authentication import (
    PROXIED,
    acting_principal,
    credentials_of,
    keeps_identity,
    may_use_system_topics,
)
from mop.security.identity import (
    ANONYMOUS,
    INTERNAL,
    AuthenticationError,
    AuthFailure,
    CertificateIdentity,
    Credentials,
    Principal,
)

CERT = CertificateIdentity("client-1", ("client-1.example",))


def creds(
    method: str | None, data: bytes | None, cert: CertificateIdentity | None = None
) -> Credentials:
    return credentials_of(method, data, client_id="pulsar/1", address="10.0.0.1", certificate=cert)


def test_token() -> None:
    assert creds("token", b"a.b.c") == Credentials(
        client_id="pulsar/1", address="10.0.0.1", token="a.b.c"
    )


def test_basic_splits_at_the_first_colon() -> None:
    got = creds("basic", "zoë:pa:ss:".encode())
    assert (got.username, got.password, got.token) == ("zoë", b"pa:ss:", None)
    assert creds("basic", b":").username == ""


@pytest.mark.parametrize("method", [None, "none", "token", "basic"])
@pytest.mark.parametrize("data", [None, b""])
def test_no_data_is_no_credentials(method: str | None, data: bytes | None) -> None:
    assert creds(method, data) == Credentials(client_id="pulsar/1", address="10.0.0.1")
    assert creds(method, data, CERT).certificate == CERT


def test_the_certificate_goes_along_with_any_method() -> None:
    assert creds("token", b"t", CERT) == Credentials(
        client_id="pulsar/1", address="10.0.0.1", token="t", certificate=CERT
    )
    assert creds("tls", None, CERT) == Credentials(
        client_id="pulsar/1", address="10.0.0.1", certificate=CERT
    )
    # AuthenticationTLS's refresh answers with data it does not need.
    assert creds("tls", b"tls", CERT).certificate == CERT


@pytest.mark.parametrize(
    ("method", "data", "why"),
    [
        ("tls", None, "without a verified client certificate"),
        ("basic", b"no-colon", "without ':'"),
        ("basic", b"\xff\xfe:pw", "not UTF-8"),
        ("token", b"\xff.\xfe.\xfd", "not UTF-8 text"),
        ("sasl", b"x", "method 'sasl' is not supported"),
        ("athenz", None, "method 'athenz' is not supported"),
        (None, b"x", "without an authentication method"),
        ("none", b"x", "without an authentication method"),
        ("x" * 500, b"x", "method 'xxxxx"),
    ],
)
def test_what_cannot_be_read_is_refused(method: str | None, data: bytes | None, why: str) -> None:
    with pytest.raises(AuthenticationError, match=why) as info:
        creds(method, data)
    assert info.value.failure is AuthFailure.BAD_CREDENTIALS
    assert len(info.value.why) < 200


def test_unknown_methods_are_refused_even_without_data() -> None:
    with pytest.raises(AuthenticationError):
        creds("oauth", None)


ALICE = Principal("alice", "jwt", expires_at=100.0)
PROXY = Principal("proxy", "jwt", expires_at=200.0, is_proxy=True)


def test_a_client_acts_as_itself() -> None:
    assert acting_principal(ALICE, None) is ALICE


def test_a_proxy_acts_for_the_client_it_names_until_its_own_credential_expires() -> None:
    acting = acting_principal(PROXY, "alice")
    assert acting == Principal("alice", PROXIED, expires_at=200.0)
    assert not acting.is_proxy and not acting.superuser
    # An anonymous client of the proxy is anonymous here too.
    assert acting_principal(PROXY, "").name is None


def test_a_proxy_alone_acts_with_its_own_rights() -> None:
    assert acting_principal(PROXY, None) is PROXY


def test_only_a_proxy_may_speak_for_another() -> None:
    with pytest.raises(AuthenticationError, match="no proxy role") as info:
        acting_principal(ALICE, "bob")
    assert info.value.failure is AuthFailure.NOT_AUTHORIZED
    with pytest.raises(AuthenticationError):
        acting_principal(Principal(None, "anonymous"), "bob")


def test_a_refresh_keeps_the_principal() -> None:
    assert keeps_identity(ALICE, Principal("alice", "jwt", expires_at=300.0))
    assert not keeps_identity(ALICE, Principal("bob", "jwt"))
    assert not keeps_identity(ALICE, Principal(None, "anonymous"))


def test_only_proxies_the_node_and_open_deployments_use_system_topics() -> None:
    for restricted in (False, True):
        assert may_use_system_topics(PROXY, restricted=restricted)
        assert may_use_system_topics(INTERNAL, restricted=restricted)
        assert not may_use_system_topics(ALICE, restricted=restricted)
        assert not may_use_system_topics(acting_principal(PROXY, "alice"), restricted=restricted)
    # Anonymous: what a deployment without credentials has, unless an ACL applies to it.
    assert may_use_system_topics(ANONYMOUS, restricted=False)
    assert not may_use_system_topics(ANONYMOUS, restricted=True)
