"""The authentication chain: which principal a client's credentials prove, or why none.

Pure: the password file, the token verifier and the settings are handed in already loaded
(`mop.security.policy` loads them); nothing here reads a file or the clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mop.security.acl import AclError, ClaimAcl
from mop.security.identity import (
    ANONYMOUS,
    AuthenticationError,
    AuthFailure,
    CertificateIdentity,
    Credentials,
    Principal,
)
from mop.security.passwords import PasswordFile
from mop.security.tokens import TokenRejected, TokenVerifier

# The longest user name and password looked at; longer ones are refused unread.
MAX_USERNAME = 1024
MAX_SECRET = 16 * 1024


@dataclass(frozen=True, slots=True)
class _Miss:
    """A provider did not prove who the client is; `failure` says how it answers if no other
    provider does (None: this provider had nothing to check)."""

    failure: AuthFailure | None
    why: str


_Provider = Callable[[Credentials, float], "Principal | _Miss"]


class Authenticator:
    """Providers tried in the configured order; the first that proves an identity wins.

    A client that presents nothing checkable connects as the anonymous user when anonymous
    clients are allowed. A client whose credentials no provider accepts is refused, even when
    anonymous clients are allowed: a wrong password is never taken for no password. Where no
    provider is configured at all, credentials cannot be checked, so the client is anonymous
    (its user name is not trusted for any rule).
    """

    def __init__(
        self,
        *,
        allow_anonymous: bool,
        order: Sequence[str],
        passwords: PasswordFile | None = None,
        tokens: TokenVerifier | None = None,
        acl_claim: str = "",
        certificates: str | None = None,
        proxy_roles: frozenset[str] = frozenset(),
    ) -> None:
        self.allow_anonymous = allow_anonymous
        self._acl_claim = acl_claim
        self._passwords = passwords
        self._tokens = tokens
        self._certificate_identity = certificates
        self._proxy_roles = proxy_roles
        available: dict[str, _Provider | None] = {
            "password_file": self._password if passwords is not None else None,
            "jwt": self._token if tokens is not None else None,
            "certificate": self._certificate if certificates is not None else None,
        }
        self._providers = [p for name in order if (p := available.get(name)) is not None]
        # Whether a user name, password or token can be checked at all (else it is ignored).
        self._checks_secrets = any(
            available[name] is not None for name in order if name in ("password_file", "jwt")
        )

    def authenticate(self, credentials: Credentials, now: float) -> Principal:
        """The principal `credentials` prove, or AuthenticationError."""
        if credentials.username is not None and len(credentials.username) > MAX_USERNAME:
            raise AuthenticationError(AuthFailure.BAD_CREDENTIALS, "user name too long")
        secret = credentials.token or credentials.password
        if secret is not None and len(secret) > MAX_SECRET:
            raise AuthenticationError(AuthFailure.BAD_CREDENTIALS, "password or token too long")
        presented = (
            credentials.username is not None
            or credentials.password is not None
            or credentials.token is not None
        )
        failure: _Miss | None = None
        for provider in self._providers:
            result = provider(credentials, now)
            if isinstance(result, Principal):
                return self._with_role(result)
            if result.failure is not None and (failure is None or _worse(result, failure)):
                failure = result
        if failure is not None:
            raise AuthenticationError(failure.failure or AuthFailure.BAD_CREDENTIALS, failure.why)
        if presented and self._checks_secrets:
            raise AuthenticationError(AuthFailure.BAD_CREDENTIALS, "credentials not accepted")
        if self.allow_anonymous:
            return ANONYMOUS
        raise AuthenticationError(
            AuthFailure.NOT_AUTHORIZED, "no credentials, and anonymous clients are not allowed"
        )

    def _with_role(self, principal: Principal) -> Principal:
        if principal.name is not None and principal.name in self._proxy_roles:
            return Principal(
                principal.name,
                principal.method,
                claim_acl=principal.claim_acl,
                expires_at=principal.expires_at,
                is_proxy=True,
            )
        return principal

    # -- providers -------------------------------------------------------------------------

    def _password(self, credentials: Credentials, now: float) -> Principal | _Miss:
        assert self._passwords is not None
        username, password = credentials.username, credentials.password
        if username is None or password is None:
            return _Miss(None, "no user name and password")
        # An unknown user costs `verify` the same hashing as a known one.
        if self._passwords.verify(username, password):
            return Principal(username, "password_file")
        # Not refused outright: the password may be a token for the next provider.
        if username not in self._passwords:
            return _Miss(AuthFailure.BAD_CREDENTIALS, f"unknown user {username!r:.80}")
        return _Miss(AuthFailure.BAD_CREDENTIALS, f"wrong password for {username!r:.80}")

    def _token(self, credentials: Credentials, now: float) -> Principal | _Miss:
        assert self._tokens is not None
        token = credentials.token
        if token is None and credentials.password is not None:
            try:
                token = credentials.password.decode("ascii")
            except UnicodeDecodeError:
                return _Miss(None, "the password is no token")
            if token.count(".") != 2:
                return _Miss(None, "the password is no token")
        if token is None:
            return _Miss(None, "no token")
        try:
            verified = self._tokens.verify(token, now=now)
        except TokenRejected as exc:
            failure = AuthFailure.EXPIRED if exc.expired else AuthFailure.BAD_CREDENTIALS
            return _Miss(failure, f"token rejected: {exc}")
        claim_acl = None
        if self._acl_claim and self._acl_claim in verified.claims:
            try:
                claim_acl = ClaimAcl.from_claim(verified.claims[self._acl_claim])
            except AclError as exc:
                return _Miss(AuthFailure.BAD_CREDENTIALS, f"token ACL claim: {exc}")
        return Principal(
            verified.subject, "jwt", claim_acl=claim_acl, expires_at=verified.expires_at
        )

    def _certificate(self, credentials: Credentials, now: float) -> Principal | _Miss:
        certificate = credentials.certificate
        if certificate is None:
            return _Miss(None, "no client certificate")
        name = certificate_user(certificate, self._certificate_identity or "cn")
        if not name:
            return _Miss(AuthFailure.BAD_CREDENTIALS, "the client certificate names no user")
        return Principal(name, "certificate")


def certificate_user(certificate: CertificateIdentity, source: str) -> str | None:
    """The user a verified client certificate names: its subject CN, or its first SAN."""
    if source == "san":
        return certificate.alt_names[0] if certificate.alt_names else None
    return certificate.common_name


def _worse(candidate: _Miss, current: _Miss) -> bool:
    """Which failure a refused client hears of: an expired credential (which a client can
    renew) over a wrong one, and a real check over a provider that had nothing to check."""
    if current.failure is None:
        return True
    return candidate.failure is AuthFailure.EXPIRED and current.failure is not AuthFailure.EXPIRED
