"""The credentials a gRPC call carries: the `authorization` metadata ("Bearer <token>" or
"Basic <base64(user:password)>") and the client certificate the TLS listener verified.
Who they prove is the processor's decision; the forms are read as the Pulsar adapter reads
AuthenticationToken and AuthenticationBasic data (`mop.protocols.pulsar.authentication`).
"""

from __future__ import annotations

import base64
import binascii

from cryptography import x509
from cryptography.x509.oid import NameOID

from mop.protocols.pulsar.authentication import BASIC, TOKEN, credentials_of
from mop.security.identity import (
    AuthenticationError,
    AuthFailure,
    CertificateIdentity,
    Credentials,
)


def call_credentials(
    authorization: str | None,
    *,
    client_id: str,
    address: str,
    certificate: CertificateIdentity | None,
) -> Credentials:
    """The credentials of an `authorization` value (None: none beyond the certificate).
    A scheme other than Bearer and Basic, or a value that cannot be read, is refused
    (AuthenticationError), never taken for no credentials."""
    if authorization is None:
        return credentials_of(
            None, None, client_id=client_id, address=address, certificate=certificate
        )
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    scheme = scheme.lower()
    if scheme == "bearer" and value:
        method, data = TOKEN, value.encode("utf-8")
    elif scheme == "basic" and value:
        method, data = BASIC, _base64(value)
    else:
        raise AuthenticationError(
            AuthFailure.BAD_CREDENTIALS,
            f"authorization scheme {scheme[:40]!r} is neither 'Bearer <token>' nor"
            " 'Basic <base64>'",
        )
    return credentials_of(
        method, data, client_id=client_id, address=address, certificate=certificate
    )


def certificate_of(der: bytes | None) -> CertificateIdentity | None:
    """What a verified client certificate (DER, as the server gives it) says of its holder:
    its subject's common name and its subject alternative names."""
    if not der:
        return None
    try:
        certificate = x509.load_der_x509_certificate(der)
    except ValueError:
        return None  # the TLS layer verified it; a form this parser refuses proves nothing
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    common_name = str(names[0].value) if names else None
    alt_names: tuple[str, ...] = ()
    try:
        extension = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        pass
    else:
        alt_names = tuple(str(name.value) for name in extension.value)
    return CertificateIdentity(common_name, alt_names)


def _base64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise AuthenticationError(
            AuthFailure.BAD_CREDENTIALS, "basic credentials are not base64"
        ) from None


__all__ = ["call_credentials", "certificate_of"]
