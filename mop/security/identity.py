"""Who a client is: the credentials it presents and the principal they prove.

Pure data shared by the authentication providers, the ACLs and every protocol adapter.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mop.security.acl import ClaimAcl


@dataclass(frozen=True, slots=True)
class CertificateIdentity:
    """What a verified TLS client certificate says about its holder."""

    common_name: str | None
    # Subject alternative names: DNS names, e-mail addresses and URIs, as text.
    alt_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client presents when it connects, whatever its protocol.

    MQTT: `username` and `password` from CONNECT (a JWT travels as the password). Pulsar:
    `token` (`AuthenticationToken`) or `username`/`password` (`AuthenticationBasic`).
    `certificate` is set when the client showed a certificate the TLS listener verified.
    """

    client_id: str = ""
    # The client's address without the port (bans and failure limits are per address).
    address: str = ""
    username: str | None = None
    password: bytes | None = None
    token: str | None = None
    certificate: CertificateIdentity | None = None

    def __repr__(self) -> str:  # never let a secret reach a log line
        return (
            f"Credentials(client_id={self.client_id!r}, address={self.address!r}, "
            f"username={self.username!r}, password={'***' if self.password else None}, "
            f"token={'***' if self.token else None}, certificate={self.certificate!r})"
        )


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated identity: the user (or Pulsar role) the rules name, and how it was
    proven. `name` is None for an anonymous client."""

    name: str | None
    # "password_file", "jwt", "certificate", "anonymous", "proxy" or "internal".
    method: str
    # ACL rules carried by the credential itself (a JWT claim), checked before the ACL file.
    claim_acl: ClaimAcl | None = None
    # When the credential stops being valid (epoch seconds; a JWT's `exp`), if ever.
    expires_at: float | None = None
    # A proxy of this deployment, whose requests the brokers take on its clients' behalf.
    is_proxy: bool = False
    # A principal no rule restricts (the node's own tasks).
    superuser: bool = field(default=False)

    @property
    def display(self) -> str:
        return self.name if self.name is not None else "<anonymous>"


ANONYMOUS = Principal(None, "anonymous")
INTERNAL = Principal("$internal", "internal", superuser=True)


class AuthFailure(enum.Enum):
    """Why a client is refused at connect; each adapter answers it in its own protocol."""

    # Nothing proves who the client is and anonymous clients are not allowed.
    NOT_AUTHORIZED = "not_authorized"
    # Credentials were presented and are wrong (unknown user, wrong password, bad token).
    BAD_CREDENTIALS = "bad_credentials"
    # The client id, user or address is banned, or it failed too often lately.
    BANNED = "banned"
    # The credential was valid once and has expired.
    EXPIRED = "expired"


class AuthenticationError(Exception):
    """The client cannot connect: `failure` says which answer it gets, the message why (for
    the log, never for the client: it may say which part of the credentials was wrong)."""

    def __init__(self, failure: AuthFailure, why: str) -> None:
        super().__init__(why)
        self.failure = failure
        self.why = why


def certificate_identity(certificate: Mapping[str, Any] | None) -> CertificateIdentity | None:
    """A verified peer certificate, in `ssl.getpeercert()` form, as a CertificateIdentity."""
    if not certificate:
        return None
    common_name = None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                common_name = str(value)
    alt_names = tuple(str(value) for _kind, value in certificate.get("subjectAltName", ()))
    return CertificateIdentity(common_name, alt_names)
