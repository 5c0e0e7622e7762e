"""TLS for listeners: server SSL contexts with safe defaults, and the peer certificate of a
connection in the shape ``ssl.SSLSocket.getpeercert()`` uses.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import trio

from mop.settings import TlsSettings

__all__ = [
    "listener_ssl_context",
    "peer_certificate_info",
    "server_ssl_context",
]


def server_ssl_context(
    *,
    certfile: str,
    keyfile: str,
    cafile: str | None = None,
    require_client_cert: bool = False,
) -> ssl.SSLContext:
    """Build a server-side context: TLS 1.2 or newer, no compression, no renegotiation.

    ``cafile`` is the CA bundle that client certificates are verified against. With a ``cafile``
    and ``require_client_cert=False`` a client certificate is optional (verified when present);
    with ``require_client_cert=True`` a client without a valid certificate fails the handshake.
    The system trust store is deliberately not loaded: it must not vouch for clients.
    """
    _require_file(certfile, "certfile")
    _require_file(keyfile, "keyfile")
    if cafile is not None:
        _require_file(cafile, "cafile")
    elif require_client_cert:
        raise ValueError("require_client_cert=True needs a cafile to verify client certificates")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_SINGLE_ECDH_USE
    try:
        context.load_cert_chain(certfile=certfile, keyfile=keyfile)
    except ssl.SSLError as exc:
        raise ssl.SSLError(
            f"cannot load the certificate {certfile!r} with the key {keyfile!r}: {exc}"
        ) from exc
    if cafile is not None:
        try:
            context.load_verify_locations(cafile=cafile)
        except ssl.SSLError as exc:
            raise ssl.SSLError(f"cannot load CA certificates from {cafile!r}: {exc}") from exc
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def listener_ssl_context(tls: TlsSettings) -> ssl.SSLContext | None:
    """The server context a protocol's `tls` settings describe, or None when they configure
    no TLS listener (no certificate and key)."""
    if tls.certfile is None or tls.keyfile is None:
        return None
    return server_ssl_context(
        certfile=tls.certfile,
        keyfile=tls.keyfile,
        cafile=tls.cafile,
        require_client_cert=tls.require_client_cert,
    )


def peer_certificate_info(stream: trio.SSLStream[Any]) -> dict[str, Any] | None:
    """The verified client certificate of a handshaken stream, or None when there is none.

    The dict is what ``getpeercert()`` returns: ``subject`` and ``issuer`` as tuples of
    relative distinguished names, ``subjectAltName``, ``serialNumber``, ``notBefore``,
    ``notAfter``. Unverified certificates (``CERT_NONE``) are reported as None because
    nothing about them can be trusted.
    """
    certificate: dict[str, Any] | None = stream.getpeercert()
    return certificate or None


def _require_file(path: str, setting: str) -> None:
    if not Path(path).is_file():
        raise FileNotFoundError(f"TLS {setting} {path!r} does not exist or is not a file")
