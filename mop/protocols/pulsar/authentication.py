"""Pulsar authentication, the protocol's part: the credentials a CONNECT or an AUTH_RESPONSE
carries, whose rights a proxy's connection acts with, which refreshed credentials a connection
may go on with, and who may use the deployment's own topics. Who the credentials prove, and
what the ACL allows, is the processor's decision.
"""

from __future__ import annotations

from typing import Final

from mop.security.identity import (
    AuthenticationError,
    AuthFailure,
    CertificateIdentity,
    Credentials,
    Principal,
)

# pulsar-client's method names: AuthenticationToken (OAuth2 too: it sends its access token),
# AuthenticationBasic, AuthenticationTLS (the certificate is the TLS layer's), and no
# authentication at all.
TOKEN: Final = "token"
BASIC: Final = "basic"
TLS: Final = "tls"
NONE: Final = "none"

_METHODS: Final = frozenset({None, NONE, TOKEN, BASIC, TLS})

# The method an AUTH_CHALLENGE names when a token expired (only tokens expire).
REFRESH_METHOD: Final = TOKEN
# The method a separated proxy's principal gets when it acts for one of its clients.
PROXIED: Final = "proxy"


def credentials_of(
    method: str | None,
    data: bytes | None,
    *,
    client_id: str,
    address: str,
    certificate: CertificateIdentity | None,
) -> Credentials:
    """The credentials of `method` and `data` (a CONNECT's `auth_method_name` and
    `auth_data`, or an AUTH_RESPONSE's), plus the client certificate the TLS listener
    verified. No data means no credentials beyond the certificate. Data that cannot be read
    and methods mop does not know are refused (AuthenticationError), never taken for none.
    """
    if method not in _METHODS:
        shown = str(method)[:80]
        raise AuthenticationError(
            AuthFailure.BAD_CREDENTIALS, f"authentication method {shown!r} is not supported"
        )
    base = Credentials(client_id=client_id, address=address, certificate=certificate)
    if method == TLS:
        if certificate is None:
            raise AuthenticationError(
                AuthFailure.BAD_CREDENTIALS, "method tls without a verified client certificate"
            )
        return base
    if not data:
        return base
    if method == TOKEN:
        try:
            token = data.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationError(
                AuthFailure.BAD_CREDENTIALS, "the token is not UTF-8 text"
            ) from None
        return Credentials(
            client_id=client_id, address=address, token=token, certificate=certificate
        )
    if method == BASIC:
        username, password = _basic(data)
        return Credentials(
            client_id=client_id,
            address=address,
            username=username,
            password=password,
            certificate=certificate,
        )
    raise AuthenticationError(
        AuthFailure.BAD_CREDENTIALS, "credentials without an authentication method"
    )


def _basic(data: bytes) -> tuple[str, bytes]:
    """AuthenticationBasic's `user:password` (the password may hold colons)."""
    user, colon, password = data.partition(b":")
    if not colon:
        raise AuthenticationError(AuthFailure.BAD_CREDENTIALS, "basic credentials without ':'")
    try:
        username = user.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationError(
            AuthFailure.BAD_CREDENTIALS, "the basic user name is not UTF-8"
        ) from None
    return username, password


def acting_principal(authenticated: Principal, original_principal: str | None) -> Principal:
    """Whose rights a connection acts with: a proxy role that names the client it speaks for
    (CONNECT's `original_principal`) acts with that client's rights, and with its own
    credential's expiry; a proxy role alone acts with its own (full) rights. Nobody else may
    speak for another principal: AuthenticationError."""
    if original_principal is None:
        return authenticated
    if not authenticated.is_proxy:
        raise AuthenticationError(
            AuthFailure.NOT_AUTHORIZED,
            f"{authenticated.display!r:.80} is no proxy role and cannot connect on behalf of"
            f" {original_principal!r:.80}",
        )
    return Principal(original_principal or None, PROXIED, expires_at=authenticated.expires_at)


def may_use_system_topics(principal: Principal, *, restricted: bool) -> bool:
    """Whether a connection may touch the deployment's own topics (its tables: sessions,
    retained messages, bans): a proxy role or the node itself, which read and write them for
    everyone, or an anonymous client where no ACL restricts it (all a deployment without
    credentials has; `restricted` says whether rules apply to this client). A named user
    never does, whatever its ACL says."""
    if principal.is_proxy or principal.superuser:
        return True
    return principal.name is None and not restricted


def keeps_identity(current: Principal, refreshed: Principal) -> bool:
    """Whether refreshed credentials may replace a connection's current ones: they must prove
    the same principal (a refresh renews a credential; it does not change who is connected)."""
    return refreshed.name == current.name


__all__ = [
    "BASIC",
    "NONE",
    "PROXIED",
    "REFRESH_METHOD",
    "TLS",
    "TOKEN",
    "acting_principal",
    "credentials_of",
    "keeps_identity",
    "may_use_system_topics",
]
